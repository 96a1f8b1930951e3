#!/usr/bin/env python3
"""Evaluate the SAVED bf16 checkpoint of the tiny model with transformers (weights loaded in float32,
so they are exactly the bf16 values) and write the parity references the C++ engine is tested against.

    OMP_NUM_THREADS=1 python tools/train_tiny/evaluate.py --model models/gdn-tiny

Writes under <model>/eval/:
  heldout.jsonl         one line per held-out prompt: transformers' greedy generation (the parity reference)
  mtp_acceptance.json   greedy speculative decoding with the chained MTP head, k = 1, 2, 3
  mtp_trace.jsonl       per prompt and k: every draft/verify step (drafted ids, accepted count, main ids)
  summary.json          accuracy overall and per task, load check
  demo_prompts.txt      5 prompts the model answers correctly (one per line)
"""
import argparse
import json
import os
import sys

os.environ.setdefault("OMP_NUM_THREADS", "1")
import torch  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import data  # noqa: E402
from mtp import Qwen3_5MTP  # noqa: E402

EVAL_SEED = 20260501
MAX_NEW = 16


def load(model_dir):
    from safetensors.torch import load_file
    from tokenizers import Tokenizer
    from transformers import AutoTokenizer, Qwen3_5ForCausalLM

    model, info = Qwen3_5ForCausalLM.from_pretrained(model_dir, dtype=torch.float32, output_loading_info=True)
    model.eval()
    sd = load_file(os.path.join(model_dir, "model.safetensors"))
    assert all(v.dtype == torch.bfloat16 for v in sd.values()), "checkpoint must be bf16"
    mtp = Qwen3_5MTP(model.config)
    msd = {k[len("mtp."):]: v.float() for k, v in sd.items() if k.startswith("mtp.")}
    mtp.load_state_dict(msd, strict=True)
    mtp.eval()
    tok = Tokenizer.from_file(os.path.join(model_dir, "tokenizer.json"))
    hf_tok = AutoTokenizer.from_pretrained(model_dir)
    load_check = {
        "missing_keys": sorted(info["missing_keys"]),
        "unexpected_keys_reported": sorted(info["unexpected_keys"]),
        "mismatched_keys": [str(x) for x in info["mismatched_keys"]],
        "mtp_tensors": sorted("mtp." + k for k in msd),
        "n_tensors": len(sd),
    }
    assert not info["missing_keys"] and not info["mismatched_keys"], load_check
    return model, mtp, tok, hf_tok, load_check


@torch.no_grad()
def main_forward(model, ids):
    h = model.model(input_ids=torch.tensor([ids])).last_hidden_state  # post model.norm
    return h[0], model.lm_head(h)[0]


@torch.no_grad()
def mtp_forward(model, mtp, hidden, tokens, pos0=0):
    """MTP over pairs (hidden[i], tokens[i]) at positions pos0+i, causal. Returns h' [T,H] and logits."""
    emb = model.model.embed_tokens(torch.tensor([tokens]))
    pos = torch.arange(pos0, pos0 + len(tokens)).unsqueeze(0)
    pe = model.model.rotary_emb(emb, pos)
    hm = mtp(hidden.unsqueeze(0), emb, pe)[0]
    return hm, model.lm_head(hm)


