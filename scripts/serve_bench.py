#!/usr/bin/env python3
"""Figures for gdn serve (docs/server.md), on the random-weight Qwen3.5-0.8B-shaped checkpoint that
`gdn bench --shape 0.8b` writes (plus a random MTP head for the MTP runs) and on models/gdn-tiny:

  1. aggregate decode tokens/s at concurrency 1, 4, 16 against offline `gdn bench` at the same batch,
     server and offline measured in alternation, --rounds times (medians);
  2. time to first token for a chat whose 2,000-token system prompt is cached, against a cold one;
  3. adaptive MTP (--mtp 2) against plain decoding (--mtp 0), alternating, at each concurrency: on the
     0.8B shape with a random MTP head (acceptance ~0: adaptive k must fall back and cost nothing) and on
     gdn-tiny (trained, high acceptance);
  4. the memory a cached prefix and a running request hold, from the server's own figures.

A benchmark, not a test: it takes 15-20 minutes on 2 cores and writes its results as JSON.
    scripts/serve_bench.py [--gdn build/bin/gdn] [--rounds 3] [--out docs/bench-results/serve-0.8b.json]
Needs the gdn Python module (build/python-site, made by the test suite's python_pip_install) for token counts.
"""

import argparse
import gzip
import http.client
import json
import os
import pathlib
import random
import re
import shutil
import signal
import statistics
import struct
import subprocess
import sys
import threading
import time

ROOT = pathlib.Path(__file__).resolve().parents[1]
# gdn-tiny's own tasks (copy, reverse, add): what its MTP head was trained to draft.
TINY_PROMPTS = [json.loads(line)["prompt"] for line in open(ROOT / "models/gdn-tiny/eval/heldout.jsonl")][:100]


def log(*a):
    print(*a, file=sys.stderr, flush=True)


# --- checkpoints -----------------------------------------------------------------------------------

def ensure_models(gdn, cache):
    base = cache / "qwen3.5-0.8b"
    if not (base / "model.safetensors").exists():
        log("writing the random-weight 0.8B checkpoint (gdn bench --shape 0.8b --quick) ...")
        subprocess.run([gdn, "bench", "--shape", "0.8b", "--quick", "--cache", str(cache), "--stream-mib", "64",
                        "--batches", "1", "--contexts", "64"], check=True, stdout=subprocess.DEVNULL)
    tok = gzip.decompress((ROOT / "tests/assets/qwen35_tokenizer/tokenizer.json.gz").read_bytes())
    if not (base / "tokenizer.json").exists():
        (base / "tokenizer.json").write_bytes(tok)
    # The same weights with a random MTP head: a sharded checkpoint whose index points at the base file
    # and at mtp.safetensors.
    mtp = cache / "qwen3.5-0.8b-mtp"
    if not (mtp / "mtp.safetensors").exists():
        mtp.mkdir(parents=True, exist_ok=True)
        cfg = json.loads((base / "config.json").read_text())
        cfg["mtp_num_hidden_layers"] = 1
        cfg["mtp_use_dedicated_embeddings"] = False
        (mtp / "config.json").write_text(json.dumps(cfg, indent=2))
        (mtp / "tokenizer.json").write_bytes(tok)
        link = mtp / "base.safetensors"
        if not link.exists():
            link.symlink_to((base / "model.safetensors").resolve())
        H, qh, kvh, hd, ffn = cfg["hidden_size"], cfg["num_attention_heads"], cfg["num_key_value_heads"], cfg["head_dim"], \
            cfg["intermediate_size"]
        tensors = {"mtp.fc.weight": [H, 2 * H], "mtp.pre_fc_norm_embedding.weight": [H], "mtp.pre_fc_norm_hidden.weight": [H],
                   "mtp.norm.weight": [H]}
        p = "mtp.layers.0."
        tensors.update({p + "input_layernorm.weight": [H], p + "post_attention_layernorm.weight": [H],
                        p + "self_attn.q_proj.weight": [2 * qh * hd, H], p + "self_attn.k_proj.weight": [kvh * hd, H],
                        p + "self_attn.v_proj.weight": [kvh * hd, H], p + "self_attn.o_proj.weight": [H, qh * hd],
                        p + "self_attn.q_norm.weight": [hd], p + "self_attn.k_norm.weight": [hd],
                        p + "mlp.gate_proj.weight": [ffn, H], p + "mlp.up_proj.weight": [ffn, H],
                        p + "mlp.down_proj.weight": [H, ffn]})
        write_random_safetensors(mtp / "mtp.safetensors", tensors)
        header_len = struct.unpack("<Q", (base / "model.safetensors").open("rb").read(8))[0]
        with (base / "model.safetensors").open("rb") as f:
            f.seek(8)
            base_names = [k for k in json.loads(f.read(header_len)) if k != "__metadata__"]
        weight_map = {k: "base.safetensors" for k in base_names}
        weight_map.update({k: "mtp.safetensors" for k in tensors})
        (mtp / "model.safetensors.index.json").write_text(json.dumps({"metadata": {}, "weight_map": weight_map}))
    return base, mtp


