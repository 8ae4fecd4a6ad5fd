#!/usr/bin/env python3
"""Greedy generation of transformers on the golden LM folders, the reference of tests/test_generation.cpp.

For each folder (tests/golden/{gpt2,llama,qwen2}-tiny) five ragged prompts of random token ids
(lengths 1, 4, 9, 17 and 30; numpy seed 1234) each get 32 new tokens from transformers in float32
on the CPU: one prompt at a time through its KV cache (past_key_values), the next token the argmax
of the last logits, which is what `generate(do_sample=False)` does; generate() itself is run too and
must agree wherever it did not stop early at the model's EOS. Writes <folder>/generate.json:
prompts, outputs, and for each output token the gap between the best and second-best logit (a gap
near float32 rounding would make a comparison meaningless; the test reports the smallest).

  python3 tests/reference/generate_reference.py tests/golden/{gpt2,llama,qwen2}-tiny
"""
import json
import sys

import numpy as np
import torch
from transformers import AutoModelForCausalLM

NEW_TOKENS = 32
LENGTHS = [1, 4, 9, 17, 30]


def greedy(model, prompt):
    ids = torch.tensor([prompt])
    out, gaps, past = [], [], None
    with torch.no_grad():
        for _ in range(NEW_TOKENS):
            res = model(input_ids=ids, past_key_values=past, use_cache=True)
            past = res.past_key_values
            logits = res.logits[0, -1].double()
            top = torch.topk(logits, 2)
            nxt = int(top.indices[0])
            gaps.append(float(top.values[0] - top.values[1]))
            out.append(nxt)
            ids = torch.tensor([[nxt]])
    return out, gaps


def main(folders):
    torch.manual_seed(0)
    for folder in folders:
        model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32, attn_implementation="eager")
        model.eval()
        vocab = model.config.vocab_size
        rng = np.random.default_rng(1234)
        prompts = [[int(t) for t in rng.integers(0, vocab, n)] for n in LENGTHS]
        outputs, gaps = [], []
        for p in prompts:
            o, g = greedy(model, p)
            with torch.no_grad():
                gen = model.generate(torch.tensor([p]), do_sample=False, max_new_tokens=NEW_TOKENS,
                                     attention_mask=torch.ones(1, len(p), dtype=torch.long), pad_token_id=0)
            gen = gen[0, len(p):].tolist()
            if gen != o[:len(gen)]:
                sys.exit(f"{folder}: generate() {gen} differs from the cached argmax loop {o}")
            outputs.append(o)
            gaps.append(g)
        with open(f"{folder}/generate.json", "w") as f:
            json.dump({"new_tokens": NEW_TOKENS, "dtype": "float32", "device": "cpu",
                       "transformers": __import__("transformers").__version__, "prompts": prompts,
                       "outputs": outputs, "logit_gaps": gaps}, f)
        print(f"{folder}: {len(prompts)} prompts, smallest logit gap {min(min(g) for g in gaps):.3e}")


if __name__ == "__main__":
    main(sys.argv[1:])
