#!/usr/bin/env python3
"""libgdn from Python with nothing compiled: ctypes drives the bare shared library through gdn.h.

    python3 examples/python_ctypes.py MODEL_DIR [LIBGDN]

LIBGDN is the path of libgdn.so (default: $GDN_LIBRARY, else build/lib/libgdn.so). Loads a
checkpoint, runs three prompts of different lengths in one step, then decodes the three sequences
together, greedily; prints the same lines as the C, C++ and Python examples. Only the standard
library is used. The declarations below mirror capi/gdn.h; `load_library` is reused by the tests.
"""

import ctypes as C
import os
import sys

GDN_STATUS_OK = 0
GDN_LOGITS_NONE, GDN_LOGITS_LAST, GDN_LOGITS_ALL = 0, 1, 2
gdn_seq_id = C.c_uint64
gdn_token = C.c_int32


class ModelConfig(C.Structure):
    _fields_ = [("size", C.c_uint32)] + [
        (name, C.c_int32)
        for name in (
            "vocab_size hidden_size intermediate_size num_layers num_linear_attention_layers "
            "num_full_attention_layers num_attention_heads num_key_value_heads head_dim rotary_dim "
            "linear_num_key_heads linear_num_value_heads linear_key_head_dim linear_value_head_dim "
            "linear_conv_kernel_dim mtp_num_hidden_layers max_position_embeddings"
        ).split()
    ] + [
        ("tie_word_embeddings", C.c_bool),
        ("has_mtp", C.c_bool),
        ("rms_norm_eps", C.c_float),
        ("rope_theta", C.c_double),
        ("state_dtype", C.c_int),
        ("n_eos_token_ids", C.c_int32),
        ("eos_token_ids", C.POINTER(gdn_token)),
        ("architecture", C.c_char_p),
        ("model_type", C.c_char_p),
    ]


class ContextParams(C.Structure):
    _fields_ = [
        ("size", C.c_uint32),
        ("max_sequences", C.c_int32),
        ("max_context", C.c_int32),
        ("kv_page_size", C.c_int32),
        ("kv_pages", C.c_int64),
        ("max_batch_tokens", C.c_int32),
        ("max_logits_rows", C.c_int32),
        ("state_dtype", C.c_int),
        ("threads", C.c_int32),
        ("gdn_chunk_min_tokens", C.c_int32),
        ("max_rollback_tokens", C.c_int32),
        ("backend", C.c_int),
    ]


class GdnError(RuntimeError):
    def __init__(self, lib, status, what):
        self.status = status
        super().__init__(f"{what}: {lib.gdn_status_string(status).decode()}: {lib.gdn_last_error().decode()}")


def load_library(path):
    """Opens libgdn.so and declares the prototypes of gdn.h used here."""
    lib = C.CDLL(path)
    P = C.POINTER
    handle = C.c_void_p
    protos = {
        "gdn_abi_version": (C.c_uint32, []),
        "gdn_version_string": (C.c_char_p, []),
        "gdn_status_string": (C.c_char_p, [C.c_int]),
        "gdn_last_error": (C.c_char_p, []),
        "gdn_model_load": (C.c_int, [C.c_char_p, C.c_void_p, P(handle)]),
        "gdn_model_free": (None, [handle]),
        "gdn_model_get_config": (C.c_int, [handle, P(ModelConfig)]),
        "gdn_context_params_init": (C.c_int, [P(ContextParams)]),
        "gdn_context_create": (C.c_int, [handle, P(ContextParams), P(handle)]),
        "gdn_context_free": (None, [handle]),
        "gdn_seq_create": (C.c_int, [handle, P(gdn_seq_id)]),
        "gdn_seq_reset": (C.c_int, [handle, gdn_seq_id]),
        "gdn_seq_free": (C.c_int, [handle, gdn_seq_id]),
        "gdn_seq_length": (C.c_int, [handle, gdn_seq_id, P(C.c_int64)]),
        "gdn_batch_init": (C.c_int, [C.c_int32, C.c_int64, P(handle)]),
        "gdn_batch_free": (None, [handle]),
        "gdn_batch_clear": (C.c_int, [handle]),
        "gdn_batch_add": (C.c_int, [handle, gdn_seq_id, P(gdn_token), C.c_int64, C.c_int, C.c_uint32, P(C.c_int64)]),
        "gdn_context_step": (C.c_int, [handle, handle]),
        "gdn_context_n_outputs": (C.c_int, [handle, P(C.c_int64)]),
        "gdn_context_get_logits": (C.c_int, [handle, C.c_int64, P(P(C.c_float))]),
        "gdn_context_copy_logits": (C.c_int, [handle, C.c_int64, C.c_int64, P(C.c_float), C.c_int64]),
    }
    for name, (restype, argtypes) in protos.items():
        fn = getattr(lib, name)
        fn.restype, fn.argtypes = restype, argtypes
    return lib