def write_random_safetensors(path, tensors):
    import numpy as np
    rng = np.random.default_rng(7)
    header, blobs, off = {}, [], 0
    for name, shape in tensors.items():
        n = int(np.prod(shape))
        if len(shape) == 1:  # (1 + w) norms: zeros
            v = np.zeros(n, dtype=np.float32)
        else:
            v = rng.uniform(-0.02 * 3 ** 0.5, 0.02 * 3 ** 0.5, n).astype(np.float32)
        b = (v.view(np.uint32) >> 16).astype(np.uint16).tobytes()  # bf16 by truncation
        header[name] = {"dtype": "BF16", "shape": shape, "data_offsets": [off, off + len(b)]}
        blobs.append(b)
        off += len(b)
    h = json.dumps(header).encode()
    h += b" " * ((8 - len(h) % 8) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(h)))
        f.write(h)
        for b in blobs:
            f.write(b)


# --- the server --------------------------------------------------------------------------------------

class Server:
    def __init__(self, gdn, model, *args):
        self.proc = subprocess.Popen([gdn, "serve", str(model), "--port", "0", *args], stdout=subprocess.PIPE,
                                     stderr=subprocess.PIPE, text=True)
        self.port = int(re.search(r":(\d+) ", self.proc.stdout.readline()).group(1))
        self.ready_line = self.proc.stdout.readline()  # "ready: ..." once loaded
        if "ready" not in self.ready_line:
            raise RuntimeError(self.proc.stderr.read())

    def figures(self):
        m = re.search(r"\(([\d.]+) MiB GDN state per snapshot, (\d+) bytes KV per token\)", self.ready_line)
        return {"snapshot_mib": float(m.group(1)), "kv_bytes_per_token": int(m.group(2))}

    def metrics(self):
        c = http.client.HTTPConnection("127.0.0.1", self.port, timeout=30)
        c.request("GET", "/metrics")
        out = {}
        for line in c.getresponse().read().decode().splitlines():
            if line and not line.startswith("#"):
                k, v = line.rsplit(" ", 1)
                out[k] = float(v)
        return out

    def stop(self):
        self.proc.send_signal(signal.SIGTERM)
        self.proc.wait(timeout=60)


def stream(port, path, body, on_tokens, stop_flag=None):
    """POSTs a streaming request with usage in every chunk (stream_options.continuous_usage_stats) and calls
    on_tokens(time, n) for each chunk that brought n new tokens. Returns the final usage."""
    body = {**body, "stream": True, "stream_options": {"include_usage": True, "continuous_usage_stats": True}}
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=600)
    c.request("POST", path, json.dumps(body), {"Content-Type": "application/json"})
    r = c.getresponse()
    buf, usage, seen = b"", None, 0
    while True:
        chunk = r.read1(65536)
        if not chunk:
            break
        buf += chunk
        while b"\n\n" in buf:
            ev, buf = buf.split(b"\n\n", 1)
            if not ev.startswith(b"data: "):
                continue
            if ev[6:] == b"[DONE]":
                c.close()
                return usage
            j = json.loads(ev[6:])
            if j.get("usage"):
                usage = j["usage"]
                n = usage["completion_tokens"] - seen
                if n > 0:
                    seen = usage["completion_tokens"]
                    on_tokens(time.perf_counter(), n)
        if stop_flag is not None and stop_flag.is_set():
            c.close()
            return usage
    return usage


async def _load_client(port, bodies, stream, stop):
    """One client: requests back to back, each on its own connection (Connection: close, so a response ends
    at EOF). The client only reads bytes: no JSON or SSE parsing per token, so it costs the cores the server
    runs on next to nothing. Tokens are counted by the server (/metrics), not here."""
    import asyncio
    while not stop.is_set():
        body = json.dumps({**next(bodies), "stream": stream}).encode()
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(b"POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
                     b"Connection: close\r\nContent-Length: " + str(len(body)).encode() + b"\r\n\r\n" + body)
        await writer.drain()
        head = await reader.read(12)
        if not head.startswith(b"HTTP/1.1 200"):
            raise RuntimeError(f"request failed: {head + await reader.read()!r}")
        while await reader.read(1 << 16):
            pass
        writer.close()


