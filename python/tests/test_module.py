"""The `gdn` Python module (pip install .) against the golden fixtures and the C++ API's contracts."""

import gc
import gzip
import json
import threading
import time

import numpy as np
import pytest

import gdn
from _fixtures import LOGIT_TOLERANCE, MODELS, REPO, model_dir, reference


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


def test_packed_and_in_place_weights_give_identical_logits():
    # pack_weights (the default) copies the projections into the order the CPU kernel reads them
    # (AMX or AVX-512); in place they are read from the mapping. Bit-identical either way.
    tokens = reference("qwen35_cond_mtp")["prompt5.tokens"]
    got = [prefill(small_context(gdn.Model.load(model_dir("qwen35_cond_mtp"), pack_weights=p)), tokens) for p in (True, False)]
    assert np.array_equal(got[0], got[1])


def test_weights_placement_packed_image_and_memory_plan(tmp_path):
    # weights='in_place' / 'pack' / 'auto', a packed image written by gdn.pack and then mapped:
    # bit-identical logits every way; the memory plan is the context's accounting.
    import shutil
    src = model_dir("qwen35_cond_mtp")
    d = str(tmp_path / "m")
    shutil.copytree(src, d)
    tokens = reference("qwen35_cond_mtp")["prompt5.tokens"]
    in_place = gdn.Model.load(d, weights="in_place")
    assert in_place.weights == "in_place"
    want = prefill(small_context(in_place), tokens)
    try:
        info = gdn.pack(d)
    except gdn.UnsupportedModelError:  # this CPU's kernel reads weights in place (AVX2, scalar)
        info = None
    if info is not None:
        assert info["file_bytes"] > 0 and info["path"].endswith(".gdnimg")
        mapped = gdn.Model.load(d)
        assert mapped.weights == "image"
        assert np.array_equal(prefill(small_context(mapped), tokens), want)
        assert gdn.memory_plan(d)["weights"] == "image"
    assert np.array_equal(prefill(small_context(gdn.Model.load(d, weights="pack")), tokens), want)
    with pytest.raises(gdn.InvalidArgumentError):
        gdn.Model.load(d, weights="sideways")
    plan = gdn.memory_plan(d, max_sequences=3, max_context=200, threads=2)
    ctx = gdn.Context(in_place, max_sequences=3, max_context=200, threads=2)
    assert plan["gdn_recurrent_bytes_per_sequence"] + plan["gdn_conv_bytes_per_sequence"] == ctx.gdn_state_bytes_per_sequence
    assert plan["kv_bytes_per_token"] == ctx.kv_bytes_per_token
    assert plan["context_fits"] and plan["context_bytes"] > 0
    cuda = gdn.memory_plan(d, backend=gdn.Backend.cuda)
    assert cuda["backend"] == "cuda" and cuda["device_weight_bytes"] > 0


def test_quantised_lm_head_policy(tmp_path):
    # quant='q4_0' keeps the lm_head at q8_0 (lm_head_quant='auto'); lm_head_quant='q4_0' quantises
    # it too: another image file, other logits, a smaller plan; bad values name the field.
    import shutil
    d = str(tmp_path / "m")
    shutil.copytree(model_dir("qwen35_cond_mtp"), d)
    tokens = reference("qwen35_cond_mtp")["prompt5.tokens"]
    auto = prefill(small_context(gdn.Model.load(d, quant="q4_0", weights="pack")), tokens)
    q8 = prefill(small_context(gdn.Model.load(d, quant="q4_0", lm_head_quant="q8_0", weights="pack")), tokens)
    all_q4 = prefill(small_context(gdn.Model.load(d, quant="q4_0", lm_head_quant="q4_0", weights="pack")), tokens)
    assert np.array_equal(auto, q8) and not np.array_equal(auto, all_q4)
    info = gdn.pack(d, quant="q4_0", lm_head_quant="q4_0")
    assert info["path"].endswith("gdn-packed.q4_0.lm_head-q4_0.gdnimg")
    mapped = gdn.Model.load(d, quant="q4_0", lm_head_quant="q4_0", weights="image")
    assert np.array_equal(prefill(small_context(mapped), tokens), all_q4)
    plans = [gdn.memory_plan(d, quant="q4_0", lm_head_quant=lm)["packed_bytes"] for lm in ("auto", "q4_0")]
    assert plans[0] > plans[1]
    with pytest.raises(gdn.InvalidArgumentError, match="lm_head_quant 'q5' is not one of"):
        gdn.Model.load(d, quant="q4_0", lm_head_quant="q5")
    with pytest.raises(gdn.InvalidArgumentError, match="lm_head_quant q4_0 needs a quant"):
        gdn.Model.load(d, lm_head_quant="q4_0")
    # quant='q4_k', the fitted 4-bit format: other logits than q4_0's, its own image, mapped == packed.
    q4k = prefill(small_context(gdn.Model.load(d, quant="q4_k", weights="pack")), tokens)
    assert not np.array_equal(q4k, auto)
    assert gdn.pack(d, quant="q4_k")["path"].endswith("gdn-packed.q4_k.gdnimg")
    assert np.array_equal(prefill(small_context(gdn.Model.load(d, quant="q4_k", weights="image")), tokens), q4k)
    assert not np.array_equal(prefill(small_context(gdn.Model.load(d, quant="q4_k_m", weights="pack")), tokens), q4k)


