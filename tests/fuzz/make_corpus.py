#!/usr/bin/env python3
"""Writes the seed corpora of tests/fuzz/corpus/ from the fixtures (run from anywhere; stdlib only).

fuzz_safetensors: the real headers of the fixture checkpoints with every dimension shrunk to at most 2
  (names, dtypes, key order and metadata as saved by transformers; offsets repacked; zero data), a
  small subset with the real shapes, and a few hand-made edge cases.
fuzz_config: every fixture config.json plus a Qwen3-Next-style and a minimal top-level config.
fuzz_tokenizer: small byte-level BPE tokenizers (the tokenizer tests' base vocabulary under several
  normalizer / pre-tokenizer variants).
fuzz_state_file: real saved sequences, written by the fuzz target itself:
  GDN_FUZZ_WRITE_SEEDS=tests/fuzz/corpus/fuzz_state_file build-fuzz/bin/fuzz_state_file
"""
import json
import os
import struct
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent.parent
MODELS = ROOT / "tests" / "fixtures" / "models"
OUT = HERE / "corpus"
DSIZE = {"F32": 4, "F16": 2, "BF16": 2, "I32": 4, "I64": 8, "U8": 1, "I8": 1, "I16": 2, "F64": 8, "BOOL": 1}


def read_header(path):
    b = path.read_bytes()
    n = struct.unpack("<Q", b[:8])[0]
    return json.loads(b[8:8 + n])


def safetensors(entries, metadata=None):
    """entries: list of (name, dtype, shape); offsets packed in order."""
    h, off = {}, 0
    if metadata is not None:
        h["__metadata__"] = metadata
    for name, dt, shape in entries:
        n = DSIZE[dt]
        for d in shape:
            n *= d
        h[name] = {"dtype": dt, "shape": shape, "data_offsets": [off, off + n]}
        off += n
    text = json.dumps(h, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)
    return struct.pack("<Q", len(text)) + text + bytes(off)


_seen = set()


def write(target, name, data):
    data = data if isinstance(data, bytes) else data.encode()
    if (target, data) in _seen:
        return
    _seen.add((target, data))
    p = OUT / target / name
    p.parent.mkdir(parents=True, exist_ok=True)
    p.write_bytes(data)


def main():
    for model in sorted(MODELS.iterdir()):
        shards = sorted(model.glob("*.safetensors"))
        h = read_header(shards[0])
        meta = h.pop("__metadata__", None)
        tensors = [(k, v["dtype"], v["shape"]) for k, v in h.items()]
        write("fuzz_safetensors", f"{model.name}_shrunk.safetensors",
              safetensors([(k, dt, [min(d, 2) for d in s]) for k, dt, s in tensors], meta))
        small = [(k, dt, s) for k, dt, s in tensors if len(s) == 1][:6]
        write("fuzz_safetensors", f"{model.name}_vectors.safetensors", safetensors(small, meta))
        write("fuzz_config", f"{model.name}.json", (model / "config.json").read_text())
    write("fuzz_safetensors", "empty.safetensors", safetensors([]))
    write("fuzz_safetensors", "scalar_and_empty.safetensors",
          safetensors([("s", "F32", []), ("z", "BF16", [0, 4]), ("b", "BOOL", [3]), ("i", "I64", [1, 1])], {"format": "pt"}))
    write("fuzz_safetensors", "header_only_len.bin", struct.pack("<Q", 2) + b"{}")

    write("fuzz_config", "qwen3next_moe_like.json", json.dumps({
        "architectures": ["Qwen3NextForCausalLM"], "model_type": "qwen3_next", "hidden_size": 64,
        "num_hidden_layers": 4, "vocab_size": 256, "intermediate_size": 128, "num_attention_heads": 4,
        "num_key_value_heads": 2, "head_dim": 32, "linear_num_key_heads": 2, "linear_num_value_heads": 4,
        "linear_key_head_dim": 16, "linear_value_head_dim": 32, "full_attention_interval": 4,
        "num_experts": 0, "decoder_sparse_step": 1, "mlp_only_layers": [], "partial_rotary_factor": 0.25,
        "rope_theta": 10000000, "eos_token_id": [1, 2], "mtp_num_hidden_layers": 1}))
    write("fuzz_config", "minimal_top_level.json", json.dumps({
        "model_type": "qwen3_5_text", "hidden_size": 8, "num_hidden_layers": 1, "vocab_size": 4,
        "intermediate_size": 8, "num_attention_heads": 1, "num_key_value_heads": 1,
        "linear_num_key_heads": 1, "linear_num_value_heads": 1, "linear_key_head_dim": 2,
        "linear_value_head_dim": 2, "rope_scaling": {"type": "default"}}))

    features = json.loads((ROOT / "tests" / "tokenizer" / "tokenizer_features.json").read_text())
    base = features["base"]
    write("fuzz_tokenizer", "base.json", json.dumps(base))
    for cfg in features["configs"][:6]:
        t = dict(base)
        for key in ("normalizer", "pre_tokenizer", "decoder", "post_processor"):
            if key in cfg:
                t[key] = cfg[key]
        if "ignore_merges" in cfg:
            t["model"] = dict(base["model"], ignore_merges=cfg["ignore_merges"])
        write("fuzz_tokenizer", f"{cfg['name']}.json", json.dumps(t))
    vocab = {chr(c): i for i, c in enumerate(range(33, 127))}
    vocab.update({"ab": len(vocab), "abc": len(vocab) + 1})
    write("fuzz_tokenizer", "tiny.json", json.dumps({
        "version": "1.0", "added_tokens": [{"id": 200, "content": "<|im_start|>", "single_word": False, "lstrip": False,
                                            "rstrip": False, "normalized": False, "special": True}],
        "normalizer": None, "pre_tokenizer": {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": False,
                                              "use_regex": True},
        "post_processor": None, "decoder": {"type": "ByteLevel"},
        "model": {"type": "BPE", "vocab": vocab, "merges": ["a b", "ab c"]}}))


if __name__ == "__main__":
    main()
