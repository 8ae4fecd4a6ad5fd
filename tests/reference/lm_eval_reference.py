#!/usr/bin/env python3
"""Reference scores for `zeropipe eval` (issue 13, item 5): the same task files scored by transformers with
lm-evaluation-harness's request building and metrics, re-implemented here from the harness's source
(lm_eval/api/model.py: _encode_pair, loglikelihood; lm_eval/models/huggingface.py: tok_encode,
loglikelihood_rolling, _loglikelihood_tokens, generate_until; lm_eval/utils.py: get_rolling_token_windows,
make_disjoint_window; lm_eval/api/task.py: process_results; lm_eval/api/metrics.py: mean, mean_stderr,
weighted_perplexity, bits_per_byte) for hosts where lm-eval itself is not installed. The model runs in
float32 through AutoModelForCausalLM, the tokenizer is the folder's tokenizer.json (+ tokenizer_config.json).

    python3 tests/reference/lm_eval_reference.py --model tests/data/eval/demo-model \\
        --tasks tests/data/eval/licenses_mc.jsonl tests/data/eval/licenses_rolling.jsonl \\
        --out tests/data/eval/reference_results.json

Needs torch and transformers (tested against torch 2.11, transformers 5.17). Task files: see
src/runtime/eval_tasks.h (a header line, then one document per line).
"""
import argparse
import json
import math
import os
import re
import sys


def die(msg):
    print(f"lm_eval_reference.py: error: {msg}", file=sys.stderr)
    sys.exit(1)


try:
    import numpy as np
    import torch
    import torch.nn.functional as F
    import transformers
    from transformers import AutoModelForCausalLM, AutoTokenizer
except ImportError as e:
    die(f"{e}; this script needs numpy, torch and transformers (pip install torch transformers)")


# ---------------------------------------------------------------- task files

OUTPUT_TYPES = ("multiple_choice", "loglikelihood_rolling", "generate_until")
HEADER_KEYS = {"task", "output_type", "target_delimiter", "fewshot_delimiter", "until", "max_gen_toks", "version"}
DOC_KEYS = {
    "multiple_choice": {"context", "choices", "gold"},
    "loglikelihood_rolling": {"text"},
    "generate_until": {"context", "target"},
}


def read_task(path):
    """The task file as {"header": {...}, "docs": [...]}, with the defaults of src/runtime/eval_tasks.cpp."""
    if not os.path.isfile(path):
        die(f"{path}: no such task file")
    header, docs = None, []
    with open(path, encoding="utf-8") as f:
        for n, line in enumerate(f, 1):
            if not line.strip():
                continue
            where = f"{path}:{n}"
            try:
                obj = json.loads(line)
            except json.JSONDecodeError as e:
                die(f"{where}: not valid JSON: {e}")
            if not isinstance(obj, dict):
                die(f"{where}: expected a JSON object")
            if header is None:
                unknown = set(obj) - HEADER_KEYS
                if unknown:
                    die(f"{where}: unknown header field(s) {sorted(unknown)}")
                if "task" not in obj or "output_type" not in obj:
                    die(f"{where}: the header needs 'task' and 'output_type'")
                if obj["output_type"] not in OUTPUT_TYPES:
                    die(f"{where}: field 'output_type' must be one of {OUTPUT_TYPES}")
                header = {"target_delimiter": " ", "fewshot_delimiter": "\n\n", "max_gen_toks": 256, "version": None}
                header.update(obj)
                if header["output_type"] == "generate_until" and "until" not in obj:
                    header["until"] = [header["fewshot_delimiter"]]
                continue
            keys = DOC_KEYS[header["output_type"]]
            if set(obj) != keys:
                die(f"{where}: a {header['output_type']} document has the fields {sorted(keys)}, got {sorted(obj)}")
            obj["_line"] = n
            docs.append(obj)
    if header is None or not docs:
        die(f"{path}: needs a header line and at least one document")
    return {"path": path, "header": header, "docs": docs}


# ---------------------------------------------------------------- the model, as the harness's HFLM

