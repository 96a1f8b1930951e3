#!/usr/bin/env python3
"""Train libgdn's tiny Qwen3.5 test model (main model + MTP head) on CPU.

Uses transformers' own Qwen3_5ForCausalLM / Qwen3_5TextConfig (torch fallback GDN path, no fla),
a byte-level BPE tokenizer trained here with HF tokenizers, and the MTP head of mtp.py.
Writes a real HF checkpoint (bf16 safetensors incl. mtp.* tensors, config.json, tokenizer.json,
tokenizer_config.json, generation_config.json).

    OMP_NUM_THREADS=1 python tools/train_tiny/train.py --out models/gdn-tiny --seed 1234 ...
"""
import argparse
import json
import math
import os
import random
import sys
import time

os.environ.setdefault("OMP_NUM_THREADS", "1")
import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import data  # noqa: E402
from mtp import Qwen3_5MTP, mtp_state_dict  # noqa: E402

QWEN35_SPLIT_REGEX = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?[\p{L}\p{M}]+|\p{N}| ?[^\s\p{L}\p{M}\p{N}]+[\r\n]*"
    r"|\s*[\r\n]+|\s+(?!\S)|\s+"
)
SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]


def build_tokenizer(vocab_size: int, seed: int):
    from tokenizers import Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE(unk_token=None, byte_fallback=False))
    tok.normalizer = normalizers.NFC()
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(QWEN35_SPLIT_REGEX), behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=False, use_regex=False),
    ])
    tok.decoder = decoders.ByteLevel(add_prefix_space=False, trim_offsets=False, use_regex=False)
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size, min_frequency=2, special_tokens=SPECIALS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    with open(os.path.join(HERE, "english.txt"), encoding="utf-8") as f:
        english = f.read().splitlines()
    corpus = english * 20 + list(data.tokenizer_corpus(20000, seed))
    tok.train_from_iterator(corpus, trainer=trainer)
    return tok


