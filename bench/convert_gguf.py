#!/usr/bin/env python3
"""Converts a Qwen3.5 (qwen3_5_text, dense) safetensors checkpoint to a bf16 GGUF for llama.cpp.

Written for the benchmark's peer (bench/peer.py) with the `gguf` package from PyPI; it
follows the conventions of the converter llama.cpp ships (convert_hf_to_gguf.py, Qwen3_5TextModel):

  - tensor names through gguf's own TensorNameMap for MODEL_ARCH.QWEN35;
  - zero-centred RMSNorm weights are stored as 1 + w (llama.cpp multiplies by the stored weight),
    except the GDN gated norm (linear_attn.norm), which is already a plain weight;
  - A_log is stored as -exp(A_log) ("ssm_a"), dt_bias as "ssm_dt.bias", conv1d squeezed to [C, K];
  - value heads are re-tiled from the grouped order (HF: value head h reads key head h / r) to the
    tiled order ggml broadcasts (GGUF head j = HF head (j % Hk)·r + j / Hk) in every tensor that is
    indexed by value head: the v rows of in_proj_qkv, in_proj_z, in_proj_b, in_proj_a, A_log,
    dt_bias, the v channels of conv1d and the columns of out_proj. (A no-op when Hk == Hv, as in
    Qwen3.5-0.8B and -2B.)
  - the vocabulary comes from a tokenizer.json (default: the Qwen3.5 tokenizer shipped in
    tests/assets), padded with [PADn] tokens to the model's vocab_size.

Matrices stay bf16 bit for bit; 1-D tensors are written as float32, as llama.cpp's converter does.

--untie writes a tied model's embedding a second time as output.weight, so that llama.cpp's quantiser
can give the output projection and the embedding lookup different types (bench/quant_accuracy.py
quantises them as libgdn does: the output at the format, the embedding left bf16).

usage: convert_gguf.py MODEL_DIR OUT.gguf [--tokenizer tokenizer.json(.gz)] [--untie]
"""

import argparse
import gzip
import json
import os
import struct
import sys

import numpy as np

try:
    import gguf
except ImportError:
    sys.exit("convert_gguf.py needs the gguf package (pip install gguf)")


def read_safetensors(model_dir):
    """name -> (dtype, shape, numpy memmap of the raw bytes)"""
    index = os.path.join(model_dir, "model.safetensors.index.json")
    files = sorted(set(json.load(open(index))["weight_map"].values())) if os.path.exists(index) else ["model.safetensors"]
    out = {}
    for f in files:
        path = os.path.join(model_dir, f)
        with open(path, "rb") as fh:
            n = struct.unpack("<Q", fh.read(8))[0]
            header = json.loads(fh.read(n))
        mm = np.memmap(path, dtype=np.uint8, mode="r")
        for name, meta in header.items():
            if name == "__metadata__":
                continue
            a, b = meta["data_offsets"]
            out[name] = (meta["dtype"], meta["shape"], mm[8 + n + a: 8 + n + b])
    return out


def as_float32(dtype, shape, raw):
    if dtype == "BF16":
        u = raw.view(np.uint16).astype(np.uint32) << 16
        return u.view(np.float32).reshape(shape)
    if dtype == "F16":
        return raw.view(np.float16).astype(np.float32).reshape(shape)
    if dtype == "F32":
        return raw.view(np.float32).reshape(shape).copy()
    raise ValueError(f"unsupported dtype {dtype}")


def as_bf16_bits(dtype, shape, raw):
    if dtype == "BF16":
        return raw.view(np.uint16).reshape(shape)
    f = as_float32(dtype, shape, raw)
    u = f.view(np.uint32)
    return ((u + 0x7FFF + ((u >> 16) & 1)) >> 16).astype(np.uint16)  # round to nearest even


def retile(a, axis, hk, r, dim):
    """Grouped value-head order -> tiled order along `axis` (heads of `dim` elements)."""
    if r == 1:
        return a
    shape = list(a.shape)
    new = shape[:axis] + [hk, r, dim] + shape[axis + 1:]
    a = a.reshape(new)
    a = np.swapaxes(a, axis, axis + 1)
    return np.ascontiguousarray(a).reshape(shape)


def load_vocab(path, vocab_size):
    op = gzip.open if path.endswith(".gz") else open
    with op(path, "rt", encoding="utf-8") as f:
        tok = json.load(f)
    tokens = [None] * vocab_size
    types = [gguf.TokenType.UNUSED] * vocab_size
    for t, i in tok["model"]["vocab"].items():
        if i < vocab_size:
            tokens[i], types[i] = t, gguf.TokenType.NORMAL
    for a in tok.get("added_tokens", []):
        if a["id"] < vocab_size:
            tokens[a["id"]] = a["content"]
            types[a["id"]] = gguf.TokenType.CONTROL if a.get("special") else gguf.TokenType.USER_DEFINED
    for i in range(vocab_size):
        if tokens[i] is None:
            tokens[i] = f"[PAD{i}]"
    merges = [m if isinstance(m, str) else " ".join(m) for m in tok["model"].get("merges", [])]
    return tokens, types, merges


