"""gdn serve end to end on loopback, with the trained models/gdn-tiny (tests/serve.cmake runs this).

Every answer is compared with offline generation: gdn.Generator (the Python module) on a Context with the
server's parameters (gdn_chunk_min_tokens = 2**30, its step size and thread count), which the server must
match token for token — greedy and seeded sampling, through the official `openai` client (streamed and
not), curl and raw sockets, 32 concurrent clients, cache hits, MTP on and off. Then the failure paths: a
client that disconnects mid-stream frees its slot, a full queue answers 503 with Retry-After, malformed
requests get 4xx with OpenAI's error shape and the server keeps serving, a wrong API key gets 401, and
SIGTERM lets in-flight requests finish and frees the port.

Environment: GDN_CLI (the gdn tool), GDN_TINY (models/gdn-tiny), PYTHONPATH with the gdn module.
"""

import json
import os
import signal
import socket
import subprocess
import threading
import time
import urllib.error
import urllib.request

import pytest

import gdn

openai = pytest.importorskip("openai")

from serve_harness import CLI, MAX_CONTEXT, NOTHINK, STEP, THREADS, TINY, Server, get  # noqa: E402


def post(url, body, headers=None, raw=False):
    data = body if raw else json.dumps(body).encode()
    req = urllib.request.Request(url, data=data, headers={"Content-Type": "application/json", **(headers or {})})
    try:
        with urllib.request.urlopen(req, timeout=60) as r:
            return r.status, dict(r.headers), r.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, dict(e.headers), e.read().decode()


def port_is_free(port):
    """Nothing listens there any more: a new server can bind it (as servers do, with SO_REUSEADDR, since the
    closed connections may linger in TIME_WAIT) and a connection is refused."""
    try:
        socket.create_connection(("127.0.0.1", port), timeout=2).close()
        return False
    except ConnectionRefusedError:
        pass
    s = socket.socket()
    s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        s.bind(("127.0.0.1", port))
        return True
    except OSError:
        return False
    finally:
        s.close()


@pytest.fixture(scope="module")
def server():
    s = Server("--mtp", "2", "--max-sequences", "8", "--max-queue", "64", "--cache-bytes", "64M", "--cache-interval", "32")
    yield s
    assert s.stop() == 0
    assert port_is_free(s.port)


# --- offline references ----------------------------------------------------------------------------

class Offline:
    def __init__(self):
        self.model = gdn.Model.load(TINY)
        self.tok = gdn.Tokenizer.from_model_dir(TINY)
        self.ctx = gdn.Context(self.model, max_sequences=1, max_context=MAX_CONTEXT, max_batch_tokens=STEP,
                               max_logits_rows=STEP, threads=THREADS, gdn_chunk_min_tokens=1 << 30)
        self.gen = gdn.Generator(self.ctx, self.tok)
        self.im_end = self.tok.token_to_id("<|im_end|>")
        self.lock = threading.Lock()
        self.memo = {}

    def chat_prompt(self, messages, tools=None, thinking=False):
        return self.tok.apply_chat_template(messages, tools=tools, add_generation_prompt=True, enable_thinking=thinking,
                                            tokenize=True)

    def generate(self, prompt_ids, max_tokens, chat=False, stop=(), **sampling):
        key = (tuple(prompt_ids), max_tokens, chat, tuple(stop), tuple(sorted(sampling.items())))
        with self.lock:
            if key not in self.memo:
                params = gdn.GenerationParams(sampling=gdn.SamplingParams(**sampling), max_tokens=max_tokens,
                                              stop_tokens=[self.im_end] if chat else [], stop_strings=list(stop))
                r = self.gen.generate(list(prompt_ids), params)
                finish = {"stop_token": "stop", "stop_string": "stop", "length": "length"}[r.finish_reason]
                self.memo[key] = (r.text, finish, len(r.tokens))
            return self.memo[key]


@pytest.fixture(scope="module")
def offline():
    return Offline()


PROMPTS = [json.loads(line)["prompt"] for line in open(os.path.join(TINY, "eval", "heldout.jsonl"))][:48]


