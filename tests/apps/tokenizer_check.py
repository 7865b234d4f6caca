#!/usr/bin/env python3
"""Compare weft-llm's tokenizer with Hugging Face `tokenizers` on a list of texts.

    python3 tests/apps/tokenizer_check.py BUILD/apps/weft-llm/weft-llm TOKENIZER.json [TEXTS.txt]

For each text (one per line of TEXTS.txt, with \\n and \\t escapes; a built-in
list without it) prints weft-llm's ids, then tokenizers' ids, and "ok" or
"DIFFER". Special tokens are added as the file's post-processor says, on both
sides. Exits 1 if any text differs. Needs `pip install tokenizers`.
"""
import subprocess
import sys

from tokenizers import Tokenizer

TEXTS = [
    "Hello world",
    "Hello, world!",
    "The quick brown fox jumps over the lazy dog.",
    "  leading spaces, trailing spaces   \n\nand\ttabs\r\n",
    "Emoji 😀👍🏽 and CJK 世界你好, こんにちは, 한국어; Ünïcödé naïve café.",
    "Numbers 3.14159 and 1234567890, it's we'll THEY'RE",
    "def f(x):\n    return x ** 2  # square\n",
    "<|begin_of_text|>special tokens<|end_of_text|> in the text",
    "   ",
    "a",
]


def weft_ids(binary, tokenizer, text):
    out = subprocess.run([binary, "tokenize", tokenizer, text], check=True,
                         capture_output=True, text=True).stdout.strip()
    return [int(x) for x in out.split(",")] if out else []


def main():
    if len(sys.argv) < 3:
        print(__doc__)
        return 2
    binary, path = sys.argv[1], sys.argv[2]
    texts = TEXTS
    if len(sys.argv) > 3:
        with open(sys.argv[3], encoding="utf-8") as f:
            texts = [l.rstrip("\n").encode().decode("unicode_escape").encode("latin-1").decode()
                     for l in f if l.strip()]
    tok = Tokenizer.from_file(path)
    bad = 0
    for text in texts:
        mine = weft_ids(binary, path, text)
        theirs = tok.encode(text, add_special_tokens=True).ids
        same = mine == theirs
        bad += not same
        print(repr(text))
        print("  weft-llm:  ", mine)
        print("  tokenizers:", theirs, "ok" if same else "DIFFER")
    print(f"{len(texts) - bad} of {len(texts)} agree")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
