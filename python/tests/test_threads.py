"""Objects shared between Python threads (docs/reliability.md, "Thread-safety rules"): calls on one Context,
Generator, SpeculativeDecoder, Sampler or Batch from several threads take turns, with the GIL
released while they wait, so the results are those of the same work done one thread after
another; a callback that calls back into the context it runs on raises gdn.BusyError instead of
waiting for itself. Before the locks, sharing a Context or a Generator like this crashed the
interpreter (SIGSEGV) within a second."""

import threading

import numpy as np
import pytest

import gdn
from _fixtures import REPO, model_dir

TINY = str(REPO / "models" / "gdn-tiny")
THREADS = 8
PROMPTS = ["reverse 12478 =", "copy 6275 =", "add 31+13=", "reverse 23 =", "copy 46819 =", "add 71+52=",
           "reverse 905 =", "copy 38 ="]


def run_threads(n, work):
    """work(i) on n threads released together; their results, or the first exception raised."""
    results, errors = [None] * n, []
    start = threading.Barrier(n)

    def body(i):
        try:
            start.wait()
            results[i] = work(i)
        except BaseException as e:  # re-raised in the test's thread
            errors.append(e)

    threads = [threading.Thread(target=body, args=(i,)) for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    assert not any(t.is_alive() for t in threads), "a thread is stuck (deadlock)"
    if errors:
        raise errors[0]
    return results


@pytest.fixture(scope="module")
def tied():
    return gdn.Model.load(model_dir("qwen35_tied"))


@pytest.fixture(scope="module")
def tiny():
    return gdn.Model.load(TINY), gdn.Tokenizer.from_model_dir(TINY)


def prompt_for(i):
    return [(i * 131 + k * 37) % 256 for k in range(5 + 3 * i)]


def greedy_steps(ctx, seq, prompt, n):
    """n greedy tokens for seq; each step and the reading of its logits in one turn (hold)."""
    batch = gdn.Batch()
    batch.add(seq, prompt)
    out = []
    for _ in range(n):
        with ctx.hold():
            ctx.step(batch)
            out.append(int(np.argmax(ctx.logits(batch.last_row(0)))))
        batch.clear()
        batch.add(seq, out[-1])
    return out


def feed(ctx, seq, i):
    """Ten steps of one token for seq, no logits; returns the lengths read back after each."""
    b = gdn.Batch()
    lengths = []
    for t in range(10):
        b.clear()
        b.add(seq, (i * 7 + t * 13) % 256, logits=gdn.LogitsFor.none)
        ctx.step(b)
        lengths.append(ctx.sequence_length(seq))
    return lengths


def test_threads_sharing_a_context_step_as_they_would_in_turn(tied):
    alone = []
    for i in range(THREADS):
        ctx = gdn.Context(tied, max_sequences=1, max_context=128, threads=1)
        alone.append(greedy_steps(ctx, ctx.create_sequence(), prompt_for(i), 12))
    shared = gdn.Context(tied, max_sequences=THREADS, max_context=128, threads=1)
    got = run_threads(THREADS, lambda i: greedy_steps(shared, shared.create_sequence(), prompt_for(i), 12))
    assert got == alone
    assert shared.live_sequences == THREADS

    # Without hold(): each call is still one turn, so every sequence ends exactly where its own steps
    # put it, whatever the other threads' steps did in between.
    shared = gdn.Context(tied, max_sequences=THREADS, max_context=128, threads=1)
    seqs = [shared.create_sequence() for _ in range(THREADS)]
    lengths = run_threads(THREADS, lambda i: feed(shared, seqs[i], i))
    assert lengths == [list(range(1, 11))] * THREADS
    for i in range(THREADS):
        one = gdn.Context(tied, max_sequences=THREADS, max_context=128, threads=1)
        s = one.create_sequence()
        feed(one, s, i)
        for ctx, seq in ((shared, seqs[i]), (one, s)):
            b = gdn.Batch()
            b.add(seq, 3)
            ctx.step(b)
        assert np.array_equal(shared.logits(0), one.logits(0)), f"thread {i}"


def test_threads_sharing_a_generator_generate_as_they_would_in_turn(tiny):
    model, tok = tiny
    ctx = gdn.Context(model, max_sequences=2, max_context=128, threads=1)  # one slot for generate, one for steps
    gen = gdn.Generator(ctx, tok)
    params = gdn.GenerationParams(max_tokens=12)
    prompts = [tok.encode(p) for p in PROMPTS]
    alone = [gen.generate(p, params).tokens for p in prompts]
    seq = ctx.create_sequence()
    steps_alone = greedy_steps(ctx, seq, prompts[0], 8)
    ctx.free_sequence(seq)

    def work(i):
        if i == THREADS:  # meanwhile, direct steps on the context the Generator drives
            return greedy_steps(ctx, ctx.create_sequence(), prompts[0], 8)
        out = []
        for _ in range(2):
            pieces = []
            r = gen.generate(prompts[i], params, on_text=lambda _, text: pieces.append(text))
            assert "".join(pieces) == r.text
            out.append(r.tokens)
        return out

    got = run_threads(THREADS + 1, work)
    assert got[:THREADS] == [[a, a] for a in alone]
    assert got[THREADS] == steps_alone
    assert ctx.live_sequences == 1


def test_a_callback_calling_into_its_context_raises_busy(tiny):
    model, tok = tiny
    ctx = gdn.Context(model, max_sequences=2, max_context=128, threads=1)
    gen = gdn.Generator(ctx, tok)
    prompt = tok.encode("reverse 12478 =")
    batch = gdn.Batch()
    raised = []

    def intrude(i, text):
        for call in (ctx.create_sequence, lambda: ctx.step(batch), ctx.logits, lambda: ctx.live_sequences,
                     lambda: gen.generate(prompt), lambda: ctx.hold().__enter__()):
            with pytest.raises(gdn.BusyError) as e:
                call()
            raised.append(e.value)
        return True

    r = gen.generate(prompt, gdn.GenerationParams(max_tokens=12), on_text=intrude)
    assert r.text == "87421"  # the refused calls changed nothing
    assert len(raised) >= 6 and all(e.status == gdn.Status.busy for e in raised)
    assert issubclass(gdn.BusyError, gdn.Error)
    assert "Context.create_sequence: the context is in use by the call whose callback is running on this thread" in str(raised[0])

    # Inside this thread's own hold() the context is this thread's, but a callback still may not use it.
    with ctx.hold():
        with ctx.hold():
            s = ctx.create_sequence()
        raised.clear()
        assert gen.generate(prompt, gdn.GenerationParams(max_tokens=12), on_text=intrude).text == "87421"
        assert len(raised) >= 6
        ctx.free_sequence(s)
    assert ctx.live_sequences == 0
    with pytest.raises(gdn.InvalidArgumentError, match="not held by this thread"):
        ctx.hold().__exit__(None, None, None)


def test_a_view_kept_across_another_threads_step_reads_stale_numbers(tied):
    ctx = gdn.Context(tied, max_sequences=2, max_context=128, threads=1, max_logits_rows=1)
    a, b = ctx.create_sequence(), ctx.create_sequence()
    first = gdn.Batch()
    first.add(a, [1, 2, 3])
    ctx.step(first)
    view = ctx.logits(0)
    kept = np.array(view)

    def grow():  # 20 rows outgrow the 1-row buffer: the context moves its outputs
        big = gdn.Batch()
        big.add(b, list(range(20)), logits=gdn.LogitsFor.all)
        ctx.step(big)

    run_threads(1, lambda _: grow())
    assert ctx.logits().shape == (20, tied.config.vocab_size)
    assert np.array_equal(view, kept)  # the outgrown buffer is kept as it was, not freed

    view = ctx.logits(0)
    again = gdn.Batch()
    again.add(a, 4)
    run_threads(1, lambda _: ctx.step(again))
    assert np.array_equal(view, ctx.logits(0))  # same buffer: the view shows the newer step


def test_a_sampler_shared_with_a_speculative_decoder_and_a_batch_changed_during_steps(tiny):
    model, tok = tiny
    prompt = tok.encode("reverse 12478 =")

    def speculate(sampler):
        ctx = gdn.Context(model, max_sequences=1, max_context=128, threads=1, max_rollback_tokens=4)
        spec = gdn.SpeculativeDecoder(ctx, max_draft=3, adaptive=False)
        seq = ctx.create_sequence()
        out = [spec.start(seq, prompt, sampler)]
        while 0 not in out and len(out) < 12:
            out += spec.advance([seq])[0]
        spec.finish(seq)
        return out

    V = model.config.vocab_size
    alone = speculate(gdn.Sampler(gdn.SamplingParams(), V))
    sampler = gdn.Sampler(gdn.SamplingParams(), V)
    logits = np.random.default_rng(1).standard_normal(V).astype(np.float32)
    done = threading.Event()

    def work(i):
        if i == 0:
            try:
                return speculate(sampler)
            finally:
                done.set()
        n = 0
        while not done.is_set() and n < 5000:  # distribution() works in the sampler's scratch, as advance() does
            assert sampler.distribution(logits).argmax() == logits.argmax()
            n += 1
        return n

    assert run_threads(2, work)[0] == alone

    # A batch changed by one thread while another steps with it: each step sees the batch before
    # or after a change, never during one.
    ctx = gdn.Context(model, max_sequences=1, max_context=4096, threads=1)
    seq = ctx.create_sequence()
    batch = gdn.Batch()
    batch.add(seq, prompt)
    outcomes = []

    def race(i):
        for _ in range(100):
            if i == 0:
                try:
                    ctx.step(batch)
                    outcomes.append("ok")
                except gdn.Error as e:  # e.g. the sequence twice in the batch, or past max_context
                    outcomes.append(type(e).__name__)
            else:
                batch.clear()
                batch.add(seq, prompt[: 1 + len(outcomes) % len(prompt)])

    run_threads(2, race)
    assert len(outcomes) == 100