def sampling_for(i):
    """Greedy, seeded sampling, penalties: the server's names and the offline SamplingParams."""
    kind = i % 3
    if kind == 0:
        return {"temperature": 0.0}, {"temperature": 0.0}
    if kind == 1:
        return ({"temperature": 0.8, "top_p": 0.9, "seed": 100 + i},
                {"temperature": 0.8, "top_p": 0.9, "seed": 100 + i})
    return ({"temperature": 1.1, "presence_penalty": 0.4, "frequency_penalty": 0.3, "seed": 7 * i,
             "extra_body": {"top_k": 30, "repetition_penalty": 1.1, "min_p": 0.05}},
            {"temperature": 1.1, "top_k": 30, "presence_penalty": 0.4, "frequency_penalty": 0.3, "seed": 7 * i,
             "repetition_penalty": 1.1, "min_p": 0.05})


def merged_extra(api, extra):
    api = dict(api)
    body = dict(extra)
    body.update(api.pop("extra_body", {}))
    return api, body


# --- the tests ---------------------------------------------------------------------------------------

def test_health_models_metrics(server):
    assert get(server.url + "/health") == (200, '{"status":"ok"}')
    models = server.client().models.list()
    assert [m.id for m in models.data] == ["gdn-tiny"]
    m = server.metrics()
    for name in ["gdn_prompt_tokens_total", "gdn_generation_tokens_total", "gdn_prompt_cached_tokens_total",
                 "gdn_mtp_draft_tokens_total", "gdn_mtp_accepted_tokens_total", "gdn_queue_depth", "gdn_slots_in_use",
                 'gdn_time_to_first_token_seconds_bucket{le="+Inf"}', "gdn_inter_token_latency_seconds_count"]:
        assert name in m, name


def test_openai_client_completions_and_chat(server, offline):
    client = server.client()
    # Completions, a string prompt: the trained model's answer, equal to offline.
    r = client.completions.create(model="gdn-tiny", prompt="reverse 12478 =", max_tokens=16, temperature=0)
    assert r.choices[0].text == "87421" and r.choices[0].finish_reason == "stop"
    ids = offline.tok.encode("reverse 12478 =")
    assert (r.choices[0].text, "stop") == offline.generate(ids, 16)[:2]
    assert r.usage.prompt_tokens == len(ids) and r.usage.completion_tokens == 6
    # Token ids as the prompt; streamed; the same text.
    chunks = list(client.completions.create(model="gdn-tiny", prompt=ids, max_tokens=16, temperature=0, stream=True,
                                            stream_options={"include_usage": True}))
    assert "".join(c.choices[0].text for c in chunks if c.choices) == "87421"
    assert chunks[-1].usage.completion_tokens == 6
    # Chat, streamed and not, thinking off; a seeded sampled one too.
    for i in range(6):
        messages = [{"role": "system", "content": "You are tiny."}, {"role": "user", "content": PROMPTS[i]}]
        api, ref = sampling_for(i)
        api, body = merged_extra(api, NOTHINK)
        want = offline.generate(offline.chat_prompt(messages), 24, chat=True, **ref)
        r = client.chat.completions.create(model="gdn-tiny", messages=messages, max_tokens=24, extra_body=body, **api)
        assert (r.choices[0].message.content, r.choices[0].finish_reason) == want[:2], i
        assert r.usage.completion_tokens == want[2]
        assert r.usage.prompt_tokens == len(offline.chat_prompt(messages))
        assert r.usage.prompt_tokens_details.cached_tokens >= 0
        stream = client.chat.completions.create(model="gdn-tiny", messages=messages, max_tokens=24, extra_body=body,
                                                stream=True, **api)
        parts, finish = [], None
        for c in stream:
            if c.choices and c.choices[0].delta.content:
                parts.append(c.choices[0].delta.content)
            if c.choices and c.choices[0].finish_reason:
                finish = c.choices[0].finish_reason
        assert ("".join(parts), finish) == want[:2], i
    # Thinking on (the template's default): the answer is reasoning until a </think> that never comes.
    messages = [{"role": "user", "content": "copy 4821 ="}]
    want = offline.generate(offline.chat_prompt(messages, thinking=True), 12, chat=True, temperature=0.0)
    r = client.chat.completions.create(model="gdn-tiny", messages=messages, max_tokens=12, temperature=0)
    assert r.choices[0].message.model_extra.get("reasoning_content") == want[0].strip("\n")
    assert r.choices[0].message.content == ""


