"""Embed through eeane's Ollama routes with the official `ollama` client, unchanged.

    python examples/ollama_client.py [--host http://127.0.0.1:7997] [--model all-minilm-l6-v2:latest] "first text" "second text"

Prints one JSON line: {"embed": [...vectors] (ollama.embed), "embeddings":
[...vectors] (the older ollama.embeddings, one text a call), "models": [names]
(ollama.list)}. Set OLLAMA_API_KEY to eeane's api_key when it has one (sent
as a bearer token).
"""
import argparse
import json
import os

from ollama import Client


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--host", default="http://127.0.0.1:7997")
    parser.add_argument("--model", default="all-minilm-l6-v2:latest")
    parser.add_argument("texts", nargs="+")
    args = parser.parse_args()
    key = os.environ.get("OLLAMA_API_KEY")
    client = Client(host=args.host, headers={"Authorization": f"Bearer {key}"} if key else None)
    embed = client.embed(model=args.model, input=args.texts)
    older = [client.embeddings(model=args.model, prompt=text).embedding for text in args.texts]
    models = [m.model for m in client.list().models]
    print(json.dumps({"embed": [list(v) for v in embed.embeddings], "embeddings": [list(v) for v in older], "models": models,
                      "prompt_eval_count": embed.prompt_eval_count}))


if __name__ == "__main__":
    main()
