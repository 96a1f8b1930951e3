#!/usr/bin/env python3
"""The peer of `gdn bench`: llama.cpp (through llama-cpp-python) on the same weights.

Converts MODEL_DIR to a bf16 GGUF once (bench/convert_gguf.py, cached beside the checkpoint), then
measures with the same thread count and token counts as gdn bench:
  - prefill tokens/s for a --prompt-tokens prompt (one llama_decode call, n_batch = n_ubatch = prompt);
  - batch-1 decode tokens/s after that prompt (median of --runs runs after a warm-up run);
  - aggregate decode tokens/s at each --batches size (each sequence after a 64-token prompt);
  - optionally decode at each --contexts length (the sequence extended to each length in turn;
    --context-only measures nothing else);
  - peak RSS of this process.
With --quant it first quantises the bf16 GGUF with llama.cpp's own llama_model_quantize (Q8_0,
Q4_0 or Q4_K_M, cached beside it). PEER_NO_EXTRA_BUFTS=1 loads without llama.cpp's extra weight
buffer types (its AMX and interleaved repacks): llama-cpp-python 0.3.36 built with GGML_NATIVE on an
AMX host segfaults at the first decode of a quantised qwen35 model with them.
Prints one JSON object as its last line. It calls llama.cpp's C API directly (llama_decode on a
llama_batch), so no Python-side sampling or logits copies are timed.
"""

import argparse
import json
import os
import random
import resource
import statistics
import subprocess
import sys
import time


HERE = os.path.dirname(os.path.abspath(__file__))


def convert(model_dir, gguf_path, tokenizer=None, untie=False):
    """The bf16 GGUF of model_dir at gguf_path (bench/convert_gguf.py), converted once."""
    if os.path.exists(gguf_path):
        return gguf_path
    print(f"converting {model_dir} to {gguf_path} ...", file=sys.stderr)
    cmd = [sys.executable, os.path.join(HERE, "convert_gguf.py"), model_dir, gguf_path + ".tmp"]
    if tokenizer:
        cmd += ["--tokenizer", tokenizer]
    if untie:
        cmd += ["--untie"]
    subprocess.run(cmd, check=True)
    os.rename(gguf_path + ".tmp", gguf_path)
    return gguf_path


GGML_TYPE_BF16 = 30  # ggml.h; llama-cpp-python 0.3.36 does not export it


def quantise(L, gguf_path, quant, threads, output_type=None, embedding_type=None, tag=""):
    """llama.cpp's own quantiser (llama_model_quantize) on the bf16 GGUF: what a llama.cpp user runs
    at these bits. Cached beside it as <stem>-<quant><tag>.gguf. output_type / embedding_type (ggml
    type numbers) override llama.cpp's choice for output.weight / token_embd.weight (by default it
    gives the output, or a tied embedding, Q6_K or Q8_0 at 4 bits: llama_tensor_get_type)."""
    ftype = {"Q8_0": L.LLAMA_FTYPE_MOSTLY_Q8_0, "Q4_0": L.LLAMA_FTYPE_MOSTLY_Q4_0,
             "Q4_K_M": L.LLAMA_FTYPE_MOSTLY_Q4_K_M}[quant]
    qpath = gguf_path.replace("-bf16.gguf", "") + f"-{quant.lower()}{tag}.gguf"
    if not os.path.exists(qpath):
        print(f"quantising {gguf_path} to {qpath} ...", file=sys.stderr)
        qp = L.llama_model_quantize_default_params()
        qp.ftype = ftype
        qp.nthread = threads
        if output_type is not None:
            qp.output_tensor_type = output_type
        if embedding_type is not None:
            qp.token_embedding_type = embedding_type
        if L.llama_model_quantize(gguf_path.encode(), (qpath + ".tmp").encode(), qp) != 0:
            sys.exit("llama.cpp could not quantise " + gguf_path)
        os.rename(qpath + ".tmp", qpath)
    return qpath


