"""The `gdn` Python module (pip install .) against the golden fixtures and the C++ API's contracts."""

import gc
import threading
import time

import numpy as np
import pytest

import gdn
from _fixtures import LOGIT_TOLERANCE, MODELS, model_dir, reference


def small_context(model, sequences=3, **kw):
    return gdn.Context(model, max_sequences=sequences, max_context=512, threads=2, max_logits_rows=256,
                       max_batch_tokens=512, **kw)


@pytest.fixture(scope="module", params=MODELS)
def model(request):
    return gdn.Model.load(model_dir(request.param)), request.param


def prefill(ctx, tokens):
    seq = ctx.create_sequence()
    batch = gdn.Batch()
    batch.add(seq, tokens, logits=gdn.LogitsFor.all)
    ctx.step(batch)
    out = np.array(ctx.logits())  # a copy: the view is overwritten by the next step
    ctx.free_sequence(seq)
    return out


def test_logits_match_transformers_on_every_fixture_and_prompt(model):
    m, name = model
    ref = reference(name)
    ctx = small_context(m)
    for i in range(6):
        tokens = ref[f"prompt{i}.tokens"]
        got = prefill(ctx, tokens)
        expect = ref[f"prompt{i}.logits"]
        assert got.shape == expect.shape
        assert np.abs(got - expect).max() <= LOGIT_TOLERANCE, f"{name} prompt {i}"


def test_model_and_config():
    m = gdn.Model.load(model_dir("qwen35_cond_mtp"))
    c = m.config
    assert c.architecture == "Qwen3_5ForConditionalGeneration"
    assert (c.vocab_size, c.hidden_size, c.num_layers) == (256, 48, 4)
    assert c.layer_types == [gdn.LayerKind.linear_attention] * 3 + [gdn.LayerKind.full_attention]
    assert c.count_layers(gdn.LayerKind.linear_attention) == 3
    assert m.has_mtp and not c.tie_word_embeddings
    assert isinstance(c.eos_token_ids, list)
    assert m.path == model_dir("qwen35_cond_mtp")
    assert not gdn.Model.load(model_dir("qwen35_cond_mtp"), load_mtp=False).has_mtp
    del m
    gc.collect()
    assert c.vocab_size == 256  # the config keeps its model alive


def test_logits_are_read_only_views_that_keep_the_context_alive():
    m = gdn.Model.load(model_dir("qwen35_tied"))
    ctx = small_context(m)
    seq = ctx.create_sequence()
    batch = gdn.Batch()
    entry = batch.add(seq, [1, 2, 3, 4], logits=gdn.LogitsFor.all)
    assert entry == 0 and batch.output_rows == 4 and batch.token_count == 4
    ctx.step(batch)
    all_rows = ctx.logits()
    assert all_rows.shape == (4, 256) and all_rows.dtype == np.float32
    assert not all_rows.flags.writeable and all_rows.flags.c_contiguous
    assert isinstance(all_rows.base, gdn.Context)
    row = ctx.logits(batch.last_row(0))
    assert np.shares_memory(row, all_rows) and np.array_equal(row, all_rows[3])
    with pytest.raises(ValueError):
        all_rows[0, 0] = 1.0
    kept = np.array(all_rows)
    del ctx
    gc.collect()
    assert np.array_equal(all_rows, kept)  # the view's base still holds the context
    assert ctx_hidden_shape(m) == (1, 64)


def ctx_hidden_shape(m):
    ctx = small_context(m, sequences=1)
    batch = gdn.Batch()
    batch.add(ctx.create_sequence(), 5)
    ctx.step(batch)
    return ctx.hidden().shape


def test_batched_prompts_and_decode_equal_each_alone_bit_for_bit():
    m = gdn.Model.load(model_dir("qwen35_cond_mtp"))
    ref = reference("qwen35_cond_mtp")
    prompts = [ref["prompt1.tokens"], ref["prompt4.tokens"], ref["prompt5.tokens"]]
    continuation = [3, 141, 59]

    alone = []
    for p in prompts:
        ctx = small_context(m, sequences=1)
        seq = ctx.create_sequence()
        b = gdn.Batch()
        b.add(seq, p)
        ctx.step(b)
        rows = [np.array(ctx.logits(0))]
        for t in continuation:
            b.clear()
            b.add(seq, t)
            ctx.step(b)
            rows.append(np.array(ctx.logits(0)))
        alone.append(np.stack(rows))

    ctx = small_context(m, sequences=3)
    seqs = [ctx.create_sequence() for _ in prompts]
    b = gdn.Batch()
    for s, p in zip(seqs, prompts):
        b.add(s, np.asarray(p, dtype=np.int64))  # any integer array converts
    ctx.step(b)
    together = [[np.array(ctx.logits(b.last_row(i)))] for i in range(3)]
    for t in continuation:
        b.clear()
        for s in seqs:
            b.add(s, t)
        ctx.step(b)
        for i in range(3):
            together[i].append(np.array(ctx.logits(b.last_row(i))))
    for i in range(3):
        assert np.array_equal(np.stack(together[i]), alone[i])
    assert [ctx.sequence_length(s) for s in seqs] == [len(p) + 3 for p in prompts]
    assert ctx.live_sequences == 3


