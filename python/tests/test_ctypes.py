"""The bare shared library through ctypes (examples/python_ctypes.py's declarations), against the
same fixtures: logits, zero-copy pointers, statuses and messages, struct sizes."""

import ctypes as C
import re
import sys

import numpy as np
import pytest

from _fixtures import LOGIT_TOLERANCE, REPO, library_path, model_dir, reference

sys.path.insert(0, str(REPO / "examples"))
import python_ctypes as g  # noqa: E402

F = C.POINTER(C.c_float)


@pytest.fixture(scope="module")
def lib():
    return g.load_library(library_path())


def load(lib, name):
    model = C.c_void_p()
    g.check(lib, lib.gdn_model_load(model_dir(name).encode(), None, C.byref(model)), "load")
    return model


def context(lib, model, sequences=2):
    p = g.ContextParams(size=C.sizeof(g.ContextParams))
    g.check(lib, lib.gdn_context_params_init(C.byref(p)), "init")
    p.max_sequences, p.max_context, p.threads, p.max_logits_rows, p.max_batch_tokens = sequences, 512, 2, 256, 512
    ctx = C.c_void_p()
    g.check(lib, lib.gdn_context_create(model, C.byref(p), C.byref(ctx)), "create")
    return ctx


def test_abi_version_matches_the_header(lib):
    header = (REPO / "capi" / "gdn.h").read_text()
    assert lib.gdn_abi_version() == int(re.search(r"#define GDN_ABI_VERSION (\d+)", header).group(1))
    assert re.fullmatch(rb"\d+\.\d+\.\d+", lib.gdn_version_string())


@pytest.mark.parametrize("name", ["qwen35_tied", "qwen3next_dense"])
def test_logits_match_transformers(lib, name):
    ref = reference(name)
    model = load(lib, name)
    ctx = context(lib, model)
    batch = C.c_void_p()
    g.check(lib, lib.gdn_batch_init(1, 256, C.byref(batch)), "batch")
    for i in range(6):
        tokens = np.ascontiguousarray(ref[f"prompt{i}.tokens"], dtype=np.int32)
        expect = ref[f"prompt{i}.logits"]
        seq, row = g.gdn_seq_id(), C.c_int64()
        g.check(lib, lib.gdn_seq_create(ctx, C.byref(seq)), "seq")
        g.check(lib, lib.gdn_batch_clear(batch), "clear")
        g.check(lib, lib.gdn_batch_add(batch, seq, tokens.ctypes.data_as(C.POINTER(g.gdn_token)), len(tokens),
                                       g.GDN_LOGITS_ALL, 0, C.byref(row)), "add")
        g.check(lib, lib.gdn_context_step(ctx, batch), "step")
        got = np.empty(expect.shape, np.float32)
        g.check(lib, lib.gdn_context_copy_logits(ctx, 0, len(tokens), got.ctypes.data_as(F), got.size), "copy")
        assert np.abs(got - expect).max() <= LOGIT_TOLERANCE
        # The pointer accessor: the same rows, readable in place without a copy.
        ptr = F()
        g.check(lib, lib.gdn_context_get_logits(ctx, 0, C.byref(ptr)), "get")
        view = np.ctypeslib.as_array(ptr, shape=expect.shape)
        assert np.array_equal(view, got)
        g.check(lib, lib.gdn_seq_free(ctx, seq), "free")
    lib.gdn_batch_free(batch)
    lib.gdn_context_free(ctx)
    lib.gdn_model_free(model)


def test_statuses_and_messages(lib):
    model = C.c_void_p()
    assert lib.gdn_model_load(b"/nonexistent", None, C.byref(model)) == 2  # GDN_STATUS_IO_ERROR
    assert b"/nonexistent" in lib.gdn_last_error()
    assert lib.gdn_status_string(2) == b"io_error"
    assert model.value is None
    assert lib.gdn_context_step(None, None) == 1  # NULL handle: INVALID_ARGUMENT, no crash
    assert lib.gdn_last_error().startswith(b"gdn_context_step: ")

    model = load(lib, "qwen35_tied")
    assert lib.gdn_last_error() == b""
    p = g.ContextParams(size=0)
    ctx = C.c_void_p()
    assert lib.gdn_context_create(model, C.byref(p), C.byref(ctx)) == 1
    assert b"wrong-size parameter struct" in lib.gdn_last_error()
    # A foreign handle (the model passed as a context) is recognised.
    assert lib.gdn_context_step(model, None) == 1
    ctx = context(lib, model, sequences=1)
    seq = g.gdn_seq_id()
    g.check(lib, lib.gdn_seq_create(ctx, C.byref(seq)), "seq")
    assert lib.gdn_seq_create(ctx, C.byref(g.gdn_seq_id())) == 7  # OUT_OF_CAPACITY
    batch = C.c_void_p()
    g.check(lib, lib.gdn_batch_init(1, 4, C.byref(batch)), "batch")
    bad = (g.gdn_token * 2)(1, 999)
    g.check(lib, lib.gdn_batch_add(batch, seq, bad, 2, g.GDN_LOGITS_LAST, 0, None), "add")
    assert lib.gdn_context_step(ctx, batch) == 10  # INVALID_TOKEN
    assert b"999" in lib.gdn_last_error()
    with pytest.raises(g.GdnError, match="invalid_token"):
        g.check(lib, lib.gdn_context_step(ctx, batch), "step")
    lib.gdn_batch_free(batch)
    lib.gdn_context_free(ctx)
    lib.gdn_model_free(model)


def test_the_ctypes_example_runs(capsys):
    assert g.main(["python_ctypes.py", model_dir("qwen35_cond_mtp"), library_path()]) == 0
    out = capsys.readouterr().out
    assert out.count("\nseq ") == 3 and "Qwen3_5ForConditionalGeneration" in out
