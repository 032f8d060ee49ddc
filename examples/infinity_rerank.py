"""Rerank through eeane with Infinity's own client (PyPI: infinity-client).

    python examples/infinity_rerank.py [--base-url http://127.0.0.1:7997] "query" "doc one" "doc two" ...

Prints one JSON line: {"results": [{"index", "relevance_score", "document"}, ...]},
best first, as eeane (and Infinity) answer POST /rerank.
Set EEANE_API_KEY to eeane's api_key when it has one.
"""
import argparse
import json
import os

from infinity_client import AuthenticatedClient, Client
from infinity_client.api.default import rerank
from infinity_client.models import RerankInput


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--base-url", default="http://127.0.0.1:7997")
    parser.add_argument("--model", default=None, help="a reranker's id (default: eeane's default reranker)")
    parser.add_argument("--top-n", type=int, default=None)
    parser.add_argument("query")
    parser.add_argument("documents", nargs="+")
    args = parser.parse_args()
    key = os.environ.get("EEANE_API_KEY")
    client = AuthenticatedClient(base_url=args.base_url, token=key) if key else Client(base_url=args.base_url)
    body = {"query": args.query, "documents": args.documents, "return_documents": True}
    if args.model:
        body["model"] = args.model
    if args.top_n is not None:
        body["top_n"] = args.top_n
    with client as c:
        response = rerank.sync_detailed(client=c, body=RerankInput.from_dict(body))
    if response.status_code != 200:
        raise SystemExit(f"rerank answered {response.status_code}: {response.content.decode(errors='replace')}")
    parsed = json.loads(response.content)
    print(json.dumps({"results": [{k: r.get(k) for k in ("index", "relevance_score", "document")} for r in parsed["results"]]}))


if __name__ == "__main__":
    main()