class HarnessLM:
    def __init__(self, model_dir, max_length, batch_size, device):
        if not os.path.isdir(model_dir):
            die(f"{model_dir}: not a folder (a hub folder with config.json, model.safetensors, tokenizer.json)")
        for f in ("config.json", "tokenizer.json"):
            if not os.path.isfile(os.path.join(model_dir, f)):
                die(f"{model_dir}: has no {f}")
        try:
            self.tokenizer = AutoTokenizer.from_pretrained(model_dir)
        except Exception as e:  # fall back to the fast tokenizer class itself
            try:
                from transformers import PreTrainedTokenizerFast

                cfg_path = os.path.join(model_dir, "tokenizer_config.json")
                cfg = json.load(open(cfg_path)) if os.path.isfile(cfg_path) else {}
                kw = {k: cfg[k] for k in ("bos_token", "eos_token") if cfg.get(k) is not None}
                self.tokenizer = PreTrainedTokenizerFast(tokenizer_file=os.path.join(model_dir, "tokenizer.json"), **kw)
            except Exception as e2:
                die(f"{model_dir}: cannot load the tokenizer: {e}; {e2}")
        try:
            self.model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
        except TypeError:
            self.model = AutoModelForCausalLM.from_pretrained(model_dir, torch_dtype=torch.float32)
        except Exception as e:
            die(f"{model_dir}: cannot load the model: {e}")
        self.device = torch.device(device)
        self.model.to(self.device).eval()
        self.batch_size = batch_size
        # resolve_max_length: the model config's context length, else the tokenizer's.
        self.max_length = max_length
        if not self.max_length:
            for attr in ("n_positions", "max_position_embeddings", "n_ctx"):
                if getattr(self.model.config, attr, None):
                    self.max_length = int(getattr(self.model.config, attr))
                    break
        if not self.max_length:
            die("cannot tell the model's context length; give --max-length")
        if self.prefix_token_id is None:
            die("the tokenizer has neither a BOS nor an EOS token (the harness's prefix_token_id)")

    @property
    def prefix_token_id(self):
        if self.tokenizer.bos_token_id is not None:
            return self.tokenizer.bos_token_id
        return self.tokenizer.eos_token_id

    def tok_encode(self, string, add_special_tokens=None):
        # _add_special_kwargs with add_bos_token None: the tokenizer's default unless told; none when the
        # string already starts with the prefix token's text (has_bos_prefix).
        kwargs = {} if add_special_tokens is None else {"add_special_tokens": add_special_tokens}
        if add_special_tokens is None and string.startswith(self.tokenizer.decode(self.prefix_token_id)):
            kwargs["add_special_tokens"] = False
        return self.tokenizer.encode(string, **kwargs)

    def _encode_pair(self, context, continuation):
        assert context, "Context cannot be empty!"
        n_spaces = len(context) - len(context.rstrip())
        if n_spaces > 0:
            continuation = context[-n_spaces:] + continuation
            context = context[:-n_spaces]
        whole_enc = self.tok_encode(context + continuation)
        context_enc = self.tok_encode(context)
        return context_enc, whole_enc[len(context_enc):]

    def loglikelihood(self, pairs):
        reqs = []
        for context, continuation in pairs:
            if context == "":
                continuation_enc = self.tok_encode(continuation, add_special_tokens=False)
                if self.prefix_token_id != continuation_enc[0]:
                    context_enc = [self.prefix_token_id]
                else:
                    context_enc, continuation_enc = continuation_enc[:1], continuation_enc[1:]
            else:
                context_enc, continuation_enc = self._encode_pair(context, continuation)
            reqs.append((context_enc, continuation_enc))
        return self._loglikelihood_tokens(reqs)

    def loglikelihood_rolling(self, strings):
        windows, counts = [], []
        for string in strings:
            w = [make_disjoint_window(p) for p in get_rolling_token_windows(
                self.tok_encode(string), self.prefix_token_id, self.max_length, 1)]
            windows.extend(w)
            counts.append(len(w))
        scores = self._loglikelihood_tokens(windows)
        out, k = [], 0
        for c in counts:
            out.append(sum(s[0] for s in scores[k:k + c]))
            k += c
        return out

    @torch.no_grad()
    def _loglikelihood_tokens(self, reqs):
        """(context_enc, continuation_enc) pairs -> (summed logprob, is_greedy), in request order."""
        order = sorted(range(len(reqs)), key=lambda i: (-len(reqs[i][0] + reqs[i][1]), tuple(reqs[i][0] + reqs[i][1])))
        res = [None] * len(reqs)
        for b0 in range(0, len(order), self.batch_size):
            chunk = order[b0:b0 + self.batch_size]
            inps, inplens = [], []
            for i in chunk:
                ctx, cont = reqs[i]
                assert len(ctx) > 0 and len(cont) > 0 and len(cont) <= self.max_length
                inp = (ctx + cont)[-(self.max_length + 1):][:-1]
                inps.append(inp)
                inplens.append(len(inp))
            padding_len = max(inplens)
            # pad_and_concat(padding_side="right"): zeros after each input; no attention mask (causal).
            batched = torch.zeros((len(chunk), padding_len), dtype=torch.long)
            for r, inp in enumerate(inps):
                batched[r, :len(inp)] = torch.tensor(inp, dtype=torch.long)
            logits = self.model(batched.to(self.device)).logits
            multi_logits = F.log_softmax(logits, dim=-1, dtype=torch.float32)
            for r, i in enumerate(chunk):
                cont = reqs[i][1]
                contlen, inplen = len(cont), inplens[r]
                lg = multi_logits[r][inplen - contlen:inplen].unsqueeze(0)  # _select_cont_toks
                greedy = lg.argmax(dim=-1)
                cont_t = torch.tensor(cont, dtype=torch.long, device=self.device).unsqueeze(0)
                max_equal = bool((greedy == cont_t).all())
                ll = torch.gather(lg, 2, cont_t.unsqueeze(-1)).squeeze(-1)
                res[i] = (float(ll.sum()), max_equal)
        return res

    @torch.no_grad()
    def generate_until(self, contexts, until, max_gen_toks):
        """Greedy generation one context at a time (the harness batches left-padded; greedy tokens agree)."""
        eos_id = self.tokenizer.eos_token_id
        until = list(until)
        if eos_id is not None:
            until.append(self.tokenizer.decode(eos_id, skip_special_tokens=False))
        max_ctx_len = self.max_length - max_gen_toks
        if max_ctx_len <= 0:
            die(f"max_gen_toks {max_gen_toks} must be less than the context of {self.max_length}")
        outs = []
        for context in contexts:
            bos = self.tokenizer.bos_token
            kw = {"add_special_tokens": False} if bos is not None and context.startswith(bos) else {}
            ids = self.tokenizer(context, **kw)["input_ids"][-max_ctx_len:]
            made = []
            for _ in range(max_gen_toks):
                logits = self.model(torch.tensor([ids + made], device=self.device)).logits[0, -1]
                nxt = int(logits.argmax())
                if nxt == eos_id:
                    break
                made.append(nxt)
                text = self.tokenizer.decode(made, skip_special_tokens=True)
                if any(u and u in text for u in until):
                    break
            s = self.tokenizer.decode(made, skip_special_tokens=True)
            for term in until:
                if len(term) > 0:
                    s = s.split(term)[0]
            outs.append(s)
        return outs