@torch.no_grad()
def speculative(model, mtp, prompt_ids, k, eos):
    """Greedy generation with k chained MTP drafts per main step, greedy verification.
    Without caches: every forward recomputes the full sequence, which equals the cached computation
    (the MTP context always uses the main model's hidden states at accepted positions, as vLLM does)."""
    seq = list(prompt_ids)
    H, logits = main_forward(model, seq)          # prefill
    seq.append(int(logits[-1].argmax()))
    gen = [seq[-1]]
    trace, steps = [], []
    while gen[-1] != eos and len(gen) < MAX_NEW:
        n = len(seq) - 1                          # position of the newest token
        ctx_h = H[:n]                             # h_0 .. h_{n-1}
        ctx_x = seq[1:n + 1]                      # x_1 .. x_n
        hm, ml = mtp_forward(model, mtp, ctx_h, ctx_x)
        drafts = [int(ml[-1].argmax())]
        chain_h, chain_x = [hm[-1]], [drafts[0]]
        for _ in range(k - 1):                    # next draft: (h' of previous step, drafted token) at pos + 1
            hm2, ml2 = mtp_forward(model, mtp, torch.cat([ctx_h, torch.stack(chain_h)]), ctx_x + chain_x)
            drafts.append(int(ml2[-1].argmax()))
            chain_h.append(hm2[-1]); chain_x.append(drafts[-1])
        H2, lg = main_forward(model, seq + drafts)  # verify all drafts in one main step
        main_next = [int(lg[n + i].argmax()) for i in range(k + 1)]
        a = 0
        while a < k and drafts[a] == main_next[a]:
            a += 1
            if drafts[a - 1] == eos:
                break
        new = drafts[:a] if (a > 0 and drafts[a - 1] == eos) else drafts[:a] + [main_next[a]]
        new = new[:MAX_NEW - len(gen)]
        seq += new; gen += new
        H = H2
        trace.append({"pos": n, "drafts": drafts, "main": main_next, "accepted": a, "emitted": len(new)})
        # drafts after an accepted eos can never be used: count them separately
        useful = a if (a > 0 and drafts[a - 1] == eos) else k
        steps.append((useful, a, len(new)))
    return gen, trace, steps


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default=os.path.join(HERE, "..", "..", "models", "gdn-tiny"))
    ap.add_argument("--n", type=int, default=400)
    ap.add_argument("--seed", type=int, default=EVAL_SEED)
    ap.add_argument("--threads", type=int, default=1)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    model_dir = os.path.abspath(args.model)
    out_dir = os.path.join(model_dir, "eval")
    os.makedirs(out_dir, exist_ok=True)
    model, mtp, tok, hf_tok, load_check = load(model_dir)
    eos = model.config.eos_token_id
    items = data.heldout_set(args.n, args.seed)

    rows, per_task = [], {}
    for i, (task, prompt, answer) in enumerate(items):
        assert data.is_heldout(prompt)
        p_ids = tok.encode(prompt).ids
        assert p_ids == hf_tok(prompt).input_ids
        exp_ids = tok.encode(answer).ids + [eos]
        with torch.no_grad():
            out = model.generate(torch.tensor([p_ids]), attention_mask=torch.ones(1, len(p_ids), dtype=torch.long),
                                 max_new_tokens=MAX_NEW, do_sample=False, eos_token_id=eos, pad_token_id=eos)
        g = out[0, len(p_ids):].tolist()
        if eos in g:
            g = g[:g.index(eos) + 1]
        text = tok.decode([t for t in g if t != eos])
        ok = g == exp_ids
        rows.append({"id": i, "task": task, "prompt": prompt, "prompt_ids": p_ids, "expected": answer,
                     "expected_ids": exp_ids, "generated_ids": g, "generated_text": text, "correct": ok})
        c = per_task.setdefault(task, [0, 0]); c[0] += ok; c[1] += 1
    acc = sum(r["correct"] for r in rows) / len(rows)
    with open(os.path.join(out_dir, "heldout.jsonl"), "w") as f:
        for r in rows:
            f.write(json.dumps(r) + "\n")
    print(f"held-out exact match: {acc:.4f} ({sum(r['correct'] for r in rows)}/{len(rows)})")
    for t, (c, n) in per_task.items():
        print(f"  {t:8s} {c}/{n} = {c / n:.3f}")

    # ---- MTP acceptance ----
    mtp_res, traces = {}, []
    for k in (1, 2, 3):
        drafted = useful_drafted = accepted = nsteps = emitted = 0
        depth_acc = [0] * k
        depth_try = [0] * k
        same = True
        for r in rows:
            gen, trace, steps = speculative(model, mtp, r["prompt_ids"], k, eos)
            same &= gen == r["generated_ids"]
            traces.append({"id": r["id"], "k": k, "generated_ids": gen, "steps": trace})
            for u, a, e in steps:
                drafted += k; useful_drafted += u; accepted += a; nsteps += 1; emitted += e
                for d in range(k):
                    depth_try[d] += d <= a       # draft d is judged only if drafts 0..d-1 were accepted
                    depth_acc[d] += d < a
        mtp_res[str(k)] = {
            "draft_tokens_per_step": k,
            "verify_steps": nsteps,
            "drafted": drafted,
            "accepted": accepted,
            "acceptance_rate": accepted / max(drafted, 1),
            "drafted_before_eos": useful_drafted,
            "acceptance_rate_before_eos": accepted / max(useful_drafted, 1),
            "mean_accepted_per_step": accepted / max(nsteps, 1),
            "mean_tokens_per_main_step": emitted / max(nsteps, 1),
            "per_depth_conditional_acceptance": [depth_acc[d] / max(depth_try[d], 1) for d in range(k)],
            "output_identical_to_greedy": bool(same),
        }
        print(f"MTP k={k}: acceptance {mtp_res[str(k)]['acceptance_rate']:.4f}, "
              f"tokens/main step {mtp_res[str(k)]['mean_tokens_per_main_step']:.3f}, identical={same}")
    note = ("Greedy speculative decoding over the held-out prompts. Prefill gives the first answer token; each "
            "verify step drafts k tokens with the chained MTP head (pair (h_t, x_{t+1}) at position t, h_t = main "
            "hidden after model.norm; chained steps feed the post-mtp.norm output and the drafted token at the next "
            "position), runs the main model once over them, accepts the longest matching prefix and adds the main "
            "model's next token. acceptance_rate = accepted/drafted; mean_tokens_per_main_step = emitted tokens per "
            "verify step (prefill not counted; stops at eos or 16 new tokens, so a step can emit fewer than "
            "accepted+1). acceptance_rate_before_eos leaves out drafts that follow an accepted eos draft.")
    with open(os.path.join(out_dir, "mtp_acceptance.json"), "w") as f:
        json.dump({"note": note, "prompts": len(rows), "max_new_tokens": MAX_NEW, "results": mtp_res}, f, indent=2)
        f.write("\n")
    with open(os.path.join(out_dir, "mtp_trace.jsonl"), "w") as f:
        for t in traces:
            f.write(json.dumps(t) + "\n")

    summary = {"heldout_prompts": len(rows), "eval_seed": args.seed, "exact_match": acc,
               "per_task": {t: c / n for t, (c, n) in per_task.items()}, "load_check": load_check,
               "mtp_acceptance_rate": {k: v["acceptance_rate"] for k, v in mtp_res.items()},
               "mtp_tokens_per_main_step": {k: v["mean_tokens_per_main_step"] for k, v in mtp_res.items()}}
    with open(os.path.join(out_dir, "summary.json"), "w") as f:
        json.dump(summary, f, indent=2)
        f.write("\n")

    demo, seen = [], set()
    for r in rows:
        if r["correct"] and r["task"] not in seen:
            demo.append(r); seen.add(r["task"])
    for r in sorted(rows, key=lambda r: -len(r["expected"])):   # fill up with the longest answers
        if len(demo) >= 5:
            break
        if r["correct"] and r not in demo and all(d["task"] != r["task"] or r["task"] == "add" for d in demo[3:]):
            demo.append(r)
    with open(os.path.join(out_dir, "demo_prompts.txt"), "w") as f:
        for r in demo:
            f.write(r["prompt"] + "\n")
    with open(os.path.join(out_dir, "demo_answers.txt"), "w") as f:
        for r in demo:
            f.write(r["expected"] + "\n")
    print("demo:", [(r["prompt"], r["expected"]) for r in demo])


if __name__ == "__main__":
    main()
