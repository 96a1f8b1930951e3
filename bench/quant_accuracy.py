#!/usr/bin/env python3
"""Quantisation error of libgdn and of llama.cpp at the same nominal bits, on the same weights.

For each checkpoint, each engine runs the same token ids in bf16 and quantised, and each engine's
quantised logits are compared with **its own** bf16 logits (issue 16, point 4):
  - libgdn: `gdn logits MODEL --tokens ... --out F.npy [--quant q8_0|q4_0|q4_k [--lm-head-quant Q]]`
    (every position's logits): q8_0, q4_0 and q4_k with their default lm_head (q8_0), and q4_0 and
    q4_k with every projection at 4 bits (--lm-head-quant q4_0 / q4_k);
  - llama.cpp (llama-cpp-python): the bf16 GGUF bench/peer.py benchmarks (bench/convert_gguf.py),
    quantised by llama.cpp's own llama_model_quantize to Q8_0, Q4_0 and Q4_K_M as llama.cpp chooses
    (its Q4_0 keeps the output, here the tied embedding, at Q6_K, or Q8_0 where rows are not a
    multiple of 256; its Q8_0 also quantises the embedding lookup), and to Q8_0 and Q4_0 with
    libgdn's policies (the embedding lookup bf16; the output at the format too, or under Q4_0 at
    Q8_0 as libgdn's default q4_0 keeps it); one llama_decode per prompt with logits for every
    position.
Figures per (engine, format), pooled over every position of every prompt:
  - rms, max: RMS and max of |quantised - bf16| logits, each divided by the bf16 logits' RMS;
  - top1: the fraction of positions whose argmax is unchanged;
  - kl: the mean KL(bf16 softmax || quantised softmax) per position, in nats.
Also libgdn bf16 vs llama.cpp bf16 (the same weights through the two engines), as a check that the
GGUF is the same model. On a model with eval/heldout.jsonl (gdn-tiny) the tokens are held-out
prompts followed by their expected answers, and --exact-match also runs greedy generation on
every held-out prompt (up to 16 new tokens; correct = the expected answer's ids then eos) in
llama.cpp (argmax of llama_decode's logits) and in libgdn (`gdn generate`).

llama.cpp runs without its extra weight buffer types (no AMX / interleaved repacking; bench/peer.py's
PEER_NO_EXTRA_BUFTS=1, which the benchmark needs here) unless --extra-bufts is given: its generic
CPU kernels, which quantise the activations of Q8_0 / Q4_0 products to Q8_0 and of Q4_K / Q6_K ones
to Q8_K (8 bits), and round them to bf16 for BF16 weights.

What produced docs/quantization.md's table (2 threads; ~/venv-bench from bench/run.sh):
  build/bin/gdn bench --shape 0.8b --write-checkpoint /tmp/qacc/0.8b
  ~/venv-bench/bin/python bench/quant_accuracy.py --gdn build/bin/gdn --work /tmp/qacc \\
      --model gdn-tiny=models/gdn-tiny --model 0.8b=/tmp/qacc/0.8b --exact-match \\
      --json docs/bench-results/quant-accuracy.json
--work holds the GGUFs (converted and quantised once, then reused) and the logits files.
"""

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import peer  # noqa: E402  (convert, quantise, context: the same GGUFs and contexts as the benchmark's peer)

# (label, --quant, --lm-head-quant): the label is the key in the JSON and the table.
GDN_QUANTS = [("q8_0", "q8_0", None), ("q4_0", "q4_0", None), ("q4_0, lm_head q4_0", "q4_0", "q4_0"),
              ("q4_k", "q4_k", None), ("q4_k, lm_head q4_k", "q4_k", "q4_k"),
              ("q4_k_m", "q4_k_m", None), ("q4_k_m, lm_head q4_k", "q4_k_m", "q4_k")]
# The lm_head's bits per weight under each (q4_0's default lm_head is q8_0).
# (projections, lm_head, the projections q4_k_m gives more bits; None: as the projections)
GDN_BITS = {"q8_0": (8.5, 8.5, None), "q4_0": (4.5, 8.5, None), "q4_0, lm_head q4_0": (4.5, 4.5, None),
            "q4_k": (4.625, 8.5, None), "q4_k, lm_head q4_k": (4.625, 4.625, None),
            "q4_k_m": (4.625, 8.5, 8.5), "q4_k_m, lm_head q4_k": (4.625, 4.625, 8.5)}