def get_rolling_token_windows(token_list, prefix_token, max_seq_len, context_len):
    assert 1 <= context_len <= max_seq_len
    if not token_list:
        return
    pred_len = max_seq_len - context_len + 1
    predicted = 0
    first_seq_len = min(max_seq_len, len(token_list))
    yield [prefix_token] + token_list[: first_seq_len - 1], token_list[:first_seq_len]
    predicted += first_seq_len
    while predicted < len(token_list):
        window_pred_len = min(len(token_list) - predicted, pred_len)
        window_end = predicted + window_pred_len
        yield (token_list[window_end - max_seq_len - 1 : window_end - 1],
               token_list[window_end - window_pred_len : window_end])
        predicted += window_pred_len


def make_disjoint_window(pair):
    a, b = pair
    return a[: len(a) - (len(b) - 1)], b


# ---------------------------------------------------------------- metrics (lm_eval/api/metrics.py)

def mean(arr):
    return sum(arr) / len(arr)


def mean_stderr(arr):
    if len(arr) < 2:
        return "N/A"
    mu = mean(arr)
    return math.sqrt(sum((x - mu) ** 2 for x in arr) / (len(arr) - 1)) / math.sqrt(len(arr))


def weighted_mean(items):
    a, b = zip(*items)
    return sum(a) / sum(b)