def finalize_tokenizer_json(path):
    """Give tokenizer.json the exact decoder/post-processor entries of Qwen's published tokenizer.json
    (tokenizers' Python constructor drops the decoder flags; transformers adds a no-op template)."""
    with open(path, encoding="utf-8") as f:
        t = json.load(f)
    bl = {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": False, "use_regex": False}
    t["decoder"] = dict(bl)
    t["post_processor"] = dict(bl)
    with open(path, "w", encoding="utf-8") as f:
        json.dump(t, f, ensure_ascii=False, indent=2)
        f.write("\n")


def make_config(args, vocab_size, eos_id):
    from transformers import Qwen3_5TextConfig

    L = args.layers
    layer_types = ["full_attention" if (i + 1) % 4 == 0 else "linear_attention" for i in range(L)]
    rotary_half = int(args.head_dim * 0.25) // 2
    return Qwen3_5TextConfig(
        vocab_size=vocab_size, hidden_size=args.hidden, intermediate_size=args.ffn,
        num_hidden_layers=L, layer_types=layer_types,
        num_attention_heads=args.heads, num_key_value_heads=args.kv_heads, head_dim=args.head_dim,
        linear_num_key_heads=args.lin_k_heads, linear_num_value_heads=args.lin_v_heads,
        linear_key_head_dim=args.lin_head_dim, linear_value_head_dim=args.lin_head_dim,
        linear_conv_kernel_dim=4, hidden_act="silu", rms_norm_eps=1e-6,
        max_position_embeddings=4096, tie_word_embeddings=True,
        rope_parameters={"rope_type": "default", "rope_theta": 10000000.0, "partial_rotary_factor": 0.25,
                         "mrope_section": [rotary_half - 2 * (rotary_half // 3), rotary_half // 3,
                                           rotary_half // 3], "mrope_interleaved": True},
        eos_token_id=eos_id, pad_token_id=eos_id, bos_token_id=None,
        # fields of the published Qwen3.5 text_config that transformers does not use
        full_attention_interval=4, attn_output_gate=True, mamba_ssm_dtype="float32",
        mtp_num_hidden_layers=1, mtp_use_dedicated_embeddings=False,
    )


class Batcher:
    """Random training examples (never from the held-out pool), right-padded; labels only on answer+eos."""

    def __init__(self, tok, eos_id, seed):
        self.tok, self.eos, self.rng = tok, eos_id, random.Random(seed)

    def encode(self, prompt, answer):
        p = self.tok.encode(prompt).ids
        a = self.tok.encode(answer).ids + [self.eos]
        return p, a

    def batch(self, n, heldout=False, rng=None, tasks=None):
        rng = rng or self.rng
        seqs = []
        for _ in range(n):
            task, prompt, answer = data.sample(rng, heldout=heldout)
            seqs.append(self.encode(prompt, answer))
            if tasks is not None:
                tasks.append(task)
        return self.collate(seqs)

    def collate(self, seqs):
        T = max(len(p) + len(a) for p, a in seqs)
        ids = torch.full((len(seqs), T), self.eos, dtype=torch.long)
        lab = torch.full((len(seqs), T), -100, dtype=torch.long)
        for i, (p, a) in enumerate(seqs):
            ids[i, :len(p) + len(a)] = torch.tensor(p + a)
            lab[i, len(p):len(p) + len(a)] = torch.tensor(a)
        return ids, lab


def losses(model, mtp, ids, lab, per_seq=False):
    """Main next-token loss and MTP next-next-token loss (both only on answer/eos targets),
    plus per-sequence teacher-forced exact match (== greedy exact match) of main and MTP."""
    out = model.model(input_ids=ids)
    h = out.last_hidden_state                       # post model.norm
    logits = model.lm_head(h)
    tgt = lab[:, 1:]
    main_loss = F.cross_entropy(logits[:, :-1].reshape(-1, logits.shape[-1]), tgt.reshape(-1), ignore_index=-100)
    B, T = ids.shape
    pos = torch.arange(T - 1).unsqueeze(0).expand(B, -1)  # pair (h_t, x_{t+1}) at position t
    emb = model.model.embed_tokens(ids[:, 1:])
    pe = model.model.rotary_emb(emb, pos)
    hm = mtp(h[:, :-1].detach(), emb, pe)
    mlog = model.lm_head(hm)[:, :-1]                # predicts x_{t+2}
    mt = lab[:, 2:]
    mtp_loss = F.cross_entropy(mlog.reshape(-1, mlog.shape[-1]), mt.reshape(-1), ignore_index=-100)
    with torch.no_grad():
        m = tgt != -100
        ok = ((logits[:, :-1].argmax(-1) == tgt) | ~m).all(1)
        mm = mt != -100
        mtp_tok = ((mlog.argmax(-1) == mt) & mm).sum().item() / max(mm.sum().item(), 1)
    if per_seq:
        return main_loss, mtp_loss, ok, mtp_tok
    return main_loss, mtp_loss, ok.float().mean().item(), mtp_tok


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=os.path.join(HERE, "..", "..", "models", "gdn-tiny"))
    ap.add_argument("--seed", type=int, default=1234)
    ap.add_argument("--vocab", type=int, default=480)
    ap.add_argument("--hidden", type=int, default=128)
    ap.add_argument("--ffn", type=int, default=384)
    ap.add_argument("--layers", type=int, default=8)
    ap.add_argument("--heads", type=int, default=4)
    ap.add_argument("--kv-heads", type=int, default=2)
    ap.add_argument("--head-dim", type=int, default=32)
    ap.add_argument("--lin-k-heads", type=int, default=2)
    ap.add_argument("--lin-v-heads", type=int, default=4)
    ap.add_argument("--lin-head-dim", type=int, default=32)
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--steps", type=int, default=1100)
    ap.add_argument("--lr", type=float, default=3e-3)
    ap.add_argument("--warmup", type=int, default=100)
    ap.add_argument("--mtp-weight", type=float, default=0.5)
    ap.add_argument("--eval-every", type=int, default=250)
    ap.add_argument("--time-limit", type=float, default=0, help="stop after this many minutes (0: none)")
    ap.add_argument("--threads", type=int, default=1)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)
    random.seed(args.seed)
    t0 = time.time()
    print("command: OMP_NUM_THREADS=%s python %s" % (os.environ.get("OMP_NUM_THREADS"), " ".join(sys.argv)), flush=True)
    print("args:", json.dumps(vars(args)), flush=True)

    from transformers import GenerationConfig, PreTrainedTokenizerFast, Qwen3_5ForCausalLM

    tok = build_tokenizer(args.vocab, args.seed)
    eos_id = tok.token_to_id("<|endoftext|>")
    n_tok = tok.get_vocab_size()
    vocab_size = -(-n_tok // 64) * 64              # padded like the real vocab (248320 > tokenizer size)
    print(f"tokenizer: {n_tok} tokens, eos={eos_id}, config vocab_size={vocab_size}", flush=True)

    config = make_config(args, vocab_size, eos_id)
    model = Qwen3_5ForCausalLM(config)
    model.float().train()
    mtp = Qwen3_5MTP(config).float().train()
    n_main = sum(p.numel() for p in model.parameters())
    n_mtp = sum(p.numel() for p in mtp.parameters())
    print(f"params: main {n_main} (tied embedding {model.model.embed_tokens.weight.numel()}), mtp {n_mtp}, "
          f"total {n_main + n_mtp}", flush=True)
    print("attn_implementation:", model.config._attn_implementation, flush=True)

    batcher = Batcher(tok, eos_id, args.seed)
    # sanity: prompt/answer tokenise independently
    r = random.Random(0)
    for _ in range(200):
        _, p, a = data.sample(r, False)
        assert tok.encode(p + a).ids == tok.encode(p).ids + tok.encode(a).ids, (p, a)
    val_tasks = []
    val = batcher.batch(256, heldout=True, rng=random.Random(args.seed + 1), tasks=val_tasks)

    params = list(model.parameters()) + list(mtp.parameters())
    decay = [p for p in params if p.ndim >= 2]
    no_decay = [p for p in params if p.ndim < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.01}, {"params": no_decay, "weight_decay": 0.0}],
                            lr=args.lr, betas=(0.9, 0.98), eps=1e-8)

    def lr_at(s):
        if s < args.warmup:
            return args.lr * (s + 1) / args.warmup
        p = (s - args.warmup) / max(1, args.steps - args.warmup)
        return args.lr * (0.05 + 0.95 * 0.5 * (1 + math.cos(math.pi * min(1.0, p))))

    ema = None
    ntok = 0
    step = 0
    for step in range(args.steps):
        for g in opt.param_groups:
            g["lr"] = lr_at(step)
        ids, lab = batcher.batch(args.batch)
        ntok += ids.numel()
        ml, tl, acc, macc = losses(model, mtp, ids, lab)
        loss = ml + args.mtp_weight * tl
        opt.zero_grad(set_to_none=True)
        loss.backward()
        gn = torch.nn.utils.clip_grad_norm_(params, 1.0)
        opt.step()
        cur = (ml.item(), tl.item(), acc, macc)
        ema = cur if ema is None else tuple(0.98 * e + 0.02 * c for e, c in zip(ema, cur))
        if step % 50 == 0:
            el = time.time() - t0
            print(f"step {step:5d} lr {lr_at(step):.2e} loss {ema[0]:.4f} mtp_loss {ema[1]:.4f} "
                  f"train_exact {ema[2]:.3f} mtp_tok_acc {ema[3]:.3f} gnorm {gn:.2f} "
                  f"tok/s {ntok / el:.0f} elapsed {el / 60:.1f}m", flush=True)
        if (step + 1) % args.eval_every == 0 or step + 1 == args.steps:
            model.eval(); mtp.eval()
            with torch.no_grad():
                vl, vt, vok, vmacc = losses(model, mtp, *val, per_seq=True)
            model.train(); mtp.train()
            per = " ".join(f"{t} {sum(o for o, tt in zip(vok.tolist(), val_tasks) if tt == t) / val_tasks.count(t):.3f}"
                           for t in data.TASKS)
            print(f"== val step {step + 1}: loss {vl.item():.4f} mtp_loss {vt.item():.4f} "
                  f"exact {vok.float().mean().item():.3f} ({per}) mtp_tok_acc {vmacc:.3f}", flush=True)
        if args.time_limit and time.time() - t0 > args.time_limit * 60:
            print(f"time limit reached at step {step + 1}", flush=True)
            break

    # ---- save: real HF layout, bf16 safetensors, plus mtp.* tensors in the same file ----
    out = os.path.abspath(args.out)
    os.makedirs(out, exist_ok=True)
    model.eval()
    model.generation_config = GenerationConfig(eos_token_id=eos_id, pad_token_id=eos_id, bos_token_id=None,
                                               do_sample=False, max_new_tokens=16)
    model.to(torch.bfloat16).save_pretrained(out, safe_serialization=True)
    cfg_path = os.path.join(out, "config.json")
    with open(cfg_path) as f:
        cfg = json.load(f)
    cfg["partial_rotary_factor"] = 0.25            # repeated at top level, as in the published configs
    with open(cfg_path, "w") as f:
        json.dump(dict(sorted(cfg.items())), f, indent=2)
        f.write("\n")
    from safetensors.torch import load_file, save_file

    st_path = os.path.join(out, "model.safetensors")
    sd = load_file(st_path)
    sd.update(mtp_state_dict(mtp, torch.bfloat16))
    save_file(dict(sorted(sd.items())), st_path, metadata={"format": "pt"})
    hf_tok = PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<|endoftext|>", pad_token="<|endoftext|>",
                                     unk_token=None, bos_token=None, model_max_length=4096)
    hf_tok.save_pretrained(out)
    finalize_tokenizer_json(os.path.join(out, "tokenizer.json"))
    el = time.time() - t0
    print(f"saved to {out} ({len(sd)} tensors) after {step + 1} steps, wall time {el / 60:.1f} min", flush=True)


if __name__ == "__main__":
    main()