# Under q4_k_m a q4_k matrix whose rows are not whole super-blocks of 256 columns is q5_0 (5.5 bits),
# as llama.cpp's Q4_K_M falls back to Q5_0 there.


def more_bits_layer(i, n):
    """q4_k_m's layers with more bits (gdn::quant_more_bits_layer, llama.cpp's Q4_K_M rule)."""
    return i < n // 8 or i >= 7 * n // 8 or (i - n // 8) % 3 == 2
GGML_Q8_0, GGML_Q4_0 = 8, 2
# (label, llama.cpp ftype, untied GGUF, output type, embedding type). The first three are llama.cpp's
# own choices, what its users run. The "libgdn's policy" ones quantise exactly the tensors libgdn
# does: every projection and the output at the format, the embedding lookup left bf16 (an untied
# GGUF, the embedding written twice, so that the two can differ).
LLAMA_QUANTS = [("Q8_0", "Q8_0", False, None, None), ("Q4_0", "Q4_0", False, None, None),
                ("Q4_K_M", "Q4_K_M", False, None, None),
                ("Q8_0, libgdn's policy", "Q8_0", True, GGML_Q8_0, peer.GGML_TYPE_BF16),
                ("Q4_0, libgdn's policy (output Q8_0)", "Q4_0", True, GGML_Q8_0, peer.GGML_TYPE_BF16),
                ("Q4_0, libgdn's all-4-bit policy", "Q4_0", True, GGML_Q4_0, peer.GGML_TYPE_BF16)]
MAX_NEW = 16  # models/gdn-tiny/generation_config.json


# ---------------------------------------------------------------------------------------------
# llama.cpp, in a child process per GGUF: a crash (signal) is reported, not fatal to the others.

def llama_load(L, gguf_path, extra_bufts):
    L.llama_backend_init()
    mp = L.llama_model_default_params()
    mp.use_mmap = True
    if not extra_bufts:
        mp.use_extra_bufts = False  # see the module docstring
    model = L.llama_model_load_from_file(gguf_path.encode(), mp)
    if not model:
        sys.exit("llama.cpp could not load " + gguf_path)
    return model


def llama_decode(L, ctx, batch, tokens, start, all_logits):
    batch.n_tokens = len(tokens)
    for i, t in enumerate(tokens):
        batch.token[i] = t
        batch.pos[i] = start + i
        batch.n_seq_id[i] = 1
        batch.seq_id[i][0] = 0
        batch.logits[i] = 1 if (all_logits or i == len(tokens) - 1) else 0
    rc = L.llama_decode(ctx, batch)
    if rc != 0:
        sys.exit(f"llama_decode returned {rc}")


def child_logits(args):
    """Every position's logits of every prompt, concatenated: float32 [sum T, vocab]."""
    import llama_cpp as L
    prompts = json.load(open(args.tokens_file))
    model = llama_load(L, args.gguf, args.extra_bufts)
    n_vocab = L.llama_vocab_n_tokens(L.llama_model_get_vocab(model))
    tmax = max(len(p) for p in prompts)
    ctx = peer.context(L, model, tmax + 16, 1, tmax, args.threads)
    batch = L.llama_batch_init(tmax, 0, 1)
    out = np.empty((sum(len(p) for p in prompts), n_vocab), np.float32)
    row = 0
    for p in prompts:
        L.llama_memory_clear(L.llama_get_memory(ctx), True)
        llama_decode(L, ctx, batch, p, 0, True)
        out[row: row + len(p)] = np.ctypeslib.as_array(L.llama_get_logits(ctx), shape=(len(p), n_vocab))
        row += len(p)
    np.save(args.out, out)