def test_curl(server):
    body = json.dumps({"model": "gdn-tiny", "prompt": "add 31+13=", "max_tokens": 8, "temperature": 0})
    out = subprocess.run(["curl", "-sS", "-H", "Content-Type: application/json", "-d", body, server.url + "/v1/completions"],
                         capture_output=True, text=True, check=True).stdout
    assert json.loads(out)["choices"][0]["text"] == "44"
    body = json.dumps({"model": "gdn-tiny", "messages": [{"role": "user", "content": "add 31+13="}], "max_tokens": 8,
                       "temperature": 0, "stream": True, "chat_template_kwargs": {"enable_thinking": False}})
    out = subprocess.run(["curl", "-sSN", "-H", "Content-Type: application/json", "-d", body,
                          server.url + "/v1/chat/completions"], capture_output=True, text=True, check=True).stdout
    events = [e for e in out.split("\n\n") if e]
    assert all(e.startswith("data: ") for e in events)
    assert events[-1] == "data: [DONE]"
    chunks = [json.loads(e[6:]) for e in events[:-1]]
    assert chunks[0]["choices"][0]["delta"]["role"] == "assistant"
    assert chunks[-1]["choices"][0]["finish_reason"] in ("stop", "length")
    assert all(c["object"] == "chat.completion.chunk" for c in chunks)