def main():
    here = os.path.dirname(os.path.abspath(__file__))
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("model_dir")
    ap.add_argument("out")
    ap.add_argument("--tokenizer", default=os.path.join(here, "..", "tests", "assets", "qwen35_tokenizer", "tokenizer.json.gz"))
    ap.add_argument("--untie", action="store_true", help="write a tied embedding again as output.weight")
    args = ap.parse_args()

    cfg = json.load(open(os.path.join(args.model_dir, "config.json")))
    cfg = {**cfg, **cfg.get("text_config", {})}
    L, H = cfg["num_hidden_layers"], cfg["hidden_size"]
    hk, hv = cfg["linear_num_key_heads"], cfg["linear_num_value_heads"]
    dk, dv = cfg["linear_key_head_dim"], cfg["linear_value_head_dim"]
    r = hv // hk
    head_dim = cfg.get("head_dim", H // cfg["num_attention_heads"])
    rope = cfg.get("rope_parameters", cfg.get("rope_scaling", {})) or {}
    partial = rope.get("partial_rotary_factor", cfg.get("partial_rotary_factor", 0.25))
    theta = rope.get("rope_theta", cfg.get("rope_theta", 10000000.0))
    sections = list(rope.get("mrope_section", [11, 11, 10]))[:4]
    sections += [0] * (4 - len(sections))
    layer_types = cfg.get("layer_types") or [
        "full_attention" if (i + 1) % cfg.get("full_attention_interval", 4) == 0 else "linear_attention" for i in range(L)]

    arch = gguf.MODEL_ARCH.QWEN35
    w = gguf.GGUFWriter(args.out, gguf.MODEL_ARCH_NAMES[arch])
    w.add_name("libgdn bench checkpoint")
    w.add_block_count(L)
    w.add_context_length(cfg.get("max_position_embeddings", 262144))
    w.add_embedding_length(H)
    w.add_feed_forward_length(cfg["intermediate_size"])
    w.add_head_count(cfg["num_attention_heads"])
    w.add_head_count_kv(cfg["num_key_value_heads"])
    w.add_key_length(head_dim)
    w.add_value_length(head_dim)
    w.add_rope_freq_base(theta)
    w.add_rope_dimension_count(int(head_dim * partial))
    w.add_rope_dimension_sections(sections)
    w.add_layer_norm_rms_eps(cfg.get("rms_norm_eps", 1e-6))
    w.add_file_type(gguf.LlamaFileType.MOSTLY_BF16)
    w.add_ssm_conv_kernel(cfg["linear_conv_kernel_dim"])
    w.add_ssm_state_size(dk)
    w.add_ssm_group_count(hk)
    w.add_ssm_time_step_rank(hv)
    w.add_ssm_inner_size(dv * hv)
    w.add_full_attention_interval(cfg.get("full_attention_interval", 4))

    tokens, types, merges = load_vocab(args.tokenizer, cfg["vocab_size"])
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("qwen35")
    w.add_token_list(tokens)
    w.add_token_types(types)
    w.add_token_merges(merges)
    w.add_eos_token_id(cfg.get("eos_token_id", 248044) if isinstance(cfg.get("eos_token_id"), int) else 248044)
    w.add_add_bos_token(False)

    names = gguf.get_tensor_name_map(arch, L)
    tensors = read_safetensors(args.model_dir)
    kd = hk * dk
    written = 0
    for name in sorted(tensors):
        if name.startswith("mtp.") or ".visual." in name or name.startswith("model.visual"):
            continue
        dtype, shape, raw = tensors[name]
        hf = name.replace("model.language_model.", "model.")
        base = hf
        if hf.endswith(".dt_bias"):
            base = hf[: -len(".dt_bias")] + ".dt_proj.bias"
        stem, suffix = (base[: -len(".weight")], ".weight") if base.endswith(".weight") else \
                       (base[: -len(".bias")], ".bias") if base.endswith(".bias") else (base, "")
        gname = names.get_name(stem)
        if gname is None:
            sys.exit(f"convert_gguf.py: no GGUF name for {name}")
        gname += suffix

        is_norm = hf.endswith("norm.weight") and not hf.endswith("linear_attn.norm.weight")
        one_d = len(shape) == 1 or "conv1d" in hf or hf.endswith(".A_log") or hf.endswith(".dt_bias")
        if one_d:
            a = as_float32(dtype, shape, raw).astype(np.float32)
            if hf.endswith(".A_log"):
                a = -np.exp(a)
                a = retile(a, 0, hk, r, 1)
            elif hf.endswith(".dt_bias"):
                a = retile(a, 0, hk, r, 1)
            elif "conv1d" in hf:
                a = a.reshape(shape[0], shape[-1])
                a = np.concatenate([a[: 2 * kd], retile(a[2 * kd:], 0, hk, r, dv)], axis=0)
            elif is_norm:
                a = a + 1.0
            w.add_tensor(gname, np.ascontiguousarray(a))
        else:
            a = as_bf16_bits(dtype, shape, raw)
            if r > 1 and ".linear_attn." in hf:
                if ".in_proj_qkv." in hf:
                    a = np.concatenate([a[: 2 * kd], retile(a[2 * kd:], 0, hk, r, dv)], axis=0)
                elif ".in_proj_z." in hf:
                    a = retile(a, 0, hk, r, dv)
                elif ".in_proj_b." in hf or ".in_proj_a." in hf:
                    a = retile(a, 0, hk, r, 1)
                elif ".out_proj." in hf:
                    a = retile(a, 1, hk, r, dv)
            w.add_tensor(gname, a, raw_dtype=gguf.GGMLQuantizationType.BF16)
        written += 1
        if args.untie and hf == "model.embed_tokens.weight" and "lm_head.weight" not in tensors:
            w.add_tensor(names.get_name("lm_head") + ".weight", a, raw_dtype=gguf.GGMLQuantizationType.BF16)
            written += 1

    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    print(f"wrote {written} tensors to {args.out} (layers {layer_types.count('linear_attention')} GDN + "
          f"{layer_types.count('full_attention')} attention)", file=sys.stderr)


if __name__ == "__main__":
    main()
