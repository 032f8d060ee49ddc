"""Writes tests/fixtures/spm_corpus.json, the tokenizer parity corpus: code in
several languages, prose in English and Portuguese, unicode from many scripts,
emoji, control characters, whitespace oddities, empty and 10,000-character
strings. Deterministic (seeded); rerun only to change the corpus.

    python3 tests/reference/make_spm_corpus.py
"""
import json
import random
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def main():
    rng = random.Random(5)
    calibration = json.loads((ROOT / "models/calibration.json").read_text())["texts"]
    fixtures = json.loads((ROOT / "tests/fixtures/texts.json").read_text())
    sources = [p.read_text() for p in sorted((ROOT / "src").rglob("*.rs"))[:12]]
    sources += [(ROOT / p).read_text() for p in ["models/prepare.py", "models/setup.sh", "examples/curl.sh"]]
    corpus = list(calibration) + list(fixtures)

    # Code: lines and multi-line chunks of real source files (Rust, Python, shell).
    lines = [l for s in sources for l in s.splitlines() if l.strip()]
    corpus += rng.sample(lines, 300)
    for _ in range(100):
        s = rng.choice(sources).splitlines()
        i = rng.randrange(len(s))
        corpus.append("\n".join(s[i:i + rng.randint(2, 12)]))

    # Prose: sentences recombined, in English and Portuguese.
    prose = [t for t in calibration if " " in t and not any(c in t for c in "(){};=")]
    words = " ".join(prose).split()
    for _ in range(200):
        corpus.append(" ".join(rng.choice(words) for _ in range(rng.randint(1, 30))))

    # Unicode: scripts, combining marks, compatibility forms NFKC rewrites, emoji.
    ranges = [(0x20, 0x7E), (0xA0, 0x17F), (0x370, 0x3FF), (0x400, 0x4FF), (0x590, 0x5FF), (0x600, 0x6FF),
              (0x900, 0x97F), (0x300, 0x36F), (0x3040, 0x30FF), (0x4E00, 0x4FFF), (0xAC00, 0xAD00),
              (0xFB00, 0xFB06), (0xFF01, 0xFF5E), (0x2460, 0x24FF), (0x1D400, 0x1D4FF), (0x2000, 0x206F),
              (0x1F300, 0x1F6FF), (0x1F900, 0x1F9FF)]
    for _ in range(200):
        n = rng.randint(1, 40)
        corpus.append("".join(chr(rng.randint(*rng.choice(ranges))) for _ in range(n)))
    emoji = ["👩‍💻", "👍🏽", "🇧🇷", "🇵🇹", "❤️", "🧑‍🤝‍🧑", "1️⃣", "🚀", "😀", "🐍", "🦀"]
    for _ in range(60):
        corpus.append(" ".join(rng.choice(emoji + words) for _ in range(rng.randint(1, 12))))

    # Control characters and whitespace.
    controls = [chr(c) for c in list(range(0, 32)) + [0x7F, 0x85, 0xA0, 0x200B, 0x200C, 0x200D, 0x200E, 0x2028, 0x2029, 0x3000, 0xFEFF]]
    for _ in range(80):
        parts = [rng.choice(words + controls + [" ", "  ", "\t", "\n", "\r\n"]) for _ in range(rng.randint(1, 20))]
        corpus.append("".join(parts))
    corpus += ["", " ", "   ", "\n", "\t\t", "\x00", "\u200b", "a", "ação", "ﬁ", "①②③", "ＡＢＣ", "x" * 50]

    # Long: 10,000 characters of code, of prose, of mixed unicode.
    code = "\n".join(sources)
    start = rng.randrange(len(code) - 10_000)
    corpus.append(code[start:start + 10_000])
    corpus.append((" ".join(words) * 40)[:10_000])
    corpus.append("".join(chr(rng.randint(*rng.choice(ranges))) for _ in range(10_000)))

    assert len(corpus) >= 1000, len(corpus)
    out = ROOT / "tests/fixtures/spm_corpus.json"
    out.write_text(json.dumps(corpus, ensure_ascii=False, indent=0) + "\n")
    print(f"{len(corpus)} strings -> {out}")


if __name__ == "__main__":
    main()
