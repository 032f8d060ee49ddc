"""Independent reference for a Hugging Face tokenizer.json, in Python with the
`tokenizers` package on the same file eeane serves.

stdin {"tokenizer": PATH, "max_tokens": N, "texts": [...]}
  -> {"ids": [[...]], "type_ids": [[...]]}: each text with the file's special
     tokens, truncated to N tokens (special tokens kept), unpadded.
"""
import json
import sys

from tokenizers import Tokenizer

request = json.load(sys.stdin)
tokenizer = Tokenizer.from_file(request["tokenizer"])
tokenizer.no_padding()
tokenizer.enable_truncation(max_length=request["max_tokens"])
encodings = [tokenizer.encode(text) for text in request["texts"]]
json.dump({"ids": [e.ids for e in encodings], "type_ids": [e.type_ids for e in encodings]}, sys.stdout)
