#!/usr/bin/env python3
"""The anchor of zp_bench_generate (issue 13): transformers' `generate` on a Llama-shaped model with
random bf16 weights, on one GPU: `batch` prompts of 128 random tokens, 128 new tokens each, greedy,
EOS disabled so every sequence makes all 128 (min_new_tokens would change the logits; eos_token_id
None does not). Eager with the dynamic cache, or --compile 1: the static cache, with which generate
compiles the decoding forward itself (transformers' documented fast path; compiling model.forward by
hand with mode reduce-overhead fails on the static cache's in-place updates in 5.17). Prints tokens/s (batch * 128 over the generate call, prefill
included) and peak memory as one JSON line.

  python3 bench/reference/torch_generate.py --model 1b|8b --batch 1|64|256 [--compile 0|1]
"""
import argparse
import json
import time

import torch
from transformers import LlamaConfig, LlamaForCausalLM

SHAPES = {
    "1b": dict(vocab_size=128256, hidden_size=2048, intermediate_size=8192, num_hidden_layers=16,
               num_attention_heads=32, num_key_value_heads=8, tie_word_embeddings=True),
    "8b": dict(vocab_size=128256, hidden_size=4096, intermediate_size=14336, num_hidden_layers=32,
               num_attention_heads=32, num_key_value_heads=8, tie_word_embeddings=False),
}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="1b", choices=sorted(SHAPES))
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--compile", type=int, default=0)
    ap.add_argument("--prompt", type=int, default=128)
    ap.add_argument("--new", type=int, default=128)
    ap.add_argument("--runs", type=int, default=2)
    a = ap.parse_args()
    cfg = LlamaConfig(max_position_embeddings=8192, rope_theta=500000.0, rms_norm_eps=1e-5, **SHAPES[a.model])
    cfg._attn_implementation = "sdpa"
    torch.set_default_dtype(torch.bfloat16)
    with torch.device("cuda"):
        model = LlamaForCausalLM(cfg)
    torch.set_default_dtype(torch.float32)
    model.eval()
    model.generation_config.eos_token_id = None
    model.generation_config.pad_token_id = 0
    kw = dict(do_sample=False, max_new_tokens=a.new, min_new_tokens=None)
    if a.compile:
        model.generation_config.cache_implementation = "static"
    g = torch.Generator(device="cuda").manual_seed(1)
    ids = torch.randint(0, cfg.vocab_size, (a.batch, a.prompt), device="cuda", generator=g)
    mask = torch.ones_like(ids)
    with torch.no_grad():
        for _ in range(3 if a.compile else 1):  # warm-up (compilation)
            model.generate(input_ids=ids, attention_mask=mask, **kw)
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        t0 = time.perf_counter()
        for _ in range(a.runs):
            out = model.generate(input_ids=ids, attention_mask=mask, **kw)
        torch.cuda.synchronize()
        s = (time.perf_counter() - t0) / a.runs
    assert out.shape[1] == a.prompt + a.new, out.shape
    print(json.dumps({"bench": "torch_generate", "model": a.model, "batch": a.batch, "compile": a.compile,
                      "tokens_per_s": a.batch * a.new / s, "seconds": s,
                      "peak_GiB": torch.cuda.max_memory_allocated() / 2**30,
                      "torch": torch.__version__, "transformers": __import__("transformers").__version__}))


if __name__ == "__main__":
    main()
