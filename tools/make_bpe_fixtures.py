#!/usr/bin/env python3
"""Makes the byte-level BPE fixtures of tests/data/bpe with Hugging Face's `tokenizers` (PyPI).

Run from a venv that has it (Debian bookworm packages no python3-tokenizers):
    python3 -m venv /tmp/tok && /tmp/tok/bin/pip install tokenizers
    /tmp/tok/bin/python tools/make_bpe_fixtures.py [OUT_DIR]          # default tests/data/bpe
    /tmp/tok/bin/python tools/make_bpe_fixtures.py --check OUT_DIR    # compare, write nothing

What it writes (docs/data.md "Tokenizers" describes them):
  kjv_slice.txt, nonascii.txt, invalid.bin     the texts the tests tokenize
  gpt2/tokenizer.json                          a byte-level BPE trained here on the KJV (+ the
                                               non-ASCII sample), GPT-2's pre-tokenizer
  gpt2/vocab.json, gpt2/merges.txt             the same model as GPT-2's two files (save_model)
  llama3/tokenizer.json                        the same merges behind Llama 3's Split regex, with
                                               ignore_merges and a few whole words only reachable
                                               through it, Llama 3's special tokens
  qwen2/tokenizer.json                         Qwen2's Split regex and its NFC normalizer
  <variant>/<text>.ids                         HF's ids, encode(text, add_special_tokens=False),
                                               one per line; invalid.bin as Python's
                                               decode('utf-8', 'replace') of its bytes
The KJV is Debian's bible-kjv (`bible -f`), as tools/prepare_corpus.sh reads it.
"""
import json
import os
import subprocess
import sys

from tokenizers import Tokenizer
from tokenizers.implementations import ByteLevelBPETokenizer

GPT2 = r"""'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"""
LLAMA3 = (r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|"""
          r"""\s*[\r\n]+|\s+(?!\S)|\s+""")
QWEN2 = (r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|"""
         r"""\s*[\r\n]+|\s+(?!\S)|\s+""")

# Accents precomposed and combining (NFC changes the second), CJK, Hangul, emoji with skin tone
# and ZWJ, Arabic, Greek, Cyrillic, Devanagari, Thai, CRLF, tabs, NBSP, ideographic space, NEL,
# runs of digits (ASCII, full-width, superscript, Roman numeral), contractions in every case, the
# long s and the Kelvin sign (case folding), special tokens inside text, trailing spaces.
NONASCII = (
    "Café naïve Ångström — cafe\u0301 nai\u0308ve A\u030angstro\u0308m.\r\n"
    "日本語の文章です。中文句子，还有标点！한국어 문장입니다.\r\n"
    "Emoji: 👍🏽 👨‍👩‍👧 🇩🇪 ❤️ and ✨✨✨\n"
    "Ελληνικά, русский текст, العربية, हिन्दी भाषा, ภาษาไทย\n"
    "Numbers 1234567890 12 123 1234, full-width １２３４５, x² ⅻ 3.14159 1,000,000\n"
    "Contractions: don't DON'T I'm I'M we'll WE'LL she's SHE'S they're THEY'RE I've I'd ſ'ſ 'K\n"
    "Tabs\tand  two  spaces\u00a0nbsp\u3000ideographic\u0085nel x \u0085y x \u2028y   \n"
    "<|endoftext|>Special<|endoftext|> tokens <|im_start|>user<|im_end|><|begin_of_text|>x <|sep|> y\n"
    "   leading and trailing spaces   \n\n\n"
    "end"
)
# Bytes that are not UTF-8: a lone continuation byte, 0xff, a truncated sequence, an encoded
# surrogate, an overlong slash, a code point above U+10FFFF, and a sequence cut by the file's end.
INVALID = (b"valid start \x80 lone continuation \xff ff, caf\xc3 truncated, \xed\xa0\x80 surrogate, "
           b"\xc0\xaf overlong, \xf4\x90\x80\x80 too big, \xe6\x97\xa5\xe6\x9c\xac ok\n\xe6\x97")


def kjv_slice():
    text = subprocess.run(["bible", "-f", "Ge1:1-Ge3:24"], stdin=subprocess.DEVNULL, capture_output=True,
                          check=True).stdout
    return text


def train(kjv):
    tok = ByteLevelBPETokenizer()
    full = subprocess.run(["bible", "-f", "Gen1:1-Rev22:21"], stdin=subprocess.DEVNULL, capture_output=True,
                          check=True).stdout.decode()
    tok.train_from_iterator(full.splitlines(keepends=True) + [NONASCII] * 30, vocab_size=3000, min_frequency=2,
                            special_tokens=["<|endoftext|>"], show_progress=False)
    return tok


