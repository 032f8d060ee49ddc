"""Embed through eeane's TEI routes with TEI's own clients, unchanged:
huggingface_hub's InferenceClient (which posts {"inputs": ...} to its
base_url) and LangChain's HuggingFaceEndpointEmbeddings (the same client, given
the server's URL as its model).

    python examples/tei_clients.py [--url http://127.0.0.1:7997] "first text" "second text"

Prints one JSON line: {"inference_client": [...vectors], "langchain_documents":
[...vectors], "langchain_query": [...vector]}. Set HF_TOKEN to eeane's api_key
when it has one (both send it as a bearer token). LangChain replaces newlines
in documents with spaces before sending them.
"""
import argparse
import json
import os

from huggingface_hub import InferenceClient
from langchain_huggingface import HuggingFaceEndpointEmbeddings


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--url", default="http://127.0.0.1:7997")
    parser.add_argument("texts", nargs="+")
    args = parser.parse_args()
    token = os.environ.get("HF_TOKEN")
    client = InferenceClient(base_url=args.url, api_key=token)
    vectors = client.feature_extraction(args.texts).tolist()
    langchain = HuggingFaceEndpointEmbeddings(model=args.url, huggingfacehub_api_token=token)
    documents = langchain.embed_documents(args.texts)
    query = langchain.embed_query(args.texts[0])
    print(json.dumps({"inference_client": vectors, "langchain_documents": documents, "langchain_query": query}))


if __name__ == "__main__":
    main()