def generated_tokens(port):
    """The server's count of generated tokens; raises if any request failed (a figure must not hide errors)."""
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    c.request("GET", "/metrics")
    text = c.getresponse().read().decode()
    c.close()
    failed = float(re.search(r'^gdn_requests_total\{outcome="failed"\} (\S+)$', text, re.M).group(1))
    if failed:
        raise RuntimeError(f"{failed:.0f} requests failed on the server")
    return float(re.search(r"^gdn_generation_tokens_total (\S+)$", text, re.M).group(1))


def throughput(port, concurrency, seconds, warmup, max_tokens=64, prompt_len=8, seed=0, vocab=(1000, 150000), prompts=None,
               stream=True):
    """`concurrency` clients loop on completions (asyncio, one thread); tokens/s over a window after a warm-up,
    counted by the server's gdn_generation_tokens_total (every generated token, whoever asked for it)."""
    import asyncio
    import itertools

    rng = random.Random(seed)

    def bodies():
        for _ in itertools.count():
            if prompts:
                yield {"prompt": rng.choice(prompts), "max_tokens": max_tokens, "temperature": 0}
            else:
                yield {"prompt": [rng.randrange(*vocab) for _ in range(prompt_len)], "max_tokens": max_tokens,
                       "ignore_eos": True, "temperature": 0}

    result = {}

    async def run():
        stop = asyncio.Event()
        gen = bodies()
        tasks = [asyncio.create_task(_load_client(port, gen, stream, stop)) for _ in range(concurrency)]
        await asyncio.sleep(warmup)
        loop = asyncio.get_running_loop()
        n0, t0 = await loop.run_in_executor(None, generated_tokens, port), time.perf_counter()
        await asyncio.sleep(seconds)
        n1, t1 = await loop.run_in_executor(None, generated_tokens, port), time.perf_counter()
        result["tok_s"] = (n1 - n0) / (t1 - t0)
        stop.set()
        for t in tasks:  # hang up: the server frees those slots within a step
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    asyncio.run(run())
    return result["tok_s"]


def offline_bench(gdn, model, batches, runs, tokens):
    out = pathlib.Path("/tmp/serve_bench_offline.json")
    subprocess.run([gdn, "bench", "--model", str(model), "--batches", ",".join(map(str, batches)), "--runs", str(runs),
                    "--decode-tokens", str(tokens), "--contexts", "512", "--prompt-tokens", "64", "--float32-only",
                    "--stream-mib", "256", "--json", str(out)], check=True, stdout=subprocess.DEVNULL)
    j = json.loads(out.read_text())
    return {row["batch"]: row["tok_s"] for row in j["batch_decode"]}


def ttft(port, messages, max_tokens=2):
    t0 = time.perf_counter()
    first = []
    usage = stream(port, "/v1/chat/completions", {"messages": messages, "max_tokens": max_tokens, "temperature": 0},
                   lambda t, n: first.append(t))
    return first[0] - t0, usage


# --- main --------------------------------------------------------------------------------------------