def test_hidden_states_and_mtp_head_match_the_reference():
    m = gdn.Model.load(model_dir("qwen35_cond_mtp"))
    ref = reference("qwen35_cond_mtp")
    tokens = ref["prompt4.tokens"]
    ctx = small_context(m, sequences=1)
    seq = ctx.create_sequence()
    b = gdn.Batch()
    b.add(seq, tokens, logits=gdn.LogitsFor.last, hidden_all=True)
    ctx.step(b)
    hidden = np.array(ctx.hidden())
    assert np.abs(hidden - ref["prompt4.hidden"]).max() <= LOGIT_TOLERANCE
    with pytest.raises(gdn.InvalidArgumentError):
        ctx.logits(0)  # a hidden-only row has no logits
    mb = gdn.Batch()
    mb.add(seq, tokens[1:], logits=gdn.LogitsFor.all)
    ctx.step_mtp(mb, hidden[:-1])
    assert np.abs(ctx.logits() - ref["prompt4.mtp_logits"]).max() <= LOGIT_TOLERANCE
    assert ctx.mtp_length(seq) == len(tokens) - 1


def test_errors_are_exceptions_with_status_and_message():
    assert issubclass(gdn.InvalidTokenError, gdn.Error) and issubclass(gdn.Error, Exception)
    assert gdn.InvalidSequenceError.status == gdn.Status.invalid_sequence
    with pytest.raises(gdn.IoError) as e:
        gdn.Model.load("/nonexistent/checkpoint")
    assert e.value.status == gdn.Status.io_error and "/nonexistent/checkpoint" in str(e.value)

    m = gdn.Model.load(model_dir("qwen35_tied"))
    ctx = small_context(m, sequences=1)
    seq = ctx.create_sequence()
    with pytest.raises(gdn.OutOfCapacityError):
        ctx.create_sequence()
    b = gdn.Batch()
    b.add(seq, [1, 2, 256])
    with pytest.raises(gdn.InvalidTokenError, match="256") as e:
        ctx.step(b)
    assert e.value.status == gdn.Status.invalid_token
    assert ctx.sequence_length(seq) == 0  # a refused step changes nothing
    b.clear()
    b.add(seq, [1] * 600)
    with pytest.raises(gdn.ContextOverflowError):
        ctx.step(b)
    ctx.free_sequence(seq)
    with pytest.raises(gdn.InvalidSequenceError):
        ctx.sequence_length(seq)
    with pytest.raises(gdn.UnsupportedModelError):
        ctx.step_mtp(b, np.zeros((600, 64), np.float32))
    with pytest.raises(IndexError):
        b.last_row(5)
    with pytest.raises(gdn.InvalidArgumentError):
        gdn.Context(m, max_sequences=0)


def test_state_control_is_reachable():
    m = gdn.Model.load(model_dir("qwen35_tied"))
    ctx = small_context(m, sequences=2)
    seq = ctx.create_sequence()
    b = gdn.Batch()
    b.add(seq, [1, 2, 3])
    ctx.step(b)
    snap = ctx.snapshot(seq)
    fork = ctx.create_sequence_from(snap)
    assert ctx.sequence_length(fork) == 3
    ctx.free_snapshot(snap)


def test_step_releases_the_gil():
    m = gdn.Model.load(model_dir("qwen35_tied"))
    ctx = gdn.Context(m, max_sequences=1, max_context=2048, threads=1, max_batch_tokens=512)
    seq = ctx.create_sequence()
    b = gdn.Batch()
    b.add(seq, np.arange(2000) % 256, logits=gdn.LogitsFor.none)
    window = {}

    def run():
        window["begin"] = time.perf_counter()
        ctx.step(b)
        window["end"] = time.perf_counter()

    t = threading.Thread(target=run)
    stamps = []
    t.start()
    while t.is_alive():
        stamps.append(time.perf_counter())
    t.join()
    # This thread ran Python code while the other was inside step(): impossible with the GIL held.
    inside = [s for s in stamps if window["begin"] < s < window["end"]]
    assert inside, f"no progress during a {1e3 * (window['end'] - window['begin']):.1f} ms step"


def test_doctor_report():
    report = gdn.doctor(model_dir("qwen35_tied"), quick=True, threads=2)
    assert report["ok"] and report["counts"]["FAIL"] == 0
    checks = {c["name"]: c for c in report["checks"]}
    assert checks["identity.chunked_vs_recurrent"]["verdict"] == "PASS"
    assert checks["identity.chunked_vs_recurrent"]["measured"] <= 1e-3
    bad = gdn.doctor(model_dir("qwen35_tied"), quick=True, threads=2, state_dtype=gdn.DType.bf16)
    assert not bad["ok"]
    assert {c["name"]: c for c in bad["checks"]}["config.state_dtype"]["verdict"] == "FAIL"
