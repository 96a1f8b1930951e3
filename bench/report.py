#!/usr/bin/env python3
"""Prints the markdown tables of docs/performance.md from a `gdn bench --json` result.

usage: report.py BENCH.json
"""
import json
import sys


def main():
    r = json.load(open(sys.argv[1]))
    p = r.get("llama_cpp") if isinstance(r.get("llama_cpp"), dict) and "decode" in r.get("llama_cpp", {}) else None
    roof = r["roofline_tok_s"]
    d, pf = r["decode"]["tok_s"], r["prefill"]["tok_s"]
    print(f"Read bandwidth {r['bandwidth']['median_gb_s']:.2f} GB/s (median; best {r['bandwidth']['best_gb_s']:.2f}), "
          f"{r['weight_bytes_per_token'] / 1e6:.1f} MB of weights per token, roofline {roof:.2f} tok/s; "
          f"{r['threads']} threads, kernel `{r['kernel']}`; load average {r.get('loadavg_start', 0):.1f} at start, "
          f"{r.get('loadavg_end', 0):.1f} at the end of our part, {r.get('loadavg_after_peer', 0):.1f} after the peer.\n")
    print("| measure | libgdn | llama.cpp | libgdn / llama.cpp | target | met |")
    print("|---|---|---|---|---|---|")

    def row(name, ours, theirs, target, ok):
        ratio = f"{ours / theirs:.2f}×" if theirs else "–"
        print(f"| {name} | {ours_fmt(ours)} | {ours_fmt(theirs) if theirs else '–'} | {ratio} | {target} | {ok} |")

    def ours_fmt(v):
        return f"{v:.2f}" if v < 100 else f"{v:.0f}"

    ld = p["decode"]["tok_s"] if p else None
    lp = p["prefill"]["tok_s"] if p else None
    row("decode, batch 1 (tok/s)", d, ld, "≥ 1.3× llama.cpp", ("yes" if ld and d / ld >= 1.3 else "no") if ld else "–")
    print(f"| decode, batch 1, fraction of roofline | {100 * d / roof:.0f}% | "
          f"{f'{100 * ld / roof:.0f}%' if ld else '–'} | | ≥ 90% | {'yes' if d / roof >= 0.9 else 'no'} |")
    row(f"prefill, {r['prefill']['tokens']} tokens (tok/s)", pf, lp, "≥ 1.2× llama.cpp",
        ("yes" if lp and pf / lp >= 1.2 else "no") if lp else "–")
    if "batch_decode" in r:
        base = next((x["tok_s"] for x in r["batch_decode"] if x["batch"] == 1), None)
        pb = {x["batch"]: x["tok_s"] for x in (p or {}).get("batch_decode", [])}
        for x in r["batch_decode"]:
            B = x["batch"]
            tgt = "≥ 8× batch 1" if B == 16 else ""
            ok = ("yes" if base and x["tok_s"] / base >= 8 else "no") if B == 16 else ""
            scale = f" ({x['tok_s'] / base:.1f}× batch 1)" if base else ""
            theirs = pb.get(B)
            t_s = f"{theirs:.2f}" if theirs else "–"
            t_r = f"{x['tok_s'] / theirs:.2f}×" if theirs else "–"
            print(f"| decode, batch {B}, aggregate (tok/s) | {x['tok_s']:.2f}{scale} | {t_s} | {t_r} | {tgt} | {ok} |")
    if "context_decode" in r:
        for x in r["context_decode"]:
            print(f"| decode at context {x['context']} (ms/token) | {x['ms_per_token']:.0f} | – | | | |")
    a = r["heap_allocations"]
    print(f"| heap allocations per decode step | {a['per_step']:.0f} ({a['total']} in {a['decode_steps']} steps) | – | | 0 | "
          f"{'yes' if a['total'] == 0 else 'no'} |")
    peer_rss = f"{p['peak_rss_bytes_batch1'] / 2**20:.0f} / {p['peak_rss_bytes'] / 2**20:.0f}" if p else "–"
    print(f"| peak RSS (MiB), batch-1 runs / whole run | {r['peak_rss_bytes_batch1'] / 2**20:.0f} / "
          f"{r['peak_rss_bytes'] / 2**20:.0f} | {peer_rss} | | | |")
    print(f"| state per sequence | {r['gdn_state_bytes_per_sequence'] / 1e6:.2f} MB GDN + {r['kv_bytes_per_token']} B KV per token | | | | |")


if __name__ == "__main__":
    main()
