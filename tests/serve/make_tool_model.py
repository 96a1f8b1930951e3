"""Writes gdn-tool: a checkpoint, in Hugging Face's on-disk format, that answers a chat prompt offering
tools with one fixed tool call (numpy only: CI has numpy, never torch).

    python3 tests/serve/make_tool_model.py models/gdn-tiny OUT_DIR

Why: models/gdn-tiny never writes a tool call, so without this the server's path from the model's
`<tool_call>` text to OpenAI `tool_calls` would be tested only below HTTP.

How it is built from gdn-tiny (same config and shapes, so the engine loads it like any Qwen3.5 text model):
  * Every layer contributes nothing: the output projections of the Gated DeltaNet layers (out_proj), of
    the attention layers (o_proj) and of the MLPs (down_proj) are zero. The layers still run on real
    weights, but the residual stream at the last layer is exactly the input embedding.
  * The model is then a bigram table. Six tokens of a chain get one-hot embeddings in dims 0..5 (every
    other token keeps gdn-tiny's embedding with those dims zeroed), the final norm is the identity
    (Qwen's norms scale by 1 + weight, so weight 0), and an untied lm_head row of the successor reads
    the predecessor's dim with weight LOGIT / sqrt(hidden): after the RMS norm a one-hot row is
    sqrt(hidden) in its dim, so the successor's logit is LOGIT and every other logit is 0. With
    LOGIT = 24 the successor has probability 1 - 512·e^-24 ≈ 1 - 2e-8, so greedy and sampled
    decoding (temperature <= 1) write the same chain.
  * The chain's tokens are non-special added tokens whose contents are whole pieces of the chat text
    (added tokens are cut out of the text first, leftmost-longest, so the same text always becomes the
    same token, also when the call is rendered back into the next turn's prompt):
        "</think>\\n\\n"  (the end of the generation prompt with enable_thinking=false)
        -> "<tool_call>\\n<function=get_weather>\\n"
        -> "<parameter=city>\\nParis\\n</parameter>\\n"
        -> "<parameter=days>\\n3\\n</parameter>\\n"
        -> "</function>\\n</tool_call>"
        -> <|im_end|>
    No token repeats, so a bigram can write it. The call therefore reads
    get_weather(city="Paris", days=3): a string and an integer parameter.
  * The MTP head predicts the same chain one token further: its fc passes the (normed) embedding of
    the next token through unchanged and ignores the hidden state, its layer contributes nothing, and
    it shares the lm_head, so its drafts are the chain's next tokens and are accepted.
A bigram cannot read the tool's result: after a `tool` message the prompt ends with the same token,
so the model calls the tool again. The test checks that turn against offline generation.
"""

import json
import os
import shutil
import struct
import sys

import numpy as np

LOGIT = 24.0

CHAIN = [
    "</think>\n\n",
    "<tool_call>\n<function=get_weather>\n",
    "<parameter=city>\nParis\n</parameter>\n",
    "<parameter=days>\n3\n</parameter>\n",
    "</function>\n</tool_call>",
]
CALL_TEXT = "".join(CHAIN[1:])  # what the model writes before <|im_end|>


def read_safetensors(path):
    with open(path, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        header = json.loads(f.read(n))
        data = f.read()
    tensors = {}
    for name, info in header.items():
        if name == "__metadata__":
            continue
        assert info["dtype"] == "BF16", (name, info["dtype"])
        a, b = info["data_offsets"]
        tensors[name] = np.frombuffer(data[a:b], dtype=np.uint16).reshape(info["shape"]).copy()
    return tensors, header.get("__metadata__")


def write_safetensors(path, tensors, metadata):
    header, blobs, offset = {}, [], 0
    if metadata:
        header["__metadata__"] = metadata
    for name in sorted(tensors):
        blob = np.ascontiguousarray(tensors[name], dtype=np.uint16).tobytes()
        header[name] = {"dtype": "BF16", "shape": list(tensors[name].shape), "data_offsets": [offset, offset + len(blob)]}
        blobs.append(blob)
        offset += len(blob)
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)  # the format pads the header to 8 bytes
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(text)))
        f.write(text)
        for blob in blobs:
            f.write(blob)


def to_bf16(x):
    """float32 -> bfloat16 bits, rounding to nearest even (every value written here is exact anyway)."""
    bits = np.asarray(x, dtype=np.float32).view(np.uint32)
    return ((bits + 0x7FFF + ((bits >> 16) & 1)) >> 16).astype(np.uint16)


def make(tiny_dir, out_dir):
    os.makedirs(out_dir, exist_ok=True)
    config = json.load(open(os.path.join(tiny_dir, "config.json")))
    config["tie_word_embeddings"] = False
    H, V = config["hidden_size"], config["vocab_size"]

    tok = json.load(open(os.path.join(tiny_dir, "tokenizer.json")))
    next_id = 1 + max(max(tok["model"]["vocab"].values()), max(t["id"] for t in tok["added_tokens"]))
    ids = {}
    for text in CHAIN:
        ids[text] = next_id
        tok["added_tokens"].append({"id": next_id, "content": text, "single_word": False, "lstrip": False,
                                    "rstrip": False, "normalized": False, "special": False})
        next_id += 1
    assert next_id <= V, "the added tokens must fit the checkpoint's vocabulary"
    im_end = next(t["id"] for t in tok["added_tokens"] if t["content"] == "<|im_end|>")
    chain_ids = [ids[t] for t in CHAIN] + [im_end]

    w, metadata = read_safetensors(os.path.join(tiny_dir, "model.safetensors"))
    zero_suffixes = ("linear_attn.out_proj.weight", "self_attn.o_proj.weight", "mlp.down_proj.weight")
    for name in w:
        if name.endswith(zero_suffixes):
            w[name][...] = 0
    for name in ("model.norm.weight", "mtp.norm.weight", "mtp.pre_fc_norm_embedding.weight"):
        w[name][...] = 0  # scale 1 + 0

    embed = w["model.embed_tokens.weight"]
    nchain = len(CHAIN)
    embed[:, :nchain] = 0
    for d, t in enumerate(chain_ids[:-1]):
        embed[t, :] = 0
        embed[t, d] = to_bf16(1.0)
    lm_head = np.zeros((V, H), dtype=np.float32)
    for d, succ in enumerate(chain_ids[1:]):
        lm_head[succ, d] = LOGIT / np.sqrt(H)
    w["lm_head.weight"] = to_bf16(lm_head)

    fc = np.zeros((H, 2 * H), dtype=np.float32)
    fc[:, :H] = np.eye(H)  # [norm(embedding of the next token) ; norm(hidden)] -> the embedding
    w["mtp.fc.weight"] = to_bf16(fc)

    write_safetensors(os.path.join(out_dir, "model.safetensors"), w, metadata)
    with open(os.path.join(out_dir, "config.json"), "w") as f:
        json.dump(config, f, indent=2)
    with open(os.path.join(out_dir, "tokenizer.json"), "w") as f:
        json.dump(tok, f, ensure_ascii=False)
    for name in ("tokenizer_config.json", "generation_config.json"):
        shutil.copy(os.path.join(tiny_dir, name), os.path.join(out_dir, name))
    return {"chain_ids": chain_ids, "call_text": CALL_TEXT}


if __name__ == "__main__":
    if len(sys.argv) != 3:
        sys.exit(__doc__.split("\n\n")[1])
    print(json.dumps(make(sys.argv[1], sys.argv[2])))
