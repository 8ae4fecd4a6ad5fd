#!/usr/bin/env python3
"""Expected token ids for tests/data/tokenizers/corpus.json from Hugging Face `tokenizers`, the
reference that tests/test_tokenizer.cpp holds ZeRO-Pipe's tokenizer to (Tokenizer.MatchesHuggingFace...).

Three tokenizers, each encoding every corpus string with add_special_tokens=False (special tokens in
the text are matched, no BOS):
  gpt2                byte-level BPE from GPT-2's encoder.json + vocab.bpe, GPT-2's pattern (ByteLevel
                      with use_regex), <|endoftext|> special;
  llama3              Llama 3's tokenizer.json as committed (tests/reference/extract_llama3_tokenizer.js);
  gpt2_qwen2_pattern  GPT-2's vocabulary and merges with Qwen2's pre-tokenizer: Split(Qwen2's pattern,
                      isolated) then ByteLevel(use_regex=False) (Qwen2's own vocabulary is not available
                      offline; its NFC normalizer is left out, as ZeRO-Pipe does not apply one yet).

Needs only `tokenizers` (>= 0.20, which reads the [a, b] merge form of the Llama 3 file). From the
repository root, after a build has unpacked the data (or `mkdir -p /tmp/tok && for a in gpt2 llama3;
do tar xJf tests/data/tokenizers/$a.tar.xz -C /tmp/tok; done` and /tmp/tok below):

    python3 -m venv /tmp/tokenizers-venv && /tmp/tokenizers-venv/bin/pip install 'tokenizers>=0.20'
    /tmp/tokenizers-venv/bin/python tests/reference/tokenizers_reference.py \\
        tests/data/tokenizers/corpus.json build/tests/tokenizers tests/data/tokenizers/expected_hf.json
"""
import json
import sys

import tokenizers
from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers

QWEN2_PATTERN = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"
                 r"|\s*[\r\n]+|\s+(?!\S)|\s+")


def gpt2_bpe(data_dir, pre_tokenizer):
    tok = Tokenizer(models.BPE.from_file(f"{data_dir}/gpt2/encoder.json", f"{data_dir}/gpt2/vocab.bpe"))
    tok.pre_tokenizer = pre_tokenizer
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens(["<|endoftext|>"])
    return tok


def main():
    if len(sys.argv) != 4:
        sys.exit("usage: tokenizers_reference.py CORPUS_JSON UNPACKED_DIR OUT_JSON")
    corpus_path, data_dir, out_path = sys.argv[1:]
    with open(corpus_path, encoding="utf-8") as f:
        corpus = json.load(f)
    built = {
        "gpt2": gpt2_bpe(data_dir, pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)),
        "llama3": Tokenizer.from_file(f"{data_dir}/llama3/tokenizer.json"),
        "gpt2_qwen2_pattern": gpt2_bpe(data_dir, pre_tokenizers.Sequence([
            pre_tokenizers.Split(Regex(QWEN2_PATTERN), behavior="isolated", invert=False),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ])),
    }
    ids = {name: [tok.encode(s, add_special_tokens=False).ids for s in corpus] for name, tok in built.items()}
    # Round trips, as a check of this script: tokenizers' decode is lossless on valid UTF-8.
    for name, tok in built.items():
        for s, i in zip(corpus, ids[name]):
            if tok.decode(i, skip_special_tokens=False) != s:
                print(f"note: {name} does not decode {json.dumps(s)} back to itself", file=sys.stderr)
    source = f"tokenizers {tokenizers.__version__} (tests/reference/tokenizers_reference.py)"
    # One line per string keeps the committed file diffable, as expected_js.json.
    with open(out_path, "w", encoding="utf-8") as f:
        f.write("{\n" + f'"source": {json.dumps(source)},\n')
        f.write(",\n".join(f'"{name}": [\n' + ",\n".join("  " + json.dumps(v, separators=(",", ":")) for v in vals) + "\n]"
                           for name, vals in ids.items()))
        f.write("\n}\n")
    print(f"{out_path}: {len(corpus)} strings, {', '.join(built)}")


if __name__ == "__main__":
    main()