def context(L, model, n_ctx, n_seq, n_batch, threads):
    """A llama.cpp context: n_batch = n_ubatch (one llama_decode runs the whole batch), the threads
    for decode and for batches alike."""
    cp = L.llama_context_default_params()
    cp.n_ctx = n_ctx
    cp.n_batch = n_batch
    cp.n_ubatch = n_batch
    cp.n_seq_max = n_seq
    cp.n_threads = threads
    cp.n_threads_batch = threads
    ctx = L.llama_init_from_model(model, cp)
    if not ctx:
        sys.exit("llama.cpp could not create a context")
    return ctx


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", required=True, help="checkpoint directory (config.json + safetensors)")
    ap.add_argument("--gguf", help="GGUF path (default: MODEL/model-bf16.gguf, converted if missing)")
    ap.add_argument("--threads", type=int, default=os.cpu_count())
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--decode-tokens", type=int, default=32)
    ap.add_argument("--prompt-tokens", type=int, default=512)
    ap.add_argument("--batches", default="1,2,4,8,16,32")
    ap.add_argument("--contexts", default="")
    ap.add_argument("--context-only", action="store_true", help="measure only the --contexts section")
    ap.add_argument("--quant", choices=["Q8_0", "Q4_0", "Q4_K_M"],
                    help="quantise the bf16 GGUF with llama.cpp's own llama_model_quantize (cached beside it)")
    args = ap.parse_args()

    gguf_path = args.gguf or os.path.join(args.model, "model-bf16.gguf")
    convert(args.model, gguf_path)

    import llama_cpp as L

    L.llama_backend_init()
    if args.quant:
        gguf_path = quantise(L, gguf_path, args.quant, args.threads)
    mp = L.llama_model_default_params()
    mp.use_mmap = True
    if os.environ.get("PEER_NO_EXTRA_BUFTS"):
        mp.use_extra_bufts = False  # no repacked (AMX / interleaved) weight buffers
    model = L.llama_model_load_from_file(gguf_path.encode(), mp)
    if not model:
        sys.exit("llama.cpp could not load " + gguf_path)
    vocab = L.llama_model_get_vocab(model)
    n_vocab = L.llama_vocab_n_tokens(vocab)

    T, P, N, R = args.threads, args.prompt_tokens, args.decode_tokens, args.runs
    rng = random.Random(1)
    prompt = [rng.randrange(0, min(n_vocab, 150000)) for _ in range(P)]

    def make_ctx(n_ctx, n_seq, n_batch):
        return context(L, model, n_ctx, n_seq, n_batch, T)

    def decode(ctx, batch, entries):
        """entries: list of (token, pos, seq, want_logits)"""
        batch.n_tokens = len(entries)
        for i, (tok, pos, seq, lg) in enumerate(entries):
            batch.token[i] = tok
            batch.pos[i] = pos
            batch.n_seq_id[i] = 1
            batch.seq_id[i][0] = seq
            batch.logits[i] = 1 if lg else 0
        rc = L.llama_decode(ctx, batch)
        if rc != 0:
            sys.exit(f"llama_decode returned {rc}")
        L.llama_synchronize(ctx)

    def clear(ctx):
        L.llama_memory_clear(L.llama_get_memory(ctx), True)

    def prefill(ctx, batch, tokens, seq=0, n_batch=512):
        for s in range(0, len(tokens), n_batch):
            chunk = tokens[s: s + n_batch]
            decode(ctx, batch, [(t, s + i, seq, s + i == len(tokens) - 1) for i, t in enumerate(chunk)])

    out = {"engine": "llama.cpp", "version": getattr(L, "__version__", "?"), "gguf": gguf_path, "threads": T}

    if not args.context_only:
        # Batch 1: prefill P tokens, then decode N.
        ctx = make_ctx(P + N * (R + 1) + 16, 1, max(P, 1))
        batch = L.llama_batch_init(max(P, 64), 0, 1)
        pre, dec = [], []
        for r in range(R + 1):
            clear(ctx)
            t0 = time.perf_counter()
            prefill(ctx, batch, prompt, 0, max(P, 1))
            tp = time.perf_counter() - t0
            t0 = time.perf_counter()
            for s in range(N):
                decode(ctx, batch, [((s * 7919) % 150000, P + s, 0, True)])
            td = time.perf_counter() - t0
            if r > 0:
                pre.append(P / tp)
                dec.append(N / td)
        out["prefill"] = {"tok_s": statistics.median(pre), "runs": pre, "tokens": P}
        out["decode"] = {"tok_s": statistics.median(dec), "runs": dec, "tokens": N, "context": P}
        out["peak_rss_bytes_batch1"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
        print(f"llama.cpp prefill {out['prefill']['tok_s']:.1f} tok/s, decode {out['decode']['tok_s']:.2f} tok/s",
              file=sys.stderr)
        L.llama_batch_free(batch)
        L.llama_free(ctx)

        batches = [int(b) for b in args.batches.split(",") if b]
        if batches:
            maxb = max(batches)
            short = min(P, 64)
            per_seq = short + N * (R + 1) + 16
            ctx = make_ctx(per_seq * maxb, maxb, max(short * 4, maxb, 64))
            batch = L.llama_batch_init(max(short * 4, maxb, 64), 0, 1)
            rows = []
            for B in batches:
                agg = []
                clear(ctx)
                for b in range(B):
                    prefill(ctx, batch, prompt[:short], b, max(short * 4, 64))
                pos = short
                for r in range(R + 1):
                    t0 = time.perf_counter()
                    for s in range(N):
                        decode(ctx, batch, [((s * 7919 + b * 104729) % 150000, pos, b, True) for b in range(B)])
                        pos += 1
                    td = time.perf_counter() - t0
                    if r > 0:
                        agg.append(B * N / td)
                rows.append({"batch": B, "tok_s": statistics.median(agg), "runs": agg})
                print(f"llama.cpp batch {B}: {rows[-1]['tok_s']:.2f} tok/s", file=sys.stderr)
            out["batch_decode"] = rows
            L.llama_batch_free(batch)
            L.llama_free(ctx)

    contexts = sorted(int(c) for c in args.contexts.split(",") if c)
    if contexts:
        # One sequence extended to each length in turn (a prefill of the difference), then R runs
        # of N single steps; the runs advance it too.
        maxc = max(contexts)
        ctx = make_ctx(maxc + N * (R * len(contexts) + 1) + 16, 1, 512)
        batch = L.llama_batch_init(512, 0, 1)
        rows = []
        clear(ctx)
        pos = 0
        for C in contexts:
            tp, added = 0.0, 0
            if C > pos:
                toks = [rng.randrange(0, 150000) for _ in range(C - pos)]
                t0 = time.perf_counter()
                for s in range(0, len(toks), 512):
                    chunk = toks[s: s + 512]
                    decode(ctx, batch, [(t, pos + s + i, 0, s + i == len(toks) - 1) for i, t in enumerate(chunk)])
                tp = time.perf_counter() - t0
                added = C - pos
                pos = C
            d = []
            for r in range(R + (1 if C == contexts[0] else 0)):  # a warm-up run at the first length
                t0 = time.perf_counter()
                for s in range(N):
                    decode(ctx, batch, [((s * 7919) % 150000, pos, 0, True)])
                    pos += 1
                d.append(N / (time.perf_counter() - t0))
            d = d[-R:]
            rows.append({"context": C, "tok_s": statistics.median(d), "runs": d,
                         "prefill_tok_s": added / tp if added else 0.0})
            print(f"llama.cpp context {C}: {rows[-1]['tok_s']:.2f} tok/s", file=sys.stderr)
        out["context_decode"] = rows
        L.llama_batch_free(batch)
        L.llama_free(ctx)

    out["peak_rss_bytes"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    L.llama_model_free(model)
    print(json.dumps(out))


if __name__ == "__main__":
    main()