def test_bf16_matmul_inputs_stay_near_the_float32_reference():
    # matmul_input=bf16 rounds the activations entering each projection (tests/test_model_fixtures.cpp
    # holds it to transformers' own bf16 run); here: the option reaches the engine and behaves.
    ref = reference("qwen35_cond_mtp")
    tokens = ref["prompt5.tokens"]
    m = gdn.Model.load(model_dir("qwen35_cond_mtp"))
    exact = prefill(small_context(m), tokens)
    rounded = prefill(small_context(m, matmul_input=gdn.MatmulInput.bf16), tokens)
    assert np.abs(exact - ref["prompt5.logits"].reshape(exact.shape)).max() <= 2e-3
    rms = float(np.sqrt(np.mean((rounded - ref["prompt5.logits"].reshape(exact.shape)) ** 2)))
    assert 0.0 < rms <= 0.15
    assert np.array_equal(rounded, prefill(small_context(m, matmul_input=gdn.MatmulInput.bf16), tokens))
    with pytest.raises(TypeError):
        small_context(m, matmul_input="bf16")


def test_bf16_kv_cache_halves_the_cache_and_stays_near_the_float32_reference():
    # kv_dtype=bf16 rounds keys and values as they enter the cache (tests/test_model_fixtures.cpp
    # bounds it on every fixture); here: the option reaches the engine, the plan and behaves.
    ref = reference("qwen35_cond_mtp")
    tokens = ref["prompt5.tokens"]
    d = model_dir("qwen35_cond_mtp")
    m = gdn.Model.load(d)
    exact_ctx, bf16_ctx = small_context(m), small_context(m, kv_dtype=gdn.DType.bf16)
    assert bf16_ctx.kv_bytes_per_token * 2 == exact_ctx.kv_bytes_per_token
    assert gdn.memory_plan(d, kv_dtype=gdn.DType.bf16)["kv_dtype"] == "BF16"
    assert gdn.memory_plan(d)["kv_dtype"] == "F32"
    exact, rounded = prefill(exact_ctx, tokens), prefill(bf16_ctx, tokens)
    want = ref["prompt5.logits"].reshape(exact.shape)
    rms = float(np.sqrt(np.mean((rounded - want) ** 2)))
    assert 0.0 < float(np.abs(rounded - exact).max()) and rms <= 0.05
    assert np.array_equal(rounded, prefill(small_context(m, kv_dtype=gdn.DType.bf16), tokens))
    with pytest.raises(TypeError):
        small_context(m, kv_dtype="bf16")


def test_logits_are_read_only_views_that_keep_the_context_alive():
    m = gdn.Model.load(model_dir("qwen35_tied"))
    ctx = small_context(m)
    seq = ctx.create_sequence()
    batch = gdn.Batch()
    entry = batch.add(seq, [1, 2, 3, 4], logits=gdn.LogitsFor.all)
    assert entry == 0 and batch.output_rows == 4 and batch.token_count == 4
    assert batch.tokens.tolist() == [1, 2, 3, 4]
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
    # No GPU where the tests run (or no nvcc when libgdn was built): the CUDA backend says why.
    with pytest.raises(gdn.BackendUnavailableError, match="the CUDA backend is not available"):
        gdn.Context(m, max_sequences=1, backend=gdn.Backend.cuda)
    with pytest.raises(gdn.BackendUnavailableError):
        gdn.Model.load(model_dir("qwen35_tied"), backend=gdn.Backend.cuda)


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


# --- text: tokenizer, chat template, sampling, generation, speculative decoding -----------------

TINY = str(REPO / "models" / "gdn-tiny")
TOKENIZER_ASSETS = REPO / "tests" / "tokenizer"


