# One layer's chunked GDN prefill with flash-linear-attention's or FlashInfer's kernel, on the
# shapes scripts/device-check.sh benchmarks libgdn's on: prints one JSON object per run. Needs their
# wheels (carried: scripts/device-check.sh --prepare --with-wheels) and PyTorch (the GPU image has it).
#   python3 scripts/gdn_reference_prefill.py fla|flashinfer 0.8b,27b TOKENS
import json, sys, time
import torch
which, shapes, T = sys.argv[1], sys.argv[2].split(","), int(sys.argv[3])
cfg = {"0.8b": (16, 16), "27b": (16, 48)}  # (key heads, value heads); dk = dv = 128
def timed(f, iters=10):
    f(); torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(iters): f()
    torch.cuda.synchronize()
    return (time.perf_counter() - t0) / iters * 1e3
for name in shapes:
    if name not in cfg: continue
    Hk, Hv = cfg[name]
    for nseq in (1, 4):
        per = T // nseq
        cu = torch.arange(0, nseq + 1, device="cuda", dtype=torch.int32) * per
        n = per * nseq
        q = torch.randn(n, Hk, 128, device="cuda", dtype=torch.bfloat16)
        k = torch.randn(n, Hk, 128, device="cuda", dtype=torch.bfloat16)
        v = torch.randn(n, Hv, 128, device="cuda", dtype=torch.bfloat16)
        g = -torch.rand(n, Hv, device="cuda", dtype=torch.float32)  # log decay
        beta = torch.rand(n, Hv, device="cuda", dtype=torch.float32)
        h0 = torch.zeros(nseq, Hv, 128, 128, device="cuda", dtype=torch.float32)
        if which == "fla":
            from fla.ops.gated_delta_rule import chunk_gated_delta_rule
            qq, kk = q, k
            try:
                f = lambda: chunk_gated_delta_rule(qq[None], kk[None], v[None], g[None], beta[None].to(torch.bfloat16),
                                                   initial_state=h0, output_final_state=True, cu_seqlens=cu.long(),
                                                   use_qk_l2norm_in_kernel=True)
                f()
            except Exception:  # older FLA: no grouped value heads, repeat q/k
                qq, kk = q.repeat_interleave(Hv // Hk, 1), k.repeat_interleave(Hv // Hk, 1)
                f = lambda: chunk_gated_delta_rule(qq[None], kk[None], v[None], g[None], beta[None].to(torch.bfloat16),
                                                   initial_state=h0, output_final_state=True, cu_seqlens=cu.long(),
                                                   use_qk_l2norm_in_kernel=True)
        else:
            from flashinfer.gdn_prefill import chunk_gated_delta_rule
            alpha = torch.exp(g)
            f = lambda: chunk_gated_delta_rule(q, k, v, alpha, beta, initial_state=h0, output_final_state=True,
                                               cu_seqlens=cu.long(), use_qk_l2norm_in_kernel=True)
        ms = timed(f)
        print(json.dumps({"kind": "gdn_prefill_reference", "library": which, "shape": name, "tokens": n,
                          "sequences": nseq, "ms": round(ms, 4), "tokens_per_s": round(n / ms * 1e3)}), flush=True)
