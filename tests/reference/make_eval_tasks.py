#!/usr/bin/python3
"""Makes the evaluation acceptance data of issue 13 from the demo's license texts (data/tiny/licenses.bin,
one byte per token):

  tests/data/eval/licenses_mc.jsonl       multiple_choice: a context snippet ending at a word boundary, the
                                          true next 20-40 bytes and 3 distractors from elsewhere in the text
  tests/data/eval/licenses_rolling.jsonl  loglikelihood_rolling: paragraphs, several longer than the model's
                                          128 positions so that the rolling windows matter
  tests/data/eval/demo-model/tokenizer.json, tokenizer_config.json
                                          a byte-level tokenizer whose token id is the byte's value (the demo
                                          model's vocabulary of 256), EOS = byte 0 (the harness's prefix
                                          token when there is no BOS)

Documents come from the held-out end of the data (the last 5%, the demo's val_fraction) where it has
enough (the multiple-choice distractors too). Deterministic: a fixed seed, so running it
again gives the same files.

    /usr/bin/python3 tests/reference/make_eval_tasks.py [--repo .]
"""
import argparse
import json
import os
import random
import re
import sys

import numpy as np

SEED = 20261125
N_MC = 520
N_EMPTY_CONTEXT = 6
N_LONG_CONTEXT = 12  # contexts longer than the model's 128 positions: the input is truncated from the left
VAL_FRACTION = 0.05


def bytes_to_unicode():
    """GPT-2's byte-level alphabet (encoder.py): printable Latin-1 bytes stand for themselves, the others
    for U+0100 onwards in byte order."""
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return dict(zip(bs, [chr(c) for c in cs]))


def read_text(path):
    raw = open(path, "rb").read()
    magic = np.frombuffer(raw[:4], dtype=np.int32)[0]
    if magic != 0x5A50544B:
        sys.exit(f"{path}: not a ZeRO-Pipe token file (magic {magic:#x})")
    header = np.frombuffer(raw[:1024], dtype=np.int32)
    width = int(header[2])
    tokens = np.frombuffer(raw[1024:], dtype=np.uint16 if width == 2 else np.int32)
    if tokens.max() > 255:
        sys.exit(f"{path}: token {tokens.max()} is not a byte")
    return bytes(tokens.astype(np.uint8).tolist()).decode("utf-8")


def word_starts(text, lo, hi):
    """Offsets in [lo, hi) where a word starts (a non-space after a space)."""
    return [lo + m.start() for m in re.finditer(r"(?<=\s)\S", text[lo:hi])]


def span_at(text, start, rng):
    """20-40 bytes from `start`, cut at the end of a word; None when nothing usable is there."""
    want = rng.randint(20, 40)
    piece = text[start : start + want + 15]
    cut = [m.end() for m in re.finditer(r"\S(?=\s)", piece) if 20 <= m.end() <= want + 10]
    if not cut:
        return None
    s = piece[: cut[-1] if cut[-1] <= want else cut[0]]
    return s if s.strip() and len(s) >= 12 else None


def make_mc(text, val_start, rng):
    items = []
    val_words = word_starts(text, val_start, len(text) - 60)
    # Distractors from the held-out text too: the model has partly memorised the training text, and
    # distractors from there would look likelier than any held-out answer.
    all_words = val_words
    seen = set()
    attempts = 0
    while len(items) < N_MC and attempts < 100000:
        attempts += 1
        k = len(items)
        if k < N_EMPTY_CONTEXT:
            ctx_len = 0
        elif k < N_EMPTY_CONTEXT + N_LONG_CONTEXT:
            ctx_len = rng.randint(180, 320)
        else:
            ctx_len = rng.randint(60, 100)
        answer_start = rng.choice(val_words)
        if answer_start - ctx_len < 0 or (ctx_len and answer_start - ctx_len < val_start - 400):
            continue
        gold_text = span_at(text, answer_start, rng)
        if gold_text is None:
            continue
        # The context ends at the word boundary before the answer; its whitespace there is dropped
        # (the target delimiter, one space, stands for it), except on about a third of the items, which
        # keep some of it so that the harness's move of trailing whitespace into the continuation
        # is exercised: a single space, the newline and indentation of a new line, or two spaces.
        before = text[:answer_start].rstrip()
        trailing = text[len(before) : answer_start]
        if ctx_len == 0:
            context = ""
        else:
            context = before[max(0, len(before) - ctx_len) :]
            # Start the snippet at a word start.
            m = re.search(r"\s\S", context)
            if m and m.start() < 30:
                context = context[m.start() + 1 :]
            style = rng.random()
            if style < 0.12:
                context += " "
            elif style < 0.24:
                context += trailing if trailing.strip(" ") != trailing.strip() else trailing + "\n"
            elif style < 0.33:
                context += "  "
        if (context, gold_text) in seen:
            continue
        distractors = []
        while len(distractors) < 3:
            d = span_at(text, rng.choice(all_words), rng)
            if d and d != gold_text and d not in distractors and d not in gold_text and gold_text not in d:
                distractors.append(d)
        gold = rng.randrange(4)
        choices = distractors[:gold] + [gold_text] + distractors[gold:]
        seen.add((context, gold_text))
        items.append({"context": context, "choices": choices, "gold": gold})
    if len(items) < N_MC:
        sys.exit(f"made only {len(items)} multiple-choice items")
    return items