@pytest.fixture(scope="module")
def qwen_tokenizer():
    json_text = gzip.open(REPO / "tests" / "assets" / "qwen35_tokenizer" / "tokenizer.json.gz").read().decode()
    return gdn.Tokenizer.from_json(json_text)


@pytest.fixture(scope="module")
def tiny():
    model = gdn.Model.load(TINY)
    tok = gdn.Tokenizer.from_model_dir(TINY)
    ctx = gdn.Context(model, max_sequences=3, max_context=256, threads=2, max_rollback_tokens=4)
    return model, tok, ctx, gdn.Generator(ctx, tok)


def heldout(n):
    with open(f"{TINY}/eval/heldout.jsonl") as f:
        return [json.loads(line) for line in f if line.strip()][:n]


def test_tokenizer_ids_equal_hugging_face_on_the_parity_corpus(qwen_tokenizer):
    tok = qwen_tokenizer
    assert tok.vocab_size > 150000
    with gzip.open(TOKENIZER_ASSETS / "tokenizer_parity.jsonl.gz", "rt") as f:
        rows = [json.loads(line) for line in f]
    cjk = emoji = 0
    for row in rows:
        assert tok.encode(row["text"]) == row["ids"], row["text"]
        assert tok.decode(row["ids"]) == row["decoded"]
        cjk += any("\u4e00" <= c <= "\u9fff" for c in row["text"])
        emoji += any(ord(c) >= 0x1F300 for c in row["text"])
    assert len(rows) > 10000 and cjk > 50 and emoji > 20  # the corpus really covers CJK and emoji


def test_tokenizer_special_tokens_lookup_and_stream_decoding(qwen_tokenizer):
    tok = qwen_tokenizer
    chat = "<|im_start|>user\nhi<|im_end|>"
    ids = tok.encode(chat)
    im_start = tok.token_to_id("<|im_start|>")
    assert ids[0] == im_start and tok.is_special(im_start) and tok.id_to_token(im_start) == "<|im_start|>"
    assert len(tok.encode(chat, parse_special=False)) > len(ids)
    assert tok.decode(ids) == chat and tok.decode(ids, skip_special=True) == "user\nhi"
    assert tok.token_to_id("no such token!") is None

    text = "emoji 🦀🚀 family 👩‍👩‍👧 and 中文分词测试，日本語のテキスト"
    ids = tok.encode(text)
    dec = tok.stream_decoder()
    pieces = [dec.push(t) for t in ids]
    assert "".join(pieces) + dec.flush() == text == tok.decode(ids)
    assert "" in pieces  # bytes of a split character were held back
    crab = tok.encode("🦀")
    assert len(crab) > 1 and dec.push(crab[0]) == "" and dec.pending_bytes > 0
    dec.reset()
    assert dec.flush() == ""

    with pytest.raises(gdn.InvalidTokenError):
        tok.decode([tok.vocab_size])
    with pytest.raises(gdn.InvalidTokenError):
        dec.push(-1)
    with pytest.raises(gdn.IoError):
        gdn.Tokenizer.from_file("/nonexistent/tokenizer.json")
    with pytest.raises(gdn.InvalidArgumentError):
        tok.encode(b"a\xffb")  # not UTF-8


def test_chat_template_equals_transformers(qwen_tokenizer):
    cases = json.loads((TOKENIZER_ASSETS / "chat_cases.json").read_text())["cases"]
    checked = 0
    for case in cases:
        if "error" in case:
            if case.get("error_from") != "transformers":
                with pytest.raises(gdn.InvalidArgumentError, match=case["error"]):
                    gdn.render_chat(case["messages"], **case["kwargs"])
            continue
        assert gdn.render_chat(case["messages"], **case["kwargs"]) == case["text"], case["name"]
        assert qwen_tokenizer.apply_chat_template(case["messages"], tokenize=True, **case["kwargs"]) == case["ids"]
        checked += 1
    assert checked >= 60


