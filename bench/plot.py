#!/usr/bin/env python3
"""Plots a `gdn bench --json` result (with its llama.cpp peer, if present) to a PNG.

usage: plot.py BENCH.json OUT.png
"""
import json
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402


def main():
    r = json.load(open(sys.argv[1]))
    peer = r.get("llama_cpp") if isinstance(r.get("llama_cpp"), dict) and "decode" in r.get("llama_cpp", {}) else None
    bf = r.get("bf16_inputs")
    fig, ax = plt.subplots(1, 4, figsize=(17, 4.2))
    ours, ours_bf, theirs, roof = "#1f77b4", "#2ca02c", "#ff7f0e", "#7f7f7f"

    h2h = r.get("head_to_head")
    if h2h:
        # Head to head: each round's roofline, ours and llama.cpp, measured back to back.
        rounds = h2h["rounds"]
        x = list(range(len(rounds)))
        series = [("ours", "libgdn", ours)]
        if "ours_bf16_inputs" in rounds[0]:
            series.append(("ours_bf16_inputs", "libgdn, bf16 inputs", ours_bf))
        series.append(("llama_cpp", "llama.cpp", theirs))
        w = 0.8 / len(series)
        for k, (key, label, col) in enumerate(series):
            vals = [q[key]["decode_tok_s"] for q in rounds]
            ax[0].bar([i + (k - (len(series) - 1) / 2) * w for i in x], vals, w, color=col, label=label)
            for i, v in enumerate(vals):
                e = rounds[i][key]
                f = e.get("fraction_probed", v / e["roofline_tok_s"])  # libgdn: probed around each run
                ax[0].text(i + (k - (len(series) - 1) / 2) * w, v, f"{100 * f:.0f}", ha="center", va="bottom", fontsize=6)
        ax[0].set_xticks(x, [f"round {i + 1}" for i in x], fontsize=7)
        m = h2h["median"]
        pf = m.get("ours_fraction_of_roofline_probed", m["ours_fraction_of_roofline"])
        ax[0].set_title(f"decode, batch 1 (tok/s; % of roofline above bars)\nmedian: libgdn {100 * pf:.0f}% of roofline, "
                        f"{m['decode_ratio']:.2f}x llama.cpp (llama.cpp {100 * m['llama_cpp_fraction_of_roofline']:.0f}%)", fontsize=9)
        ax[0].set_ylim(0, max(q[k]["decode_tok_s"] for q in rounds for k, _, _ in series) * 1.4)
        ax[0].legend(fontsize=7, ncol=2, loc="upper center")
        pseries = series
        w = 0.8 / len(pseries)
        for k, (key, label, col) in enumerate(pseries):
            vals = [q[key]["prefill_tok_s"] for q in rounds]
            ax[1].bar([i + (k - (len(pseries) - 1) / 2) * w for i in x], vals, w, color=col, label=label)
        ax[1].set_xticks(x, [f"round {i + 1}" for i in x], fontsize=7)
        mb = m.get("bf16_inputs")
        extra = f", bf16 inputs {mb['prefill_ratio']:.2f}x" if mb else ""
        ax[1].set_title(f"prefill, {r['prefill']['tokens']}-token prompt (tok/s)\nmedian vs llama.cpp: {m['prefill_ratio']:.2f}x{extra}",
                        fontsize=9)
        ax[1].set_ylim(0, max(q[key]["prefill_tok_s"] for q in rounds for key, _, _ in pseries) * 1.3)
        ax[1].legend(fontsize=7, ncol=2, loc="upper center")
    else:
        # Decode at batch 1 against the roofline.
        names, vals, cols = ["roofline"], [r["roofline_tok_s"]], [roof]
        names.append("libgdn"); vals.append(r["decode"]["tok_s"]); cols.append(ours)
        if peer:
            names.append("llama.cpp"); vals.append(peer["decode"]["tok_s"]); cols.append(theirs)
        ax[0].bar(names, vals, color=cols)
        for i, v in enumerate(vals):
            ax[0].text(i, v, f"{v:.2f}\n({100 * v / r['roofline_tok_s']:.0f}%)", ha="center", va="bottom", fontsize=8)
        ax[0].set_title(f"decode, batch 1 (tok/s)\nroofline = {r['bandwidth']['median_gb_s']:.1f} GB/s ÷ "
                        f"{r['weight_bytes_per_token'] / 1e9:.2f} GB", fontsize=9)
        ax[0].set_ylim(0, max(vals) * 1.3)

        # Prefill.
        names, vals, cols = ["libgdn"], [r["prefill"]["tok_s"]], [ours]
        if peer:
            names.append("llama.cpp"); vals.append(peer["prefill"]["tok_s"]); cols.append(theirs)
        ax[1].bar(names, vals, color=cols)
        for i, v in enumerate(vals):
            ax[1].text(i, v, f"{v:.0f}", ha="center", va="bottom", fontsize=8)
        ax[1].set_title(f"prefill, {r['prefill']['tokens']}-token prompt (tok/s)", fontsize=9)
        ax[1].set_ylim(0, max(vals) * 1.2)

    # Batch scaling.
    if "batch_decode" in r:
        b = [x["batch"] for x in r["batch_decode"]]
        ax[2].plot(b, [x["tok_s"] for x in r["batch_decode"]], "o-", color=ours, label="libgdn")
        if bf and "batch_decode" in bf:
            ax[2].plot([x["batch"] for x in bf["batch_decode"]], [x["tok_s"] for x in bf["batch_decode"]], "^-", color=ours_bf,
                       label="libgdn, bf16 inputs")
        if peer and "batch_decode" in peer:
            ax[2].plot([x["batch"] for x in peer["batch_decode"]], [x["tok_s"] for x in peer["batch_decode"]], "s-",
                       color=theirs, label="llama.cpp")
        base = r["batch_decode"][0]["tok_s"] / r["batch_decode"][0]["batch"]
        ax[2].plot(b, [base * x for x in b], ":", color=roof, label="linear in batch")
        ax[2].set_xscale("log", base=2)
        ax[2].set_yscale("log")
        ax[2].set_xticks(b, [str(x) for x in b])
        ax[2].set_xlabel("sequences per step")
        ax[2].set_title("aggregate decode (tok/s)", fontsize=9)
        ax[2].legend(fontsize=8)

    # Context scaling.
    if "context_decode" in r:
        c = [x["context"] for x in r["context_decode"]]
        ax[3].plot(c, [x["ms_per_token"] for x in r["context_decode"]], "o-", color=ours, label="libgdn")
        if peer and "context_decode" in peer:
            ax[3].plot([x["context"] for x in peer["context_decode"]], [1e3 / x["tok_s"] for x in peer["context_decode"]],
                       "s-", color=theirs, label="llama.cpp")
        ax[3].axhline(1e3 / r["roofline_tok_s"], ls=":", color=roof, label="weights roofline")
        ax[3].set_xscale("log", base=2)
        ax[3].set_xticks(c, [str(x) for x in c])
        ax[3].set_xlabel("context length (tokens)")
        ax[3].set_title("decode cost, batch 1 (ms/token)", fontsize=9)
        ax[3].set_ylim(0, None)
        ax[3].legend(fontsize=8)

    fig.suptitle(f"{r['model_dir'].rstrip('/').split('/')[-1]} (random bf16 weights), {r['threads']} threads, "
                 f"kernel {r['kernel']}", fontsize=10)
    fig.tight_layout()
    fig.savefig(sys.argv[2], dpi=110)
    print(f"wrote {sys.argv[2]}", file=sys.stderr)


if __name__ == "__main__":
    main()