def test_32_concurrent_clients_equal_offline(server, offline):
    # Each client sends a few requests back to back: chat and completions, streamed and not, greedy and
    # seeded, some prompts repeated (cache hits) — all in flight together against 8 slots.
    jobs = []
    for c in range(32):
        for j in range(3):
            i = (c * 3 + j) % len(PROMPTS) if j < 2 else c % 8
            jobs.append((c, i, (c + j) % 2 == 0, (c + j) % 3 == 0))
    want = {}
    for c, i, chat, stream in jobs:
        api, ref = sampling_for(i)
        ids = offline.chat_prompt([{"role": "user", "content": PROMPTS[i]}]) if chat else offline.tok.encode(PROMPTS[i])
        want[(i, chat)] = offline.generate(ids, 20, chat=chat, **ref)
    got, errors = {}, []

    def client_thread(c):
        client = server.client()
        for cc, i, chat, stream in jobs:
            if cc != c:
                continue
            api, _ = sampling_for(i)
            try:
                if chat:
                    api, body = merged_extra(api, NOTHINK)
                    kw = dict(model="gdn-tiny", messages=[{"role": "user", "content": PROMPTS[i]}], max_tokens=20,
                              extra_body=body, **api)
                    if stream:
                        text, finish = "", None
                        for ch in client.chat.completions.create(stream=True, **kw):
                            if ch.choices:
                                text += ch.choices[0].delta.content or ""
                                finish = ch.choices[0].finish_reason or finish
                    else:
                        r = client.chat.completions.create(**kw)
                        text, finish = r.choices[0].message.content, r.choices[0].finish_reason
                else:
                    api, body = merged_extra(api, {})
                    kw = dict(model="gdn-tiny", prompt=PROMPTS[i], max_tokens=20, extra_body=body, **api)
                    if stream:
                        text, finish = "", None
                        for ch in client.completions.create(stream=True, **kw):
                            if ch.choices:
                                text += ch.choices[0].text
                                finish = ch.choices[0].finish_reason or finish
                    else:
                        r = client.completions.create(**kw)
                        text, finish = r.choices[0].text, r.choices[0].finish_reason
                got.setdefault((i, chat), []).append((text, finish))
            except Exception as e:  # noqa: BLE001 - reported below
                errors.append(repr(e))

    t0 = time.time()
    threads = [threading.Thread(target=client_thread, args=(c,)) for c in range(32)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    assert not errors, errors[:3]
    assert time.time() - t0 < 120
    assert sum(len(v) for v in got.values()) == len(jobs)
    for key, answers in got.items():
        for a in answers:
            assert a == want[key][:2], (key, a, want[key])
    m = server.metrics()
    assert m["gdn_slots_in_use"] == 0
    assert m["gdn_prompt_cached_tokens_total"] > 0
    assert m["gdn_mtp_draft_tokens_total"] > 0 and m["gdn_mtp_accepted_tokens_total"] > 0


def test_cache_hit_identical_to_cold(server, offline):
    client = server.client()
    prefix = " ".join(PROMPTS[10:40])  # a long shared prefix (several steps and cache intervals)
    ids = offline.tok.encode(prefix + " reverse 3915 =")
    cold = client.completions.create(model="gdn-tiny", prompt=ids, max_tokens=12, temperature=0.9, seed=3)
    hit = client.completions.create(model="gdn-tiny", prompt=ids, max_tokens=12, temperature=0.9, seed=3)
    assert cold.usage.prompt_tokens_details.cached_tokens < len(ids) - 1
    assert hit.usage.prompt_tokens_details.cached_tokens == len(ids) - 1
    assert hit.choices[0].text == cold.choices[0].text
    assert cold.choices[0].text == offline.generate(ids, 12, temperature=0.9, seed=3)[0]
    # Another question after the same prefix starts from the snapshot inside it.
    other = offline.tok.encode(prefix + " copy 5521 =")
    r = client.completions.create(model="gdn-tiny", prompt=other, max_tokens=12, temperature=0)
    assert r.usage.prompt_tokens_details.cached_tokens >= 32 * (len(offline.tok.encode(prefix)) // 32) - 32
    assert r.choices[0].text == offline.generate(other, 12, temperature=0.0)[0]


def test_mtp_on_equals_off(server, offline):
    # k fixed at 2: every decode round drafts and verifies, whatever the machine's timing makes the
    # adaptive choice (the shared fixture's adaptive server may find that drafting does not pay).
    fixed = Server("--mtp", "2", "--mtp-fixed", "--max-sequences", "4", "--cache-bytes", "16M")
    plain = Server("--mtp", "0", "--max-sequences", "4", "--cache-bytes", "0")
    try:
        before = fixed.metrics()
        a, b = fixed.client(), plain.client()
        for i in range(12):
            api, ref = sampling_for(i)
            api, body = merged_extra(api, {"ignore_eos": i % 2 == 0})
            kw = dict(model="gdn-tiny", prompt=PROMPTS[i], max_tokens=32, extra_body=body, **api)
            ra, rb = a.completions.create(**kw), b.completions.create(**kw)
            assert ra.choices[0].text == rb.choices[0].text, i
            assert ra.usage.completion_tokens == rb.usage.completion_tokens
        after = fixed.metrics()
        assert after["gdn_mtp_draft_tokens_total"] > before["gdn_mtp_draft_tokens_total"]
        assert after["gdn_mtp_accepted_tokens_total"] > 0
        assert plain.metrics()["gdn_mtp_draft_tokens_total"] == 0
    finally:
        assert fixed.stop() == 0
        assert plain.stop() == 0


def raw_stream(port, path, body):
    s = socket.create_connection(("127.0.0.1", port))
    data = json.dumps(body).encode()
    s.sendall(b"POST " + path.encode() + b" HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: " +
              str(len(data)).encode() + b"\r\n\r\n" + data)
    return s


def wait_for(pred, timeout=5.0):
    deadline = time.time() + timeout
    while time.time() < deadline:
        if pred():
            return True
        time.sleep(0.02)
    return pred()


def test_disconnect_mid_stream_frees_the_slot(server):
    long = {"prompt": "copy 1 =", "max_tokens": 3000, "ignore_eos": True, "temperature": 0}
    for stream in (True, False):
        before = server.metrics()["gdn_requests_total{outcome=\"cancelled\"}"]
        s = raw_stream(server.port, "/v1/completions", {**long, "stream": stream})
        assert wait_for(lambda: server.metrics()["gdn_slots_in_use"] == 1)
        if stream:
            assert s.recv(4096).startswith(b"HTTP/1.1 200")
        t0 = time.time()
        s.close()
        assert wait_for(lambda: server.metrics()["gdn_slots_in_use"] == 0, 2.0)
        assert time.time() - t0 < 2.0
        assert server.metrics()["gdn_requests_total{outcome=\"cancelled\"}"] == before + 1
    # And it keeps serving.
    assert server.client().completions.create(model="gdn-tiny", prompt="add 31+13=", max_tokens=8,
                                              temperature=0).choices[0].text == "44"


def test_full_queue_gives_503():
    s = Server("--max-sequences", "1", "--max-queue", "1", "--cache-bytes", "0")
    try:
        long = {"prompt": "copy 1 =", "max_tokens": 3000, "ignore_eos": True, "temperature": 0, "stream": True}
        a = raw_stream(s.port, "/v1/completions", long)
        assert wait_for(lambda: s.metrics()["gdn_slots_in_use"] == 1)
        b = raw_stream(s.port, "/v1/completions", long)
        assert wait_for(lambda: s.metrics()["gdn_queue_depth"] == 1)
        status, headers, body = post(s.url + "/v1/completions", {"prompt": "x", "max_tokens": 2})
        assert status == 503
        assert headers.get("Retry-After") == "1"
        assert json.loads(body)["error"]["type"] == "server_error"
        a.close()
        b.close()
        assert wait_for(lambda: s.metrics()["gdn_slots_in_use"] == 0 and s.metrics()["gdn_queue_depth"] == 0)
        status, _, body = post(s.url + "/v1/completions", {"prompt": "add 31+13=", "max_tokens": 8, "temperature": 0})
        assert status == 200 and json.loads(body)["choices"][0]["text"] == "44"
        assert s.metrics()['gdn_requests_total{outcome="rejected"}'] == 1
    finally:
        assert s.stop() == 0


MALFORMED = [
    ("/v1/completions", b"not json", 400),
    ("/v1/completions", b"{", 400),
    ("/v1/completions", b"[1, 2]", 400),
    ("/v1/completions", b'{"prompt": "caf\xff\xfe"}', 400),
    ("/v1/completions", {"max_tokens": 4}, 400),
    ("/v1/completions", {"prompt": 5}, 400),
    ("/v1/completions", {"prompt": "x", "temperature": "hot"}, 400),
    ("/v1/completions", {"prompt": "x", "temperature": -1}, 400),
    ("/v1/completions", {"prompt": "x", "top_p": 0}, 400),
    ("/v1/completions", {"prompt": "x", "max_tokens": 0}, 400),
    ("/v1/completions", {"prompt": "x", "max_tokens": "10"}, 400),
    ("/v1/completions", {"prompt": "x", "max_tokens": 10 ** 9}, 400),
    ("/v1/completions", {"prompt": [1] * (MAX_CONTEXT + 10)}, 400),
    ("/v1/completions", {"prompt": [999999]}, 400),
    ("/v1/completions", {"prompt": "x", "max_tokns": 4}, 400),
    ("/v1/completions", {"model": "gpt-4", "prompt": "x"}, 404),
    ("/v1/completions", {"prompt": "x", "n": 2}, 400),
    ("/v1/completions", {"prompt": "x", "stop": 5}, 400),
    ("/v1/completions", {"prompt": "x", "stream": "yes"}, 400),
    ("/v1/completions", {"prompt": "x", "seed": "1"}, 400),
    ("/v1/completions", {"prompt": ["a", "b"]}, 400),
    ("/v1/chat/completions", {"model": "gdn-tiny"}, 400),
    ("/v1/chat/completions", {"messages": []}, 400),
    ("/v1/chat/completions", {"messages": [{"role": "developer", "content": "x"}]}, 400),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": 42}]}, 400),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}]}, 400),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "x"}], "logprobs": True}, 400),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "x"}], "tools": {"type": "function"}}, 400),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "x"}], "tool_choice": "required",
                              "tools": [{"type": "function", "function": {"name": "f"}}]}, 400),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "x"}], "response_format": {"type": "json_object"}}, 400),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "x", "colour": "red"}]}, 400),
    ("/v1/chat/completions", {"messages": [{"role": "assistant", "content": "only me"}]}, 400),
    ("/v1/nope", {"prompt": "x"}, 404),
]


