#!/usr/bin/env python3
"""Prints the markdown tables of docs/performance.md from a `gdn bench --json` result.

usage: report.py BENCH.json

libgdn appears twice where the run measured both: with float32 matmul inputs (the default, exact)
and with bf16 matmul inputs (ContextParams::matmul_input), which is how llama.cpp runs bf16 weights.
"""
import json
import sys


def fmt(v):
    return "–" if v is None else (f"{v:.2f}" if v < 100 else f"{v:.0f}")


def ratio(a, b):
    return f"{a / b:.2f}×" if a and b else "–"


def main():
    r = json.load(open(sys.argv[1]))
    peer = r.get("llama_cpp") if isinstance(r.get("llama_cpp"), dict) and "decode" in r.get("llama_cpp", {}) else None
    bf = r.get("bf16_inputs")
    roof = r["roofline_tok_s"]
    print(f"Read bandwidth {r['bandwidth']['median_gb_s']:.2f} GB/s (median; best {r['bandwidth']['best_gb_s']:.2f}), "
          f"{r['weight_bytes_per_token'] / 1e6:.1f} MB of weights per token, roofline {roof:.2f} tok/s; "
          f"{r['threads']} threads, kernel `{r['kernel']}`; load average {r.get('loadavg_start', 0):.1f} at start, "
          f"{r.get('loadavg_end', 0):.1f} at the end of our part, {r.get('loadavg_after_peer', 0):.1f} after the peer.\n")

    h2h = r.get("head_to_head")
    if h2h:
        print("**Head to head** (each round: libgdn, libgdn with bf16 inputs and llama.cpp in turn, the order reversed "
              "every other round, the bandwidth measured before and after each; an engine's roofline is the mean of "
              "the two figures around it):\n")
        print("| round | bandwidth (GB/s) | libgdn decode (% of roofline) | bf16 inputs decode | llama.cpp decode | "
              "decode ratio | libgdn prefill | bf16 inputs prefill | llama.cpp prefill | prefill ratios |")
        print("|---|---|---|---|---|---|---|---|---|---|")
        for i, q in enumerate(h2h["rounds"]):
            o, l, b = q["ours"], q["llama_cpp"], q.get("ours_bf16_inputs")
            def cell(e):
                probed = f"; {100 * e['fraction_probed']:.0f}% probed" if "fraction_probed" in e else ""
                return f"{e['decode_tok_s']:.2f} ({100 * e['decode_tok_s'] / e['roofline_tok_s']:.0f}%{probed})"

            bp = f"{b['prefill_tok_s']:.1f}" if b else "–"
            pr = f"{o['prefill_tok_s'] / l['prefill_tok_s']:.2f}× / " + (f"{b['prefill_tok_s'] / l['prefill_tok_s']:.2f}×" if b else "–")
            bw = " / ".join(f"{x:.1f}" for x in q["bandwidth_gb_s"])
            print(f"| {i + 1} | {bw} | {cell(o)} | {cell(b) if b else '–'} | {cell(l)} | {o['decode_tok_s'] / l['decode_tok_s']:.2f}× | "
                  f"{o['prefill_tok_s']:.1f} | {bp} | {l['prefill_tok_s']:.1f} | {pr} |")
        m = h2h["median"]
        mb = m.get("bf16_inputs", {})
        def frac(x):
            probed = f"; {100 * x['ours_fraction_of_roofline_probed']:.1f}% probed" if "ours_fraction_of_roofline_probed" in x else ""
            return f"{100 * x['ours_fraction_of_roofline']:.1f}%{probed}"
        b_frac = frac(mb) if mb else "–"
        b_pre = f"{mb['prefill_ratio']:.2f}×" if mb else "–"
        print(f"| **median** | | **{frac(m)}** | {b_frac} | "
              f"{100 * m['llama_cpp_fraction_of_roofline']:.1f}% | **{m['decode_ratio']:.2f}×** | | | | "
              f"**{m['prefill_ratio']:.2f}× / {b_pre}** |")
        print()

    print("**Single pass:**\n")
    print("| measure | libgdn | libgdn, bf16 inputs | llama.cpp | libgdn / llama.cpp |")
    print("|---|---|---|---|---|")
    d, pf = r["decode"]["tok_s"], r["prefill"]["tok_s"]
    ld = peer["decode"]["tok_s"] if peer else None
    lp = peer["prefill"]["tok_s"] if peer else None
    bd = bf["decode"]["tok_s"] if bf else None
    bp = bf["prefill"]["tok_s"] if bf else None
    s_bd = f"{bd:.2f} ({100 * bf['decode'].get('fraction_of_roofline', bd / roof):.0f}%)" if bd else "–"
    s_ld = f"{ld:.2f} ({100 * ld / roof:.0f}%)" if ld else "–"
    step = r["decode"].get("fraction_of_step_roofline")
    s_step = f"; {100 * step:.0f}% of the step's" if step else ""
    print(f"| decode, batch 1 (tok/s) | {d:.2f} ({100 * r['decode'].get('fraction_of_roofline', d / roof):.0f}% of roofline{s_step}) | {s_bd} | {s_ld} | "
          f"{ratio(d, ld)} / {ratio(bd, ld)} |")
    print(f"| prefill, {r['prefill']['tokens']} tokens (tok/s) | {pf:.0f} | {fmt(bp)} | {fmt(lp)} | {ratio(pf, lp)} / {ratio(bp, lp)} |")
    if "batch_decode" in r:
        pb = {x["batch"]: x["tok_s"] for x in (peer or {}).get("batch_decode", [])}
        bb = {x["batch"]: x["tok_s"] for x in (bf or {}).get("batch_decode", [])}
        bx = {x["batch"]: x.get("vs_batch1") for x in (bf or {}).get("batch_decode", [])}
        for x in r["batch_decode"]:
            B = x["batch"]
            o, b, l = x["tok_s"], bb.get(B), pb.get(B)
            so = f"{o:.1f} ({x['vs_batch1']:.2f}×)" if "vs_batch1" in x else f"{o:.1f}"
            sb = f"{b:.1f} ({bx[B]:.2f}×)" if b and bx.get(B) else fmt(b)
            print(f"| decode, batch {B}, aggregate (tok/s; × batch 1 in paired runs) | {so} | {sb} | {fmt(l)} | {ratio(o, l)} / {ratio(b, l)} |")
    if "context_decode" in r:
        for x in r["context_decode"]:
            print(f"| decode at context {x['context']} (ms/token); its prefill (tok/s) | {x['ms_per_token']:.0f}; "
                  f"{x['prefill_tok_s']:.0f} | | – | |")
    a = r["heap_allocations"]
    print(f"| heap allocations per decode step | {a['per_step']:.0f} ({a['total']} in {a['decode_steps']} steps, both modes) | | – | |")
    peer_rss = f"{peer['peak_rss_bytes_batch1'] / 2**20:.0f} / {peer['peak_rss_bytes'] / 2**20:.0f}" if peer else "–"
    print(f"| peak RSS (MiB), batch-1 runs / whole run | {r['peak_rss_bytes_batch1'] / 2**20:.0f} / "
          f"{r['peak_rss_bytes'] / 2**20:.0f} | | {peer_rss} | |")
    print(f"| state per sequence | {r['gdn_state_bytes_per_sequence'] / 1e6:.2f} MB GDN (float32) + "
          f"{r['kv_bytes_per_token']} B KV per token | | | |")
    print()

    # Targets: the head-to-head medians where there are rounds, else the single pass.
    print("**Targets:**\n")
    print("| target | libgdn (float32 inputs) | libgdn, bf16 inputs | met |")
    print("|---|---|---|---|")
    m = h2h["median"] if h2h else None
    mb = (m or {}).get("bf16_inputs")
    # libgdn's fraction: probed around each of its own runs where measured (the tightest figure).
    pick = lambda x: x.get("ours_fraction_of_roofline_probed", x["ours_fraction_of_roofline"])  # noqa: E731
    frac = pick(m) if m else r["decode"].get("fraction_of_roofline", d / roof)
    bfrac = pick(mb) if mb else (bf["decode"].get("fraction_of_roofline") if bf else None)
    dr = m["decode_ratio"] if m else (d / ld if ld else None)
    bdr = mb["decode_ratio"] if mb else (bd / ld if bd and ld else None)
    prr = m["prefill_ratio"] if m else (pf / lp if lp else None)
    bpr = mb["prefill_ratio"] if mb else (bp / lp if bp and lp else None)

    def met(a, b, t):
        ok = [v is not None and v >= t for v in (a, b)]
        return "both" if all(ok) else ("bf16 inputs only" if ok[1] else ("float32 only" if ok[0] else "no"))

    pc = lambda v: f"{100 * v:.1f}%" if v is not None else "–"  # noqa: E731
    xx = lambda v: f"{v:.2f}×" if v is not None else "–"  # noqa: E731
    print(f"| batch-1 decode ≥ 90% of roofline | {pc(frac)} | {pc(bfrac)} | {met(frac, bfrac, 0.9)} |")
    print(f"| batch-1 decode ≥ 1.3× llama.cpp | {xx(dr)} | {xx(bdr)} | {met(dr, bdr, 1.3)} |")
    print(f"| 512-token prefill ≥ 1.2× llama.cpp | {xx(prr)} | {xx(bpr)} | {met(prr, bpr, 1.2)} |")
    if "batch_decode" in r:
        g = next((x.get("vs_batch1") for x in r["batch_decode"] if x["batch"] == 16), None)
        gb = next((x.get("vs_batch1") for x in (bf or {}).get("batch_decode", []) if x["batch"] == 16), None)
        print(f"| batch-16 aggregate ≥ 8× batch 1 | {xx(g)} | {xx(gb)} | {met(g, gb, 8)} |")
    print(f"| 0 heap allocations per decode step | {a['total']} in {a['decode_steps']} steps | (included) | "
          f"{'yes' if a['total'] == 0 else 'no'} |")


if __name__ == "__main__":
    main()