def child_greedy(args):
    """Greedy generation from every held-out prompt: the generated ids, up to and including eos."""
    import llama_cpp as L
    items = [json.loads(line) for line in open(args.tokens_file)]
    model = llama_load(L, args.gguf, args.extra_bufts)
    n_vocab = L.llama_vocab_n_tokens(L.llama_model_get_vocab(model))
    eos = args.eos
    tmax = max(len(it["prompt_ids"]) for it in items) + MAX_NEW
    ctx = peer.context(L, model, tmax + 16, 1, tmax, args.threads)
    batch = L.llama_batch_init(tmax, 0, 1)
    gens = []
    for it in items:
        L.llama_memory_clear(L.llama_get_memory(ctx), True)
        p = it["prompt_ids"]
        llama_decode(L, ctx, batch, p, 0, False)
        gen = []
        while True:
            nxt = int(np.argmax(np.ctypeslib.as_array(L.llama_get_logits_ith(ctx, -1), shape=(n_vocab,))))
            gen.append(nxt)
            if nxt == eos or len(gen) == MAX_NEW:
                break
            llama_decode(L, ctx, batch, [nxt], len(p) + len(gen) - 1, False)
        gens.append(gen)
    json.dump(gens, open(args.out, "w"))


def run_child(mode, gguf, prompts_file, out, threads, extra_bufts, eos=0):
    cmd = [sys.executable, os.path.abspath(__file__), mode, "--gguf", gguf, "--tokens-file", prompts_file,
           "--out", out, "--threads", str(threads), "--eos", str(eos)] + (["--extra-bufts"] if extra_bufts else [])
    r = subprocess.run(cmd, stderr=subprocess.PIPE, text=True)
    if r.returncode != 0:
        tail = "\n".join(r.stderr.strip().splitlines()[-5:])
        return f"llama.cpp failed (exit status {r.returncode}): {tail}"
    return None


# ---------------------------------------------------------------------------------------------
# libgdn, through the CLI.

def gdn_logits(gdn, model_dir, prompts, quant, threads, work, lm_head=None):
    parts = []
    for p in prompts:
        with tempfile.NamedTemporaryFile(suffix=".npy", dir=work, delete=False) as f:
            path = f.name
        cmd = [gdn, "logits", model_dir, "--tokens", ",".join(map(str, p)), "--out", path, "--threads", str(threads)]
        if quant:
            cmd += ["--quant", quant]
        if lm_head:
            cmd += ["--lm-head-quant", lm_head]
        subprocess.run(cmd, check=True, stderr=subprocess.DEVNULL)
        parts.append(np.load(path))
        os.unlink(path)
    return np.concatenate(parts)


def gdn_exact_match(gdn, model_dir, items, quant, threads, lm_head=None):
    """`gdn generate` (greedy, libgdn's own tokenizer) on every held-out prompt; correct = the
    expected text, ended by the eos token (finish: stop_token)."""
    ok = 0
    for it in items:
        cmd = [gdn, "generate", model_dir, "--prompt", it["prompt"], "--max-tokens", str(MAX_NEW),
               "--threads", str(threads)] + (["--quant", quant] if quant else []) + \
              (["--lm-head-quant", lm_head] if lm_head else [])
        r = subprocess.run(cmd, capture_output=True, text=True, check=True)
        # the CLI ends the generated text with one "\n" of its own
        ok += r.stdout == it["expected"] + "\n" and "finish: stop_token" in r.stderr
    return ok


# ---------------------------------------------------------------------------------------------
# Figures.

def log_softmax(x):
    x = x.astype(np.float64)
    m = x.max(axis=-1, keepdims=True)
    return x - m - np.log(np.exp(x - m).sum(axis=-1, keepdims=True))


def compare(got, ref):
    """got vs ref ([positions, vocab]): errors relative to ref's RMS, top-1 agreement, mean KL."""
    scale = float(np.sqrt(np.mean(ref.astype(np.float64) ** 2)))
    d = (got.astype(np.float64) - ref)
    kl = []
    for s in range(0, len(ref), 64):  # in slices: a [384, 248320] float64 array is 760 MB
        lp, lq = log_softmax(ref[s: s + 64]), log_softmax(got[s: s + 64])
        kl.append((np.exp(lp) * (lp - lq)).sum(axis=-1))
    return {"rms": float(np.sqrt(np.mean(d * d))) / scale, "max": float(np.abs(d).max()) / scale,
            "top1": float(np.mean(got.argmax(-1) == ref.argmax(-1))), "kl": float(np.concatenate(kl).mean()),
            "logit_rms": scale, "positions": int(len(ref))}