def test_malformed_requests_get_4xx_and_the_server_keeps_serving(server):
    for path, body, want in MALFORMED:
        status, _, text = post(server.url + path, body, raw=isinstance(body, bytes))
        assert status == want, (path, body, status, text)
        err = json.loads(text)["error"]
        assert err["message"] and err["type"], (path, body)
    # Bodies over the limit (8 MiB by default).
    status, _, text = post(server.url + "/v1/completions", {"prompt": "x" * (9 << 20)})
    assert status == 413 and "larger than" in json.loads(text)["error"]["message"]
    assert len(MALFORMED) + 1 >= 20
    assert get(server.url + "/health")[0] == 200
    assert server.client().completions.create(model="gdn-tiny", prompt="add 31+13=", max_tokens=8,
                                              temperature=0).choices[0].text == "44"


def test_api_key():
    s = Server("--api-key", "s3cret", "--cache-bytes", "0", "--max-sequences", "2")
    try:
        assert get(s.url + "/health")[0] == 200  # open, for load balancers
        status, _, body = post(s.url + "/v1/completions", {"prompt": "x", "max_tokens": 2})
        assert status == 401 and json.loads(body)["error"]["code"] == "invalid_api_key"
        assert post(s.url + "/v1/completions", {"prompt": "x", "max_tokens": 2}, {"Authorization": "Bearer nope"})[0] == 401
        assert get(s.url + "/v1/models")[0] == 401
        with pytest.raises(openai.AuthenticationError):
            s.client("wrong").models.list()
        r = s.client("s3cret").completions.create(model="gdn-tiny", prompt="add 31+13=", max_tokens=8, temperature=0)
        assert r.choices[0].text == "44"
    finally:
        assert s.stop() == 0


