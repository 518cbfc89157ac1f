#!/usr/bin/env python3
r"""Expected pre-tokenizer splits for tern's DeepSeek pre-tokenizers.

Runs each pattern list with Python's `regex` module the way Hugging Face's
`Sequence` of `Split(..., behavior="isolated")` pre-tokenizers and llama.cpp's
`unicode_regex_split` apply it: every regex splits every piece left by the
previous ones into its matches and the text between them, both kept. The
patterns are llama.cpp's lists for LLAMA_VOCAB_PRE_TYPE_DEEPSEEK_LLM
(`tokenizer.ggml.pre` = "deepseek-llm") and DEEPSEEK3_LLM ("deepseek-v3"),
as in `src/llama-vocab.cpp`.

Input: the 46 strings of llama.cpp's tokenizer test vectors (an `.inp` file:
each case followed by "\n__ggml_vocab_test__\n"). Output, one file per
pre-tokenizer: one line per case (empty for the empty string), its pieces
separated by single spaces, each piece escaped: `\\` for a backslash, `\s`
for a space, `\n`, `\r`, `\t`, and `\u{HEX}` for any other whitespace,
control or format character.

    pip install regex
    python3 tools/tokenizer/pretokenizer_splits.py   # from the repository root

rewrites testdata/tokenizer/deepseek-llm.splits and deepseek-v3.splits;
crates/tokenizer/tests/vectors.rs compares tern's splits with them.
"""

import argparse
import pathlib
import unicodedata

import regex

# DeepSeek LLM / V2 / V2-Lite. Six code points of the letter class are
# written as escapes: Unicode normalization (NFC) would replace them.
DEEPSEEK_LLM = [
    "[\r\n]",
    "\\s?[A-Za-zµÀ-ÖØ-öø-ƺƼ-ƿǄ-ʓʕ-ʯͰ-ͳͶͷͻ-ͽͿΆΈ-ΊΌΎ-ΡΣ-ϵϷ-ҁҊ-ԯԱ-ՖႠ-ჅᎠ-Ᏽᏸ-ᏽᲐ-ᲺᲽ-Ჿᴀ-ᴫᵫ-ᵷᵹ-ᶚḀ-ἕἘ-Ἕἠ-ὅὈ-Ὅὐ-ὗὙὛὝὟ-\u1f7dᾀ-ᾴᾶ-ᾼ\u1fbeῂ-ῄῆ-ῌῐ-\u1fd3ῖ-\u1fdbῠ-Ῥῲ-ῴῶ-ῼℂℇℊ-ℓℕℙ-ℝℤ\u2126ℨ\u212a-ℭℯ-ℴℹℼ-ℿⅅ-ⅉⅎↃↄⰀ-ⱻⱾ-ⳤⳫ-ⳮⳲⳳꙀ-ꙭꚀ-ꚛꜢ-ꝯꝱ-ꞇꞋ-ꞎꭰ-ꮿﬀ-ﬆﬓ-ﬗＡ-Ｚａ-ｚ𐐀-𐑏𐒰-𐓓𐓘-𐓻𐲀-𐲲𐳀-𐳲𑢠-𑣟𞤀-𞥃]+",
    "\\s?[!-/:-~！-／：-～‘-‟　-。]+",
    "\\s+$",
    "[一-龥ࠀ-一가-퟿]+",
    "\\p{N}+",
]

# DeepSeek-V3 / V3.1 / R1.
DEEPSEEK_V3 = [
    "\\p{N}{1,3}",
    "[一-龥぀-ゟ゠-ヿ]+",
    "[!\"#$%&'()*+,\\-./:;<=>?@\\[\\\\\\]^_`{|}~][A-Za-z]+|[^\r\n\\p{L}\\p{P}\\p{S}]?[\\p{L}\\p{M}]+| ?[\\p{P}\\p{S}]+[\r\n]*|\\s*[\r\n]+|\\s+(?!\\S)|\\s+",
]

SEPARATOR = "\n__ggml_vocab_test__\n"


def split(patterns, text):
    pieces = [text] if text else []
    for pattern in patterns:
        compiled = regex.compile(pattern)
        out = []
        for piece in pieces:
            done = 0
            for m in compiled.finditer(piece):
                assert m.end() > m.start(), "no pattern matches the empty string"
                if m.start() > done:
                    out.append(piece[done:m.start()])
                out.append(m.group())
                done = m.end()
            if done < len(piece):
                out.append(piece[done:])
        pieces = out
    assert "".join(pieces) == text
    return pieces


ESCAPES = {"\\": "\\\\", " ": "\\s", "\n": "\\n", "\r": "\\r", "\t": "\\t"}


def escape(piece):
    out = []
    for c in piece:
        if c in ESCAPES:
            out.append(ESCAPES[c])
        elif c.isspace() or unicodedata.category(c) in ("Cc", "Cf", "Zs", "Zl", "Zp"):
            out.append("\\u{%X}" % ord(c))
        else:
            out.append(c)
    return "".join(out)


def main():
    root = pathlib.Path(__file__).resolve().parents[2]
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--inp", type=pathlib.Path, default=root / "testdata/tokenizer/ggml-vocab-deepseek-llm.gguf.inp")
    ap.add_argument("--out-dir", type=pathlib.Path, default=root / "testdata/tokenizer")
    args = ap.parse_args()

    body = args.inp.read_text(encoding="utf-8")
    assert body.endswith(SEPARATOR)
    cases = body[: -len(SEPARATOR)].split(SEPARATOR)
    for name, patterns in [("deepseek-llm", DEEPSEEK_LLM), ("deepseek-v3", DEEPSEEK_V3)]:
        lines = [" ".join(escape(p) for p in split(patterns, text)) for text in cases]
        path = args.out_dir / f"{name}.splits"
        path.write_text("".join(line + "\n" for line in lines), encoding="utf-8")
        print(f"{path}: {len(lines)} cases (regex {regex.__version__})")


if __name__ == "__main__":
    main()
