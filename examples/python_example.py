#!/usr/bin/env python3
"""libgdn from Python through the `gdn` module (pip install .).

    python3 examples/python_example.py MODEL_DIR

Loads a checkpoint, runs three prompts of different lengths in one step, then decodes the three
sequences together, greedily, one token each per step; prints the same lines as the C, C++ and
ctypes examples. Errors are gdn.Error subclasses carrying .status and the library's message.
"""

import sys

import numpy as np

import gdn


def main(argv):
    if len(argv) != 2:
        print("usage: python_example.py MODEL_DIR", file=sys.stderr)
        return 2
    model = gdn.Model.load(argv[1])
    cfg = model.config
    print(f"model: {cfg.architecture}, {cfg.num_layers} layers "
          f"({cfg.count_layers(gdn.LayerKind.linear_attention)} gated deltanet, "
          f"{cfg.count_layers(gdn.LayerKind.full_attention)} attention), vocab {cfg.vocab_size}")

    prompts = [[1, 2, 3, 4, 5], [42], [7, 99, 13, 200, 31, 64, 5, 150, 18, 77, 3]]
    n_decode = 8
    ctx = gdn.Context(model, max_sequences=len(prompts), max_context=256, threads=2)

    # One step: every prompt at once, logits of each prompt's last token.
    seqs = [ctx.create_sequence() for _ in prompts]
    batch = gdn.Batch()
    for seq, prompt in zip(seqs, prompts):
        batch.add(seq, prompt, logits=gdn.LogitsFor.last)
    ctx.step(batch)  # the GIL is released while the step runs
    # ctx.logits() is a [rows, vocab] numpy view of the context's buffer: no copy, valid until the
    # next step.
    out = [[int(np.argmax(ctx.logits(batch.last_row(i))))] for i in range(len(seqs))]

    # Then all sequences decode together, one token each per step.
    for _ in range(1, n_decode):
        batch.clear()
        for seq, tokens in zip(seqs, out):
            batch.add(seq, tokens[-1])
        ctx.step(batch)
        for i, tokens in enumerate(out):
            tokens.append(int(np.argmax(ctx.logits(batch.last_row(i)))))

    for i, (seq, tokens) in enumerate(zip(seqs, out)):
        print(f"seq {i} ({ctx.sequence_length(seq)} positions): " + " ".join(map(str, tokens)))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