def test_tools_are_rendered_and_answers_match_offline(server, offline):
    tools = [{"type": "function", "function": {"name": "get_weather", "description": "Weather for a city",
                                               "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                                                              "required": ["city"]}}}]
    messages = [{"role": "user", "content": "Weather in Paris?"},
                {"role": "assistant", "content": None, "tool_calls": [
                    {"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}]},
                {"role": "tool", "tool_call_id": "call_1", "content": "sunny"}]
    ids = offline.chat_prompt(messages, tools=tools)
    want = offline.generate(ids, 16, chat=True, temperature=0.0)
    r = server.client().chat.completions.create(model="gdn-tiny", messages=messages, tools=tools, max_tokens=16,
                                                temperature=0, extra_body=NOTHINK)
    assert r.usage.prompt_tokens == len(ids)
    # The tiny model does not call tools; what it says is content (text that only looks like a call would be too).
    assert r.choices[0].message.content == want[0]
    assert r.choices[0].finish_reason == want[1]
    # tool_choice "none": the tools are not offered.
    r = server.client().chat.completions.create(model="gdn-tiny", messages=messages, tools=tools, tool_choice="none",
                                                max_tokens=4, temperature=0, extra_body=NOTHINK)
    assert r.usage.prompt_tokens == len(offline.chat_prompt(messages))


def test_sigterm_finishes_in_flight_requests_and_frees_the_port():
    s = Server("--cache-bytes", "0", "--max-sequences", "2")
    sock = raw_stream(s.port, "/v1/completions", {"prompt": "copy 1 =", "max_tokens": 400, "ignore_eos": True,
                                                  "temperature": 0, "stream": True})
    assert sock.recv(4096).startswith(b"HTTP/1.1 200")
    s.proc.send_signal(signal.SIGTERM)
    data = b""
    sock.settimeout(20)
    while b"data: [DONE]" not in data:
        chunk = sock.recv(65536)
        if not chunk:
            break
        data += chunk
    sock.close()
    assert b"data: [DONE]" in data  # the request in flight was finished, not cut
    assert b'"finish_reason":"length"' in data
    assert s.stop() == 0
    assert port_is_free(s.port)


@pytest.mark.skipif(os.path.exists("/dev/nvidia0"), reason="a GPU is present: --backend cuda would serve")
def test_backend_cuda_without_a_device_fails_with_the_reason():
    # --backend cuda goes through the library's backend plumbing (ModelParams / ContextParams): where no
    # device (or no CUDA build) exists the load fails with backend_unavailable's reason and the process exits
    # instead of serving 503 forever.
    p = subprocess.run([CLI, "serve", TINY, "--port", "0", "--backend", "cuda"], capture_output=True, text=True, timeout=60)
    assert p.returncode == 1
    assert "the CUDA backend is not available" in p.stderr
    p = subprocess.run([CLI, "serve", TINY, "--port", "0", "--backend", "tpu"], capture_output=True, text=True, timeout=60)
    assert p.returncode == 1 and "'tpu' is not cpu or cuda" in p.stderr
