"""Embed through eeane with LangChain's OpenAIEmbeddings.

    python examples/langchain_embeddings.py [--base-url http://127.0.0.1:7997/v1] "first text" "second text"

Prints one JSON line: {"documents": [...vectors], "query": [...vector]}.

check_embedding_ctx_length=False is required: with the default (True),
LangChain splits texts with tiktoken and sends OpenAI's token ids, which are
not this model's vocabulary. eeane answers that with a 400 that says to set
it (and here, offline, tiktoken cannot even fetch its vocabulary). The texts
are sent as text and eeane truncates each to the model's max_tokens.
Set OPENAI_API_KEY to eeane's api_key when it has one.
"""
import argparse
import json
import os

from langchain_openai import OpenAIEmbeddings


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--base-url", default="http://127.0.0.1:7997/v1")
    parser.add_argument("--model", default="all-minilm-l6-v2")
    parser.add_argument("texts", nargs="+")
    args = parser.parse_args()
    embeddings = OpenAIEmbeddings(
        model=args.model,
        base_url=args.base_url,
        api_key=os.environ.get("OPENAI_API_KEY", "unused"),
        check_embedding_ctx_length=False,
    )
    documents = embeddings.embed_documents(args.texts)
    query = embeddings.embed_query(args.texts[0])
    print(json.dumps({"documents": documents, "query": query}))


if __name__ == "__main__":
    main()