def evaluate_task(lm, task, limit):
    h = task["header"]
    docs = task["docs"] if limit is None or limit < 0 else task["docs"][:limit]
    typ = h["output_type"]
    metrics, hib = {}, {}
    if typ == "multiple_choice":
        pairs = [(d["context"], f"{h['target_delimiter']}{c}") for d in docs for c in d["choices"]]
        scores = lm.loglikelihood(pairs)
        acc, acc_norm, k = [], [], 0
        for d in docs:
            choices = d["choices"]
            lls = np.array([s[0] for s in scores[k:k + len(choices)]])
            k += len(choices)
            completion_len = np.array([float(len(c)) for c in choices])
            pred, pred_norm = np.argmax(lls), np.argmax(lls / completion_len)
            acc.append(1.0 if pred == d["gold"] else 0.0)
            acc_norm.append(1.0 if pred_norm == d["gold"] else 0.0)
        for name, v in (("acc", acc), ("acc_norm", acc_norm)):
            metrics[f"{name},none"] = mean(v)
            metrics[f"{name}_stderr,none"] = mean_stderr(v)
            hib[name] = True
    elif typ == "loglikelihood_rolling":
        lls = lm.loglikelihood_rolling([d["text"] for d in docs])
        words = [(ll, len(re.split(r"\s+", d["text"]))) for ll, d in zip(lls, docs)]
        nbytes = [(ll, len(d["text"].encode("utf-8"))) for ll, d in zip(lls, docs)]
        metrics["word_perplexity,none"] = math.exp(-weighted_mean(words))
        metrics["word_perplexity_stderr,none"] = "N/A"
        metrics["byte_perplexity,none"] = math.exp(-weighted_mean(nbytes))
        metrics["byte_perplexity_stderr,none"] = "N/A"
        metrics["bits_per_byte,none"] = -weighted_mean(nbytes) / math.log(2)
        metrics["bits_per_byte_stderr,none"] = "N/A"
        hib.update(word_perplexity=False, byte_perplexity=False, bits_per_byte=False)
    else:
        outs = lm.generate_until([d["context"] for d in docs], h["until"], h["max_gen_toks"])
        em = [1.0 if o == d["target"] else 0.0 for o, d in zip(outs, docs)]
        metrics["exact_match,none"] = mean(em)
        metrics["exact_match_stderr,none"] = mean_stderr(em)
        hib["exact_match"] = True
    return docs, metrics, hib


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", required=True, help="hub folder (config.json, model.safetensors, tokenizer.json)")
    ap.add_argument("--tasks", required=True, nargs="+", help="task files (JSONL)")
    ap.add_argument("--out", required=True, help="results JSON to write")
    ap.add_argument("--limit", type=int, default=-1)
    ap.add_argument("--max-length", type=int, default=0, help="default: the model config's positions")
    ap.add_argument("--batch-size", type=int, default=32)
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    args = ap.parse_args()

    tasks = [read_task(p) for p in args.tasks]
    torch.backends.cuda.matmul.allow_tf32 = False  # float32 means float32
    torch.backends.cudnn.allow_tf32 = False
    lm = HarnessLM(args.model, args.max_length, args.batch_size, args.device)
    # The demo's tokenizer maps each byte to its own value: check that transformers reads it so.
    if len(lm.tokenizer) == 256:
        probe = "Copyright (C) 2007  <x>\n\tend"
        got = lm.tokenizer.encode(probe, add_special_tokens=False)
        if got != list(probe.encode("utf-8")):
            die(f"{args.model}: the byte-level tokenizer does not give byte values: {probe!r} -> {got}")

    out = {k: {} for k in ("results", "group_subtasks", "configs", "versions", "n-shot", "higher_is_better", "n-samples")}
    for t in tasks:
        name = t["header"]["task"]
        if name in out["results"]:
            die(f"{t['path']}: task '{name}' appears twice")
        docs, metrics, hib = evaluate_task(lm, t, args.limit)
        out["results"][name] = {"alias": name, **metrics}
        out["group_subtasks"][name] = []
        h = t["header"]
        cfg = {"task": name, "task_file": t["path"], "output_type": h["output_type"],
               "target_delimiter": h["target_delimiter"], "fewshot_delimiter": h["fewshot_delimiter"], "num_fewshot": 0}
        if h["output_type"] == "generate_until":
            cfg["generation_kwargs"] = {"until": h["until"], "max_gen_toks": h["max_gen_toks"], "do_sample": False}
        cfg["metric_list"] = [{"metric": m, "higher_is_better": v} for m, v in hib.items()]
        out["configs"][name] = cfg
        out["versions"][name] = h["version"]
        out["n-shot"][name] = 0
        out["higher_is_better"][name] = hib
        out["n-samples"][name] = {"original": len(t["docs"]), "effective": len(docs)}
        print(f"{name}: " + ", ".join(f"{k} {v}" for k, v in metrics.items() if "stderr" not in k), flush=True)
    out["config"] = {
        "model": args.model, "model_args": None, "dtype": "fp32", "device": args.device,
        "max_length": lm.max_length, "batch_size": args.batch_size, "limit": None if args.limit < 0 else args.limit,
        "reference": "tests/reference/lm_eval_reference.py (lm-evaluation-harness rules re-implemented)",
        "torch": torch.__version__, "transformers": transformers.__version__,
    }
    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
    with open(args.out, "w", encoding="utf-8") as f:
        json.dump(out, f, indent=2)
        f.write("\n")
    print(f"results: {args.out}")


if __name__ == "__main__":
    main()