def gguf_tensor_types(path):
    """Which ggml type holds each matrix, and the bits per weight over the matrices a token reads
    in full (the projections and the output; a tied token_embd is the output, an untied one is
    only looked up, one row a token, and is reported as "embedding")."""
    from gguf import GGUFReader
    tensors = GGUFReader(path).tensors
    untied = any(t.name == "output.weight" for t in tensors)
    counts, bits, n, embedding = {}, 0, 0, None
    for t in tensors:
        # norms, conv1d, ssm_a, biases: float32 in the GGUF and never quantised by llama.cpp
        if t.tensor_type.name == "F32" or len([s for s in t.shape if s > 1]) < 2:
            continue
        name = t.tensor_type.name
        if t.name == "token_embd.weight":
            embedding = name
            if untied:
                continue
        counts[name] = counts.get(name, 0) + 1
        bits += int(t.n_bytes) * 8
        n += int(t.n_elements)
    return {"types": counts, "embedding": embedding, "bits_per_weight": bits / n}


def gdn_bits(gguf_path, bits, lm_bits, more_bits=None):
    """libgdn's bits per weight over the matrices a token reads (the projections and the output),
    from the untied bf16 GGUF's shapes (GGUF names: attn_v, attn_qkv and ffn_down are the v_proj,
    the GDN in_proj_qkv and the down_proj q4_k_m gives more bits)."""
    from gguf import GGUFReader
    tensors = GGUFReader(gguf_path).tensors
    layers = 1 + max(int(t.name.split(".")[1]) for t in tensors if t.name.startswith("blk."))
    total = n = 0
    for t in tensors:
        if t.tensor_type.name == "F32" or len([s for s in t.shape if s > 1]) < 2 or t.name == "token_embd.weight":
            continue
        b = bits
        if t.name == "output.weight":
            b = lm_bits
        elif more_bits and t.name.startswith("blk.") and t.name.split(".")[2] in ("attn_v", "attn_qkv", "ffn_down") \
                and more_bits_layer(int(t.name.split(".")[1]), layers):
            b = more_bits
        if more_bits and b == 4.625 and int(t.shape[0]) % 256 != 0:  # GGUF shape[0]: the input columns
            b = 5.5
        total += b * int(t.n_elements)
        n += int(t.n_elements)
    return total / n