def check(lib, status, what):
    if status != GDN_STATUS_OK:
        raise GdnError(lib, status, what)


def default_library():
    return os.environ.get("GDN_LIBRARY") or os.path.join(os.path.dirname(__file__), "..", "build", "lib", "libgdn.so")


def main(argv):
    if len(argv) not in (2, 3):
        print(__doc__.strip().splitlines()[2].strip(), file=sys.stderr)
        return 2
    lib = load_library(argv[2] if len(argv) == 3 else default_library())

    model = C.c_void_p()
    check(lib, lib.gdn_model_load(argv[1].encode(), None, C.byref(model)), "gdn_model_load")
    cfg = ModelConfig(size=C.sizeof(ModelConfig))
    check(lib, lib.gdn_model_get_config(model, C.byref(cfg)), "gdn_model_get_config")
    print(f"model: {cfg.architecture.decode()}, {cfg.num_layers} layers ({cfg.num_linear_attention_layers} gated "
          f"deltanet, {cfg.num_full_attention_layers} attention), vocab {cfg.vocab_size}")

    prompts = [[1, 2, 3, 4, 5], [42], [7, 99, 13, 200, 31, 64, 5, 150, 18, 77, 3]]
    n_decode = 8
    # From ctypes the by-value gdn_context_default_params() helper (static inline) is not there:
    # set .size and call the exported initialiser.
    params = ContextParams(size=C.sizeof(ContextParams))
    check(lib, lib.gdn_context_params_init(C.byref(params)), "gdn_context_params_init")
    params.max_sequences, params.max_context, params.threads = len(prompts), 256, 2
    ctx = C.c_void_p()
    check(lib, lib.gdn_context_create(model, C.byref(params), C.byref(ctx)), "gdn_context_create")
    batch = C.c_void_p()
    check(lib, lib.gdn_batch_init(len(prompts), 64, C.byref(batch)), "gdn_batch_init")

    def argmax(row):
        logits = C.POINTER(C.c_float)()
        check(lib, lib.gdn_context_get_logits(ctx, row, C.byref(logits)), "gdn_context_get_logits")
        values = logits[: cfg.vocab_size]  # the pointer is valid until the next step
        return max(range(cfg.vocab_size), key=values.__getitem__)

    # One step: every prompt at once, logits of each prompt's last token.
    seqs, rows, out = [], [], [[] for _ in prompts]
    for prompt in prompts:
        seq, row = gdn_seq_id(), C.c_int64()
        check(lib, lib.gdn_seq_create(ctx, C.byref(seq)), "gdn_seq_create")
        tokens = (gdn_token * len(prompt))(*prompt)
        check(lib, lib.gdn_batch_add(batch, seq, tokens, len(prompt), GDN_LOGITS_LAST, 0, C.byref(row)), "gdn_batch_add")
        seqs.append(seq)
        rows.append(row.value)
    check(lib, lib.gdn_context_step(ctx, batch), "gdn_context_step")
    for i, row in enumerate(rows):
        out[i].append(argmax(row))

    # Then all sequences decode together, one token each per step.
    for _ in range(1, n_decode):
        check(lib, lib.gdn_batch_clear(batch), "gdn_batch_clear")
        for i, seq in enumerate(seqs):
            token, row = gdn_token(out[i][-1]), C.c_int64()
            check(lib, lib.gdn_batch_add(batch, seq, C.byref(token), 1, GDN_LOGITS_LAST, 0, C.byref(row)), "gdn_batch_add")
            rows[i] = row.value
        check(lib, lib.gdn_context_step(ctx, batch), "gdn_context_step")
        for i, row in enumerate(rows):
            out[i].append(argmax(row))

    for i, seq in enumerate(seqs):
        length = C.c_int64()
        check(lib, lib.gdn_seq_length(ctx, seq, C.byref(length)), "gdn_seq_length")
        print(f"seq {i} ({length.value} positions): " + " ".join(map(str, out[i])))

    lib.gdn_batch_free(batch)
    lib.gdn_context_free(ctx)
    lib.gdn_model_free(model)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
