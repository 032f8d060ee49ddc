"""Replays the two requests Open WebUI makes with examples/open-webui.env:
a batch of document chunks to {RAG_OPENAI_API_BASE_URL}/embeddings (or, with
RAG_EMBEDDING_ENGINE=ollama, to {RAG_OLLAMA_BASE_URL}/api/embed with
truncate: true, as its Ollama engine does), and the external reranker's POST
to RAG_EXTERNAL_RERANKER_URL (model, query, documents, top_n = the number of
documents), each with its key as a bearer token, as Open WebUI's retrieval
code sends them (requests.post with a JSON body).

    python examples/open_webui_requests.py [--env examples/open-webui.env] "query" "chunk one" "chunk two" ...

Prints one JSON line: {"embeddings": [...], "scores": [...]} (scores in the
chunks' order). Values in the environment override the env file's.
"""
import argparse
import json
import os

import requests


def settings(path):
    values = {}
    with open(path) as f:
        for line in f:
            line = line.strip()
            if line and not line.startswith("#") and "=" in line:
                key, value = line.split("=", 1)
                values[key] = os.environ.get(key, value)
    return values


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--env", default=os.path.join(os.path.dirname(__file__), "open-webui.env"))
    parser.add_argument("query")
    parser.add_argument("chunks", nargs="+")
    args = parser.parse_args()
    s = settings(args.env)

    if s.get("RAG_EMBEDDING_ENGINE") == "ollama":
        headers = {"Content-Type": "application/json", "Authorization": f"Bearer {s['RAG_OLLAMA_API_KEY']}"}
        r = requests.post(f"{s['RAG_OLLAMA_BASE_URL']}/api/embed", headers=headers,
                          json={"input": args.chunks, "model": s["RAG_EMBEDDING_MODEL"], "truncate": True}, timeout=60)
        if r.status_code != 200:
            raise SystemExit(f"Ollama embed error ({r.status_code}): {r.json().get('error', r.text)}")
        embeddings = r.json()["embeddings"]
    else:
        headers = {"Content-Type": "application/json", "Authorization": f"Bearer {s['RAG_OPENAI_API_KEY']}"}
        r = requests.post(f"{s['RAG_OPENAI_API_BASE_URL']}/embeddings", headers=headers,
                          json={"input": args.chunks, "model": s["RAG_EMBEDDING_MODEL"]}, timeout=60)
        r.raise_for_status()
        embeddings = [d["embedding"] for d in sorted(r.json()["data"], key=lambda d: d["index"])]

    headers = {"Content-Type": "application/json", "Authorization": f"Bearer {s['RAG_EXTERNAL_RERANKER_API_KEY']}"}
    r = requests.post(s["RAG_EXTERNAL_RERANKER_URL"], headers=headers,
                      json={"model": s["RAG_RERANKING_MODEL"], "query": args.query, "documents": args.chunks,
                            "top_n": len(args.chunks)}, timeout=60)
    r.raise_for_status()
    scores = [0.0] * len(args.chunks)
    for result in r.json()["results"]:
        scores[result["index"]] = result["relevance_score"]
    print(json.dumps({"embeddings": embeddings, "scores": scores}))


if __name__ == "__main__":
    main()
