"""Embed texts through eeane with the official openai-python client.

    python examples/openai_client.py [--base-url http://127.0.0.1:7997/v1] "first text" "second text"

Prints one JSON line: {"vectors": [...]}. openai-python asks for base64
embeddings by default and decodes them itself; --float asks for float arrays.
Set OPENAI_API_KEY to eeane's api_key when it has one.
"""
import argparse
import json
import os

from openai import OpenAI


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--base-url", default="http://127.0.0.1:7997/v1")
    parser.add_argument("--model", default="all-minilm-l6-v2")
    parser.add_argument("--float", action="store_true", help="request encoding_format=float")
    parser.add_argument("texts", nargs="+")
    args = parser.parse_args()
    client = OpenAI(base_url=args.base_url, api_key=os.environ.get("OPENAI_API_KEY", "unused"))
    extra = {"encoding_format": "float"} if args.float else {}
    response = client.embeddings.create(model=args.model, input=args.texts, **extra)
    print(json.dumps({"vectors": [d.embedding for d in response.data], "prompt_tokens": response.usage.prompt_tokens}))


if __name__ == "__main__":
    main()