def llama_quantised(L, gguf_path, ftype, threads, out_type, embd_type):
    # (the all-format policy's files keep the name they were cached under)
    tag = "" if out_type is None else "-libgdn-policy" if out_type == {"Q8_0": GGML_Q8_0, "Q4_0": GGML_Q4_0}.get(ftype) \
        else "-libgdn-policy-output-q8_0"
    return peer.quantise(L, gguf_path, ftype, threads, out_type, embd_type, tag)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("mode", nargs="?", default="run", choices=["run", "llama-logits", "llama-greedy"])
    ap.add_argument("--gdn", default=os.path.join(HERE, "..", "build", "bin", "gdn"))
    ap.add_argument("--model", action="append", default=[], help="NAME=DIR (repeatable)")
    ap.add_argument("--work", default="/tmp/gdn-quant-accuracy", help="GGUFs and logits files")
    ap.add_argument("--threads", type=int, default=os.cpu_count())
    ap.add_argument("--prompts", type=int, default=4, help="random prompts (a model without eval/heldout.jsonl)")
    ap.add_argument("--prompt-tokens", type=int, default=96)
    ap.add_argument("--heldout-stride", type=int, default=8, help="every Nth held-out item's tokens")
    ap.add_argument("--exact-match", action="store_true", help="greedy held-out exact match (gdn-tiny)")
    ap.add_argument("--extra-bufts", action="store_true", help="let llama.cpp repack weights (AMX / interleaved)")
    ap.add_argument("--json")
    # the llama.cpp children
    ap.add_argument("--gguf")
    ap.add_argument("--tokens-file")
    ap.add_argument("--out")
    ap.add_argument("--eos", type=int, default=0)
    args = ap.parse_args()
    if args.mode == "llama-logits":
        return child_logits(args)
    if args.mode == "llama-greedy":
        return child_greedy(args)

    import llama_cpp as L
    os.makedirs(args.work, exist_ok=True)
    L.llama_backend_init()
    cpu = next((line.split(":", 1)[1].strip() for line in open("/proc/cpuinfo") if line.startswith("model name")), "?")
    results = {"threads": args.threads, "extra_bufts": args.extra_bufts, "cpu": cpu, "gdn": os.path.abspath(args.gdn),
               "llama_cpp_version": getattr(L, "__version__", "?"), "date": time.strftime("%Y-%m-%d"),
               "models": {}}
    for spec in args.model:
        name, model_dir = spec.split("=", 1)
        model_dir = os.path.abspath(model_dir)
        cfg = json.load(open(os.path.join(model_dir, "config.json")))
        cfg = {**cfg, **cfg.get("text_config", {})}
        eos = cfg.get("eos_token_id", 0)
        eos = eos if isinstance(eos, int) else eos[0]
        heldout_path = os.path.join(model_dir, "eval", "heldout.jsonl")
        heldout = [json.loads(line) for line in open(heldout_path)] if os.path.exists(heldout_path) else None
        if heldout:
            prompts = [it["prompt_ids"] + it["expected_ids"] for it in heldout[:: args.heldout_stride]]
            source = f"held-out items 0, {args.heldout_stride}, ...: prompt ids + expected answer ids (teacher-forced)"
        else:
            rng = np.random.default_rng(1)
            prompts = [rng.integers(0, min(cfg["vocab_size"], 150000), args.prompt_tokens).tolist()
                       for _ in range(args.prompts)]
            source = f"{args.prompts} prompts of {args.prompt_tokens} random ids (numpy default_rng(1))"
        prompts_file = os.path.join(args.work, f"{name}-prompts.json")
        json.dump(prompts, open(prompts_file, "w"))
        m = {"model_dir": model_dir, "tokens": source, "prompts": len(prompts),
             "positions": sum(map(len, prompts)), "libgdn": {}, "llama.cpp": {}}
        print(f"== {name}: {m['prompts']} prompts, {m['positions']} positions", file=sys.stderr)

        # libgdn
        ref = gdn_logits(args.gdn, model_dir, prompts, None, args.threads, args.work)
        for label, q, lm in GDN_QUANTS:
            m["libgdn"][label] = compare(gdn_logits(args.gdn, model_dir, prompts, q, args.threads, args.work, lm), ref)
            print(f"libgdn {label}: {m['libgdn'][label]}", file=sys.stderr)
        gdn_ref = ref

        # llama.cpp: the bf16 GGUF (the tokenizer.json beside the checkpoint, if any, else the
        # Qwen3.5 one convert_gguf.py defaults to), then its quantisations
        tok = os.path.join(model_dir, "tokenizer.json")
        tok = tok if os.path.exists(tok) else None
        bf16 = peer.convert(model_dir, os.path.join(args.work, f"{name}-bf16.gguf"), tok)
        bf16_untied = peer.convert(model_dir, os.path.join(args.work, f"{name}-untied-bf16.gguf"), tok, untie=True)
        for label, _, _ in GDN_QUANTS:
            m["libgdn"][label]["bits_per_weight"] = gdn_bits(bf16_untied, *GDN_BITS[label])
        out = os.path.join(args.work, f"{name}-logits.npy")
        err = run_child("llama-logits", bf16, prompts_file, out, args.threads, args.extra_bufts)
        if err:
            sys.exit(f"{name} bf16: {err}")
        ref = np.load(out)
        m["gdn_bf16_vs_llama_bf16"] = compare(ref, gdn_ref)
        print(f"llama.cpp bf16 vs libgdn bf16: {m['gdn_bf16_vs_llama_bf16']}", file=sys.stderr)
        del gdn_ref
        # The untied bf16 GGUF is the same model: checked, then its quantisations share the reference.
        err = run_child("llama-logits", bf16_untied, prompts_file, out, args.threads, args.extra_bufts)
        if err:
            sys.exit(f"{name} bf16 untied: {err}")
        m["llama_untied_vs_tied_bf16_max_abs"] = float(np.abs(np.load(out) - ref).max())
        print(f"llama.cpp bf16 untied vs tied: max |diff| {m['llama_untied_vs_tied_bf16_max_abs']}", file=sys.stderr)
        for label, ftype, untied, out_type, embd_type in LLAMA_QUANTS:
            qpath = llama_quantised(L, bf16_untied if untied else bf16, ftype, args.threads, out_type, embd_type)
            entry = gguf_tensor_types(qpath)
            err = run_child("llama-logits", qpath, prompts_file, out, args.threads, args.extra_bufts)
            if err:
                entry["error"] = err
            else:
                entry.update(compare(np.load(out), ref))
            m["llama.cpp"][label] = entry
            print(f"llama.cpp {label}: {entry}", file=sys.stderr)
        os.unlink(out)
        del ref

        if args.exact_match and heldout:
            items_file = os.path.join(args.work, f"{name}-heldout.jsonl")
            with open(items_file, "w") as f:
                for it in heldout:
                    f.write(json.dumps({"prompt_ids": it["prompt_ids"]}) + "\n")
            em = {"prompts": len(heldout), "libgdn": {}, "llama.cpp": {}}
            for label, q, lm in [("bf16", None, None)] + GDN_QUANTS:
                em["libgdn"][label] = gdn_exact_match(args.gdn, model_dir, heldout, q, args.threads, lm) / len(heldout)
                print(f"libgdn {label} exact match {em['libgdn'][label]:.4f}", file=sys.stderr)
            gen_out = os.path.join(args.work, f"{name}-greedy.json")
            for label, ftype, untied, out_type, embd_type in [("bf16", None, False, None, None)] + LLAMA_QUANTS:
                g = bf16 if ftype is None else llama_quantised(L, bf16_untied if untied else bf16, ftype,
                                                                args.threads, out_type, embd_type)
                err = run_child("llama-greedy", g, items_file, gen_out, args.threads, args.extra_bufts, eos)
                if err:
                    em["llama.cpp"][label] = err
                    continue
                gens = json.load(open(gen_out))
                em["llama.cpp"][label] = sum(g == it["expected_ids"] for g, it in zip(gens, heldout)) / len(heldout)
                print(f"llama.cpp {label} exact match {em['llama.cpp'][label]:.4f}", file=sys.stderr)
            m["exact_match"] = em
        results["models"][name] = m

    print_table(results)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=1)
            f.write("\n")