def make_rolling(text, val_start):
    paragraphs = []
    # Paragraphs are separated by blank lines; whitespace inside is kept as it is (the perplexities count
    # it). From the held-out end first, then backwards from there until there are enough.
    spans = [(m.start(), m.end()) for m in re.finditer(r"\S(?:.|\n(?!\s*\n))*", text)]
    held_out = [s for s in spans if s[0] >= val_start]
    earlier = [s for s in spans if s[0] < val_start][::-1]
    for a, b in held_out + earlier:
        p = text[a:b]
        if len(p) >= 40:
            paragraphs.append(p)
        if len(paragraphs) >= 24 and sum(len(p) > 128 for p in paragraphs) >= 8:
            break
    long_ones = [p for p in paragraphs if len(p) > 300]
    if len(paragraphs) < 20 or len(long_ones) < 3:
        sys.exit(f"made only {len(paragraphs)} paragraphs ({len(long_ones)} longer than 300 bytes)")
    # Cap very long ones at about 1200 bytes (a word boundary) to keep the CPU test quick.
    out = []
    for p in paragraphs:
        if len(p) > 1200:
            p = p[: p.rfind(" ", 0, 1200)]
        out.append({"text": p})
    return out


def write_jsonl(path, header, docs):
    with open(path, "w", encoding="utf-8") as f:
        f.write(json.dumps(header) + "\n")
        for d in docs:
            f.write(json.dumps(d) + "\n")


def write_tokenizer(folder):
    alphabet = bytes_to_unicode()
    byte_level = {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": True}
    tok = {
        "version": "1.0",
        "truncation": None,
        "padding": None,
        "added_tokens": [],
        "normalizer": None,
        "pre_tokenizer": byte_level,
        "post_processor": byte_level,
        "decoder": byte_level,
        "model": {
            "type": "BPE",
            "dropout": None,
            "unk_token": None,
            "continuing_subword_prefix": None,
            "end_of_word_suffix": None,
            "fuse_unk": False,
            "byte_fallback": False,
            "ignore_merges": False,
            "vocab": {alphabet[b]: b for b in range(256)},
            "merges": [],
        },
    }
    with open(os.path.join(folder, "tokenizer.json"), "w", encoding="utf-8") as f:
        json.dump(tok, f, ensure_ascii=False, indent=1)
        f.write("\n")
    config = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "eos_token": alphabet[0],
        "model_max_length": 128,
        "clean_up_tokenization_spaces": False,
    }
    with open(os.path.join(folder, "tokenizer_config.json"), "w", encoding="utf-8") as f:
        json.dump(config, f, ensure_ascii=False, indent=1)
        f.write("\n")


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--repo", default=os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))
    args = ap.parse_args()
    text = read_text(os.path.join(args.repo, "data", "tiny", "licenses.bin"))
    if not text.isascii():
        sys.exit("the license text is expected to be ASCII")
    val_start = int(len(text) * (1 - VAL_FRACTION))
    out = os.path.join(args.repo, "tests", "data", "eval")
    os.makedirs(os.path.join(out, "demo-model"), exist_ok=True)
    rng = random.Random(SEED)
    mc = make_mc(text, val_start, rng)
    rolling = make_rolling(text, val_start)
    write_jsonl(os.path.join(out, "licenses_mc.jsonl"),
                {"task": "licenses_mc", "output_type": "multiple_choice", "target_delimiter": " ", "version": 1.0}, mc)
    write_jsonl(os.path.join(out, "licenses_rolling.jsonl"),
                {"task": "licenses_rolling", "output_type": "loglikelihood_rolling", "version": 1.0}, rolling)
    write_tokenizer(os.path.join(out, "demo-model"))
    trailing = sum(1 for d in mc if d["context"] != d["context"].rstrip())
    print(f"{len(mc)} multiple-choice items ({sum(1 for d in mc if not d['context'])} with an empty context, "
          f"{trailing} with trailing whitespace, {sum(1 for d in mc if len(d['context']) > 128)} longer than 128 bytes); "
          f"{len(rolling)} paragraphs ({sum(1 for d in rolling if len(d['text']) > 128)} longer than 128 bytes)")


if __name__ == "__main__":
    main()