def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--gdn", default=str(ROOT / "build/bin/gdn"))
    ap.add_argument("--cache", default=str(ROOT / "build/bench-models"))
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--seconds", type=float, default=20.0)
    ap.add_argument("--concurrency", default="1,4,16")
    ap.add_argument("--out", default=str(ROOT / "docs/bench-results/serve-0.8b.json"))
    ap.add_argument("--threads", default="0")
    ap.add_argument("--parts", default="throughput,mtp,tiny,ttft",
                    help="which figures: throughput (server vs gdn bench), mtp (0.8B, random head), tiny (gdn-tiny MTP), ttft")
    ap.add_argument("--client", choices=["stream", "whole"], default="stream",
                    help="throughput clients: streamed responses (the server formats an event per token) or whole ones")
    ap.add_argument("--tiny-seconds", type=float, default=8.0)
    # One thread: a gdn-tiny step takes ~0.1 ms, so on a shared machine a two-thread pool waiting for a
    # descheduled worker (a scheduler tick, ms) would measure the machine's other load, not the server.
    ap.add_argument("--tiny-threads", default="1")
    ap.add_argument("--max-tokens", type=int, default=64, help="tokens per throughput request (after an 8-token prompt)")
    ap.add_argument("--lock", help="a file to flock around each pair of measurements (a machine shared with other "
                                   "benchmarks: each pair runs alone, and others run between pairs)")
    args = ap.parse_args()
    parts = set(args.parts.split(","))
    sys.path.insert(0, str(ROOT / "build/python-site"))

    base, mtp_model = ensure_models(args.gdn, pathlib.Path(args.cache))
    conc = [int(x) for x in args.concurrency.split(",")]
    res = {"model": str(base), "rounds": args.rounds, "seconds": args.seconds, "concurrency": conc, "client": args.client,
           "loadavg_start": os.getloadavg()[0], "throughput": {}, "mtp": {}, "ttft": {}, "memory": {}}
    common = ["--threads", args.threads, "--max-context", "1024", "--max-sequences", str(max(conc))]
    stream_mode = args.client == "stream"

    # 1 + 3: throughput, server vs offline, and MTP vs plain, each pair measured back to back within a round,
    # in alternating order (even rounds: the reference first; odd rounds: the other first).
    tp = {c: {"server": [], "offline": []} for c in conc}
    mt = {c: {"plain": [], "mtp": []} for c in conc}
    tiny = {c: {"plain": [], "mtp": []} for c in (1, 4)}

    def server_throughput(r):
        s = Server(args.gdn, base, *common, "--cache-bytes", "256M")
        res["memory"]["0.8b"] = s.figures()
        try:
            return {c: throughput(s.port, c, args.seconds, 3.0, max_tokens=args.max_tokens, seed=r, stream=stream_mode)
                    for c in conc}
        finally:
            s.stop()

    def mtp_throughput(model, mode, c, r, extra, seconds, warmup, **kw):
        s = Server(args.gdn, model, *extra, "--mtp", "2" if mode == "mtp" else "0")
        try:
            tok_s = throughput(s.port, c, seconds, warmup, seed=r, stream=stream_mode, **kw)
            m = s.metrics()
            return tok_s, m["gdn_mtp_draft_tokens_total"], m["gdn_mtp_accepted_tokens_total"]
        finally:
            s.stop()

    import contextlib
    import fcntl

    @contextlib.contextmanager
    def alone():
        if not args.lock:
            yield
            return
        with open(args.lock, "a") as f:
            fcntl.flock(f, fcntl.LOCK_EX)
            try:
                yield
            finally:
                fcntl.flock(f, fcntl.LOCK_UN)

    for r in range(args.rounds):
        first = ("plain", "mtp") if r % 2 == 0 else ("mtp", "plain")
        if "throughput" in parts:
            # gdn bench (every batch) and the server (every concurrency) back to back, in alternating order.
            with alone():
                for which in (("offline", "server") if r % 2 == 0 else ("server", "offline")):
                    got = offline_bench(args.gdn, base, conc, 3, 16) if which == "offline" else server_throughput(r)
                    for c in conc:
                        tp[c][which].append(got[c])
            for c in conc:
                log(f"round {r + 1}: concurrency {c}: server {tp[c]['server'][-1]:.2f} tok/s, offline "
                    f"{tp[c]['offline'][-1]:.2f} ({tp[c]['server'][-1] / tp[c]['offline'][-1]:.3f})")
        def mtp_pair(store, c, label, model, seed, extra, seconds, warm, **kw):
            """Plain and adaptive MTP back to back (the round's order), alone on the machine."""
            with alone():
                for mode in first:
                    tok_s, drafted, accepted = mtp_throughput(model, mode, c, seed, extra, seconds, warm, **kw)
                    store[c][mode].append(tok_s)
                    if mode == "mtp":
                        store[c].setdefault("drafted", []).append(drafted)
                        store[c].setdefault("accepted", []).append(accepted)
            log(f"round {r + 1}: {label}, concurrency {c}: plain {store[c]['plain'][-1]:.2f}, adaptive mtp "
                f"{store[c]['mtp'][-1]:.2f} tok/s ({store[c]['mtp'][-1] / store[c]['plain'][-1]:.3f})")

        for c in conc if "mtp" in parts else []:
            mtp_pair(mt, c, "0.8b+mtp head", mtp_model, 100 + r, [*common, "--cache-bytes", "256M"], args.seconds, 3.0)
        for c in tiny if "tiny" in parts else []:
            mtp_pair(tiny, c, "gdn-tiny", ROOT / "models/gdn-tiny", 200 + r,
                     ["--threads", args.tiny_threads, "--max-sequences", "16", "--cache-bytes", "64M"],
                     args.tiny_seconds, 1.0, max_tokens=16, prompts=TINY_PROMPTS)

    def med(v):
        return statistics.median(v) if v else 0.0

    def ratios(a, b):
        return [x / y for x, y in zip(a, b) if y > 0]

    for c in conc:
        rt = ratios(tp[c]["server"], tp[c]["offline"])
        res["throughput"][c] = {"server_tok_s": tp[c]["server"], "offline_tok_s": tp[c]["offline"], "ratios": rt,
                                "ratio_median": med(rt)}
        rm = ratios(mt[c]["mtp"], mt[c]["plain"])
        res["mtp"][c] = {**mt[c], "ratios": rm, "ratio_median": med(rm)}
    res["mtp_tiny"] = {}
    for c in tiny:
        rm = ratios(tiny[c]["mtp"], tiny[c]["plain"])
        res["mtp_tiny"][c] = {**tiny[c], "ratios": rm, "ratio_median": med(rm)}

    # 2. Time to first token behind a 2,000-token system prompt, cold and cached.
    if "ttft" in parts:
        run_ttft(args, base, res, med)
    res["loadavg_end"] = os.getloadavg()[0]
    pathlib.Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    pathlib.Path(args.out).write_text(json.dumps(res, indent=1) + "\n")

    def spread(v):
        return f"{min(v):.2f}-{max(v):.2f}" if v else "-"

    print(f"clients: {args.client}")
    print("| concurrency | gdn serve tok/s | gdn bench tok/s | ratio (median) | ratios of the rounds |")
    print("|---|---|---|---|---|")
    for c in conc if "throughput" in parts else []:
        t = res["throughput"][c]
        print(f"| {c} | {med(t['server_tok_s']):.2f} | {med(t['offline_tok_s']):.2f} | {t['ratio_median']:.2f} | "
              f"{', '.join(f'{x:.2f}' for x in t['ratios'])} |")
    print()
    print("| | plain tok/s | adaptive MTP tok/s | ratio (median) | ratios of the rounds | drafted / accepted |")
    print("|---|---|---|---|---|---|")
    for name, table in (("0.8b+random MTP", res["mtp"] if "mtp" in parts else {}),
                        ("gdn-tiny", res["mtp_tiny"] if "tiny" in parts else {})):
        for c, m in table.items():
            print(f"| {name}, concurrency {c} | {med(m['plain']):.2f} | {med(m['mtp']):.2f} | {m['ratio_median']:.3f} | "
                  f"{', '.join(f'{x:.3f}' for x in m['ratios'])} | {med(m.get('drafted', [0])):.0f} / "
                  f"{med(m.get('accepted', [0])):.0f} |")
    if "ttft" in parts:
        t = res["ttft"]
        print(f"\nTTFT cold {t['cold_median_s'] * 1000:.0f} ms, cache hit {t['hit_median_s'] * 1000:.0f} ms: "
              f"{t['speedup']:.1f}x (cached tokens {t['hit_cached_tokens']})")