def test_chat_template_tool_calls_and_refusals():
    tools = [{"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object"}}}]
    call = {"id": "c1", "type": "function", "function": {"name": "get_weather", "arguments": {"city": "Paris"}}}
    as_string = {**call, "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}
    msgs = [{"role": "user", "content": "Weather?"}, {"role": "assistant", "content": None, "tool_calls": [call]}]
    text = gdn.render_chat(msgs, tools=tools)
    assert "<tool_call>\n<function=get_weather>\n<parameter=city>\nParis\n</parameter>" in text
    assert text.startswith("<|im_start|>system\n# Tools\n")
    assert gdn.render_chat([msgs[0], {**msgs[1], "tool_calls": [as_string]}], tools=tools) == text
    with pytest.raises(gdn.InvalidArgumentError, match="is an image: this model takes text only"):
        gdn.render_chat([{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}])


def test_sampler_is_seeded_and_greedy_is_argmax():
    rng = np.random.default_rng(0)
    logits = rng.normal(size=97).astype(np.float32) * 3
    params = gdn.SamplingParams(temperature=0.9, top_k=40, top_p=0.95, seed=1234, repetition_penalty=1.2)
    draws = []
    for _ in range(2):
        s = gdn.Sampler(params, 97)
        s.observe([3, 5, 8])
        run = []
        for _ in range(40):
            run.append(s.sample(logits))
            s.observe(run[-1])
        draws.append(run)
    assert draws[0] == draws[1] and len(set(draws[0])) > 5
    p = gdn.Sampler(params, 97).distribution(logits)
    assert p.shape == (97,) and abs(float(p.sum()) - 1) < 1e-5 and (p > 0).sum() <= 40
    greedy = gdn.Sampler(gdn.SamplingParams(), 97)
    assert greedy.greedy and greedy.sample(logits) == int(np.argmax(logits))
    with pytest.raises(gdn.InvalidArgumentError):
        gdn.Sampler(gdn.SamplingParams(temperature=-1), 97)
    with pytest.raises(gdn.InvalidArgumentError):
        greedy.sample(logits[:-1])


def test_generate_streams_text_and_stops(tiny):
    model, tok, ctx, gen = tiny
    prompt = tok.encode("reverse 12478 =")
    pieces = []
    r = gen.generate(prompt, gdn.GenerationParams(max_tokens=16), on_text=lambda i, t: pieces.append((i, t)))
    assert r.text == "87421" and r.finish_reason == "stop_token" and r.tokens[-1] == 0
    assert "".join(t for _, t in pieces) == r.text and {i for i, _ in pieces} == {0} and len(pieces) >= 2
    assert r.prompt_tokens == len(prompt) and r.prefill_seconds > 0 and r.decode_seconds > 0
    assert ctx.live_sequences == 0

    calls = []

    def stop_after_first(i, text):
        calls.append(text)
        return False

    cancelled = gen.generate(prompt, gdn.GenerationParams(max_tokens=16), on_text=stop_after_first)
    assert cancelled.finish_reason == "cancelled" and len(calls) == 1 and cancelled.text == calls[0]
    assert cancelled.tokens == r.tokens[: len(cancelled.tokens)] and len(cancelled.tokens) < len(r.tokens)

    s = gen.generate(prompt, gdn.GenerationParams(max_tokens=16, stop_strings=["42"]))
    assert (s.text, s.finish_reason) == ("87", "stop_string")
    n = gen.generate(prompt, gdn.GenerationParams(max_tokens=2))
    assert (n.text, n.finish_reason, n.tokens) == ("87", "length", r.tokens[:2])
    t = gen.generate(prompt, gdn.GenerationParams(max_tokens=16, stop_tokens=[r.tokens[2]]))
    assert (t.finish_reason, t.tokens) == ("stop_token", r.tokens[:3])

    def boom(i, text):
        raise RuntimeError("from the callback")

    with pytest.raises(RuntimeError, match="from the callback"):
        gen.generate(prompt, gdn.GenerationParams(max_tokens=16), on_text=boom)
    assert ctx.live_sequences == 0
    with pytest.raises(gdn.InvalidArgumentError):
        gen.generate(prompt, gdn.GenerationParams(max_tokens=0))


def test_generate_equals_transformers_plain_and_with_mtp(tiny):
    _, _, _, gen = tiny
    drafted = accepted = 0
    for row in heldout(40):
        plain = gen.generate(row["prompt_ids"], gdn.GenerationParams(max_tokens=16))
        assert plain.tokens == row["generated_ids"], row["prompt"]  # transformers' greedy output
        mtp = gen.generate(row["prompt_ids"], gdn.GenerationParams(max_tokens=16, mtp_draft=2, mtp_adaptive=False))
        assert mtp.tokens == plain.tokens and mtp.text == plain.text
        assert mtp.speculative.k == 2 and mtp.speculative.drafted > 0
        assert mtp.speculative.accepted <= mtp.speculative.drafted
        assert plain.speculative.rounds == 0
        drafted += mtp.speculative.drafted
        accepted += mtp.speculative.accepted
    assert accepted / drafted > 0.5  # the MTP head is used, and right more often than not


def test_seeded_sampling_repeats_and_batched_params_are_per_sequence(tiny):
    _, tok, _, gen = tiny
    prompts = [tok.encode(p) for p in ("reverse 12478 =", "copy 6275 =", "add 31+13=")]
    hot = gdn.GenerationParams(max_tokens=16, stop_on_eos=False, sampling=gdn.SamplingParams(temperature=1.3, seed=11))
    a, b = gen.generate(prompts[2], hot), gen.generate(prompts[2], hot)
    assert a.tokens == b.tokens and len(a.tokens) == 16
    greedy = gdn.GenerationParams(max_tokens=16)
    top1 = gdn.GenerationParams(max_tokens=16, sampling=gdn.SamplingParams(temperature=0.8, top_k=1, seed=5))
    texts = {}
    out = gen.generate_batch(prompts, [greedy, top1, hot], on_text=lambda i, t: texts.__setitem__(i, texts.get(i, "") + t))
    assert out[0].tokens == gen.generate(prompts[0], greedy).tokens
    assert out[1].tokens == gen.generate(prompts[1], greedy).tokens and out[1].text == "6275"  # top_k=1 is greedy
    assert out[2].tokens == a.tokens  # the same in a batch as alone
    assert [texts.get(i, "") for i in range(3)] == [r.text for r in out]
    assert [r.text for r in gen.generate_batch(prompts[:2], greedy)] == ["87421", "6275"]
    with pytest.raises(gdn.OutOfCapacityError):
        gen.generate_batch(prompts + prompts[:1])  # four prompts, three slots


def test_speculative_decoder_loop_equals_plain_greedy(tiny):
    model, tok, _, gen = tiny
    texts = ["reverse 12478 =", "copy 6275 =", "add 71+52="]
    plain = [gen.generate(tok.encode(t), gdn.GenerationParams(max_tokens=16)).tokens for t in texts]
    ctx = gdn.Context(model, max_sequences=3, max_context=256, threads=2, max_rollback_tokens=4)
    spec = gdn.SpeculativeDecoder(ctx, max_draft=3, adaptive=False)
    seqs = [ctx.create_sequence() for _ in texts]
    got = [[spec.start(s, tok.encode(t), gdn.Sampler(gdn.SamplingParams(), model.config.vocab_size))]
           for s, t in zip(seqs, texts)]
    del ctx
    gc.collect()  # the decoder keeps the context (and each sampler) alive
    live = list(range(len(texts)))
    while live:
        for i, new in zip(live, spec.advance([seqs[i] for i in live])):
            assert 1 <= len(new) <= 4
            got[i] += new
        for i in [i for i in live if 0 in got[i] or len(got[i]) >= 16]:
            spec.finish(seqs[i])
            live.remove(i)
    for g, p in zip(got, plain):
        g = g[: g.index(0) + 1] if 0 in g else g[:16]
        assert g == p
    st = spec.stats
    assert st.k == 3 and st.drafted > 0 and 0 < st.accepted <= st.drafted and st.rounds < st.generated
    with pytest.raises(gdn.InvalidSequenceError):
        spec.advance([seqs[0]])

    with pytest.raises(gdn.InvalidArgumentError, match="max_rollback_tokens"):
        gdn.SpeculativeDecoder(gdn.Context(model, max_sequences=1, max_context=64, max_rollback_tokens=2), max_draft=3)
    no_mtp = gdn.Context(gdn.Model.load(TINY, load_mtp=False), max_sequences=1, max_context=64, max_rollback_tokens=4)
    with pytest.raises(gdn.UnsupportedModelError):
        gdn.SpeculativeDecoder(no_mtp)


def test_generate_releases_the_gil(tiny):
    model, tok, _, _ = tiny
    ctx = gdn.Context(model, max_sequences=1, max_context=1024, threads=1)
    gen = gdn.Generator(ctx, tok)
    params = gdn.GenerationParams(max_tokens=600, stop_on_eos=False)
    window = {}

    def run():
        window["begin"] = time.perf_counter()
        window["result"] = gen.generate(tok.encode("copy 6275 ="), params)
        window["end"] = time.perf_counter()

    t = threading.Thread(target=run)
    stamps = []
    t.start()
    while t.is_alive():
        stamps.append(time.perf_counter())
    t.join()
    assert len(window["result"].tokens) == 600
    inside = [s for s in stamps if window["begin"] < s < window["end"]]
    assert inside, f"no progress during a {1e3 * (window['end'] - window['begin']):.1f} ms generate"
