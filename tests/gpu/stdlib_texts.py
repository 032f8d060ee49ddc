"""Texts for the CUDA run: paragraphs of Python's standard library (code,
docstrings and comments, as a coding tool indexes them), in a fixed order.
Writes a JSON array of N strings. Usage: stdlib_texts.py OUT.json [N]."""
import json
import sys
import sysconfig
from pathlib import Path

out, n = Path(sys.argv[1]), int(sys.argv[2]) if len(sys.argv) > 2 else 4000
texts = []
for path in sorted(Path(sysconfig.get_paths()["stdlib"]).glob("*.py")):
    for paragraph in path.read_text(errors="replace").split("\n\n"):
        paragraph = paragraph.strip("\n")
        if 300 <= len(paragraph) <= 3000:
            texts.append(paragraph)
        if len(texts) == n:
            break
    if len(texts) == n:
        break
out.write_text(json.dumps(texts))
print(f"{len(texts)} texts from {sysconfig.get_paths()['stdlib']}, mean {sum(map(len, texts)) / len(texts):.0f} characters")