def run_ttft(args, base, res, med):
    import gdn as gdnpy
    tok = gdnpy.Tokenizer.from_file(str(base / "tokenizer.json"))
    words = ("the of and to in is for on with as by at from that this are be or an it was which but not have has "
             "been more can will about their other after first new also into time years two may some only").split()
    cold, hit, cached = [], [], []
    s = Server(args.gdn, base, "--threads", args.threads, "--max-context", "4096", "--max-sequences", "2", "--cache-bytes", "1G")
    for r in range(args.rounds):
        rng = random.Random(1000 + r)
        system = ""
        while len(tok.encode(system)) < 2000:
            system += "".join(" " + rng.choice(words) for _ in range(25))
        for q in range(4):
            messages = [{"role": "system", "content": system}, {"role": "user", "content": f"Question {q}: what is {r}+{q}?"}]
            t, usage = ttft(s.port, messages)
            (cold if q == 0 else hit).append(t)
            if r == 0 and q == 0:
                # What one cached conversation costs, as the cache charges it: every snapshot the cold request
                # left (interval points, the turn boundary, the prompt's end, the generation's end).
                m = s.metrics()
                res["memory"]["one_2k_prefix"] = {"cache_bytes": m["gdn_prefix_cache_bytes"],
                                                  "snapshots": m["gdn_prefix_cache_snapshots"],
                                                  "prompt_tokens": usage["prompt_tokens"]}
            if q > 0:
                cached.append(usage["prompt_tokens_details"]["cached_tokens"])
            log(f"  ttft round {r + 1} request {q}: {t * 1000:.0f} ms, {usage['prompt_tokens']} prompt tokens, "
                f"{usage['prompt_tokens_details']['cached_tokens']} cached")
    s.stop()
    res["ttft"] = {"cold_s": cold, "hit_s": hit, "hit_cached_tokens": cached, "cold_median_s": med(cold),
                   "hit_median_s": med(hit), "speedup": med(cold) / med(hit)}


if __name__ == "__main__":
    main()