def print_table(results):
    print("| model | engine, format | matrices' bits/weight | RMS | max | top-1 agree | mean KL (nats) |")
    print("|---|---|---|---|---|---|---|")
    for name, m in results["models"].items():
        for label, r in m["libgdn"].items():
            bits, lm_bits, more = GDN_BITS[label]
            base = ("q4_k (q5_0 in rows not of whole super-blocks), q8_0 where Q4_K_M gives more bits" if more
                    else label.split(",")[0])
            types = f"{base} ×all" if bits == lm_bits and not more else \
                f"{base}; output {'q8_0' if lm_bits == 8.5 else label.split()[-1]}"
            print(f"| {name} | libgdn {label} | {r['bits_per_weight']:.2f} ({types}; embedding bf16) | {r['rms']:.4f} | "
                  f"{r['max']:.3f} | {r['top1']:.3f} | {r['kl']:.2e} |")
        for label, r in m["llama.cpp"].items():
            types = ", ".join(f"{k} ×{v}" for k, v in sorted(r["types"].items()))
            if "libgdn" in label:
                types += f"; embedding {r['embedding']}"
            if "error" in r:
                print(f"| {name} | llama.cpp {label} | {r['bits_per_weight']:.2f} ({types}) | {r['error']} | | | |")
            else:
                print(f"| {name} | llama.cpp {label} | {r['bits_per_weight']:.2f} ({types}) | {r['rms']:.4f} | "
                      f"{r['max']:.3f} | {r['top1']:.3f} | {r['kl']:.2e} |")
        c = m["gdn_bf16_vs_llama_bf16"]
        print(f"| {name} | llama.cpp bf16 vs libgdn bf16 | 16 | {c['rms']:.4f} | {c['max']:.3f} | {c['top1']:.3f} | {c['kl']:.2e} |")
    for name, m in results["models"].items():
        if "exact_match" in m:
            em = m["exact_match"]
            print(f"\n{name} held-out exact match ({em['prompts']} prompts): "
                  + "; ".join(f"libgdn {k} {v:.3f}" for k, v in em["libgdn"].items()) + "; "
                  + "; ".join(f"llama.cpp {k} {v if isinstance(v, str) else f'{v:.3f}'}" for k, v in em["llama.cpp"].items()))


if __name__ == "__main__":
    main()