def split_pre_tokenizer(pattern):
    return {"type": "Sequence", "pretokenizers": [
        {"type": "Split", "pattern": {"Regex": pattern}, "behavior": "Isolated", "invert": False},
        {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": False}]}


def byte_level(text):
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    table = dict(zip(bs, cs))
    return "".join(chr(table[b]) for b in text.encode())


def added(content, id_, lstrip=False, rstrip=False):
    return {"id": id_, "content": content, "single_word": False, "lstrip": lstrip, "rstrip": rstrip,
            "normalized": False, "special": True}


def variants(tok):
    base = json.loads(tok._tokenizer.to_str())
    size = len(base["model"]["vocab"])
    out = {}
    gpt2 = json.loads(json.dumps(base))
    gpt2["added_tokens"].append(added("<|sep|>", size, lstrip=True, rstrip=True))
    out["gpt2"] = gpt2
    llama = json.loads(json.dumps(base))
    llama["pre_tokenizer"] = split_pre_tokenizer(LLAMA3)
    llama["model"]["ignore_merges"] = True
    vocab = llama["model"]["vocab"]
    # Whole words in the vocabulary that the merges alone do not make: only ignore_merges finds them.
    for word in [" begotten", " firmament", "日本語", " Nebuchadnezzar", "Ångström"]:
        key = byte_level(word)
        if key not in vocab:
            vocab[key] = len(vocab)
    llama["added_tokens"] = [added("<|begin_of_text|>", len(vocab)), added("<|end_of_text|>", len(vocab) + 1)]
    out["llama3"] = llama
    qwen = json.loads(json.dumps(base))
    qwen["pre_tokenizer"] = split_pre_tokenizer(QWEN2)
    qwen["normalizer"] = {"type": "NFC"}
    qwen["added_tokens"] += [added("<|im_start|>", size), added("<|im_end|>", size + 1)]
    out["qwen2"] = qwen
    return out


def texts(out_dir):
    return {name: open(os.path.join(out_dir, name), "rb").read()
            for name in ("kjv_slice.txt", "nonascii.txt", "invalid.bin")}


def encode_all(tokenizer, samples):
    return {name: tokenizer.encode(data.decode("utf-8", "replace"), add_special_tokens=False).ids
            for name, data in samples.items()}


def main():
    args = sys.argv[1:]
    check = bool(args) and args[0] == "--check"
    if check:
        args = args[1:]
    out_dir = args[0] if args else os.path.join(os.path.dirname(__file__), "..", "tests", "data", "bpe")
    if not check:
        os.makedirs(out_dir, exist_ok=True)
        open(os.path.join(out_dir, "kjv_slice.txt"), "wb").write(kjv_slice())
        open(os.path.join(out_dir, "nonascii.txt"), "wb").write(NONASCII.encode())
        open(os.path.join(out_dir, "invalid.bin"), "wb").write(INVALID)
        tok = train(kjv_slice())
        os.makedirs(os.path.join(out_dir, "gpt2"), exist_ok=True)
        tok.save_model(os.path.join(out_dir, "gpt2"))
        for name, spec in variants(tok).items():
            os.makedirs(os.path.join(out_dir, name), exist_ok=True)
            Tokenizer.from_str(json.dumps(spec))  # HF accepts it
            with open(os.path.join(out_dir, name, "tokenizer.json"), "w") as f:
                json.dump(spec, f, ensure_ascii=False)
    samples = texts(out_dir)
    tokenizers = {name: Tokenizer.from_file(os.path.join(out_dir, name, "tokenizer.json"))
                  for name in ("gpt2", "llama3", "qwen2")}
    tokenizers["gpt2-files"] = ByteLevelBPETokenizer.from_file(os.path.join(out_dir, "gpt2", "vocab.json"),
                                                               os.path.join(out_dir, "gpt2", "merges.txt"))
    bad = 0
    for name, tokenizer in tokenizers.items():
        for sample, ids in encode_all(tokenizer, samples).items():
            path = os.path.join(out_dir, name.replace("-files", ""), sample.split(".")[0] +
                                ("_files" if name.endswith("-files") else "") + ".ids")
            if check:
                have = [int(x) for x in open(path).read().split()]
                same = have == ids
                bad += not same
                print(f"{name} {sample}: {len(ids)} tokens, {'same' if same else 'DIFFERENT'}")
            else:
                with open(path, "w") as f:
                    f.write("\n".join(map(str, ids)) + "\n")
    sys.exit(1 if bad else 0)


if __name__ == "__main__":
    main()
