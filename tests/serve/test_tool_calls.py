"""gdn serve's tool calls end to end: a model that writes a call, the server over HTTP, the official `openai`
client (tests/serve.cmake runs this).

The model is gdn-tool, written at test time by make_tool_model.py from models/gdn-tiny: a real checkpoint
whose greedy (and sampled) answer to a chat prompt that offers tools and ends the generation prompt with
"</think>\\n\\n" is exactly
    <tool_call>\\n<function=get_weather>\\n<parameter=city>\\nParis\\n</parameter>\\n<parameter=days>\\n3\\n
    </parameter>\\n</function>\\n</tool_call><|im_end|>
in five tokens, and whose MTP head drafts that same chain. Every answer is also compared with offline
generation (gdn.Generator with the server's context parameters).

Environment: GDN_CLI (the gdn tool), GDN_TINY (models/gdn-tiny), PYTHONPATH with the gdn module.
"""

import json
import os
import re
import sys

import pytest

import gdn

openai = pytest.importorskip("openai")
sys.path.insert(0, os.path.dirname(__file__))
import make_tool_model  # noqa: E402

from serve_harness import MAX_CONTEXT, NOTHINK, STEP, THREADS, TINY, Server  # noqa: E402

TOOLS = [{"type": "function", "function": {
    "name": "get_weather", "description": "The weather forecast for a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}, "days": {"type": "integer"}},
                   "required": ["city", "days"]}}}]
QUESTION = [{"role": "user", "content": "What will the weather be in Paris for the next 3 days?"}]
CALL = {"city": "Paris", "days": 3}


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    out = str(tmp_path_factory.mktemp("gdn-tool"))
    info = make_tool_model.make(TINY, out)
    return out, info


@pytest.fixture(scope="module")
def server(model):
    # --mtp-fixed: every round drafts 2, so the MTP head's drafts are verified on every step of every answer.
    s = Server("--mtp", "2", "--mtp-fixed", "--cache-bytes", "64M", "--served-model-name", "gdn-tool", model=model[0])
    yield s
    assert s.stop() == 0


@pytest.fixture(scope="module")
def offline(model):
    m = gdn.Model.load(model[0])
    tok = gdn.Tokenizer.from_model_dir(model[0])
    ctx = gdn.Context(m, max_sequences=1, max_context=MAX_CONTEXT, max_batch_tokens=STEP, max_logits_rows=STEP,
                      threads=THREADS, gdn_chunk_min_tokens=1 << 30)
    return tok, gdn.Generator(ctx, tok)


def offline_chat(offline, messages, **sampling):
    tok, gen = offline
    ids = tok.apply_chat_template(messages, tools=TOOLS, add_generation_prompt=True, enable_thinking=False, tokenize=True)
    r = gen.generate(list(ids), gdn.GenerationParams(sampling=gdn.SamplingParams(**sampling), max_tokens=32,
                                                     stop_tokens=[tok.token_to_id("<|im_end|>")]))
    return ids, r


def check_call(call):
    assert call.type == "function"
    assert call.function.name == "get_weather"
    assert re.fullmatch(r"call_[0-9a-f]+", call.id)
    args = json.loads(call.function.arguments)
    assert args == CALL
    assert type(args["days"]) is int  # typed by the schema: "integer" comes back a JSON number, not "3"


def test_the_fixture_writes_the_call_offline(model, offline):
    ids, r = offline_chat(offline, QUESTION, temperature=0.0)
    chain = model[1]["chain_ids"]
    assert ids[-1] == chain[0]  # the generation prompt ends with the chain's first token
    assert list(r.tokens) == chain[1:]
    assert r.text == model[1]["call_text"]
    assert r.finish_reason == "stop_token"


def test_tool_call_not_streamed(server, offline):
    ids, want = offline_chat(offline, QUESTION, temperature=0.0)
    before = server.metrics()
    drafted0, accepted0 = before["gdn_mtp_draft_tokens_total"], before["gdn_mtp_accepted_tokens_total"]
    r = server.client().chat.completions.create(model="gdn-tool", messages=QUESTION, tools=TOOLS, temperature=0,
                                               extra_body=NOTHINK)
    choice = r.choices[0]
    assert choice.finish_reason == "tool_calls"
    assert choice.message.content is None  # nothing but the call
    assert len(choice.message.tool_calls) == 1
    check_call(choice.message.tool_calls[0])
    assert r.usage.prompt_tokens == len(ids)
    assert r.usage.completion_tokens == len(want.tokens) == 5
    # The MTP head predicts the chain: every draft of the answer was accepted.
    after = server.metrics()
    drafted = after["gdn_mtp_draft_tokens_total"] - drafted0
    accepted = after["gdn_mtp_accepted_tokens_total"] - accepted0
    assert drafted > 0 and accepted == drafted


def test_tool_call_streamed_reassembles_to_the_same_call(server):
    whole = server.client().chat.completions.create(model="gdn-tool", messages=QUESTION, tools=TOOLS, temperature=0,
                                                   extra_body=NOTHINK).choices[0].message.tool_calls[0]
    stream = server.client().chat.completions.create(model="gdn-tool", messages=QUESTION, tools=TOOLS, temperature=0,
                                                    extra_body=NOTHINK, stream=True,
                                                    stream_options={"include_usage": True})
    calls, content, finishes, usage = {}, "", [], None
    for chunk in stream:
        if chunk.usage is not None:
            usage = chunk.usage
        for c in chunk.choices:
            content += c.delta.content or ""
            if c.finish_reason is not None:
                finishes.append(c.finish_reason)
            for d in c.delta.tool_calls or []:
                call = calls.setdefault(d.index, {"id": None, "name": "", "arguments": ""})
                if d.id:
                    assert call["id"] is None  # the id comes once, with the call's first delta
                    call["id"] = d.id
                if d.function and d.function.name:
                    call["name"] += d.function.name
                if d.function and d.function.arguments:
                    call["arguments"] += d.function.arguments
    assert content == ""
    assert finishes == ["tool_calls"]
    assert list(calls) == [0]
    assert re.fullmatch(r"call_[0-9a-f]+", calls[0]["id"])
    assert calls[0]["name"] == whole.function.name
    assert json.loads(calls[0]["arguments"]) == json.loads(whole.function.arguments) == CALL
    assert usage.completion_tokens == 5


def test_seeded_sampling_writes_the_same_call(server, offline):
    _, want = offline_chat(offline, QUESTION, temperature=0.8, top_p=0.95, seed=11)
    assert want.text == make_tool_model.CALL_TEXT  # the chain's logits leave no room for another token
    r = server.client().chat.completions.create(model="gdn-tool", messages=QUESTION, tools=TOOLS, temperature=0.8,
                                               top_p=0.95, seed=11, extra_body=NOTHINK)
    assert r.choices[0].finish_reason == "tool_calls"
    check_call(r.choices[0].message.tool_calls[0])


def test_second_turn_with_the_tool_result(server, offline):
    c = server.client()
    first = c.chat.completions.create(model="gdn-tool", messages=QUESTION, tools=TOOLS, temperature=0,
                                      extra_body=NOTHINK)
    ids1, _ = offline_chat(offline, QUESTION, temperature=0.0)
    call = first.choices[0].message.tool_calls[0]
    # What an agent sends next: its question, the assistant's call (arguments as the JSON string it got), and
    # the tool's result.
    messages = QUESTION + [
        {"role": "assistant", "content": None, "tool_calls": [
            {"id": call.id, "type": "function",
             "function": {"name": call.function.name, "arguments": call.function.arguments}}]},
        {"role": "tool", "tool_call_id": call.id, "content": json.dumps({"forecast": ["sun", "rain", "sun"]})}]
    ids2, want = offline_chat(offline, messages, temperature=0.0)
    tok = offline[0]
    assert '<tool_response>\n{"forecast": ["sun", "rain", "sun"]}\n</tool_response>' in tok.decode(ids2)
    r = c.chat.completions.create(model="gdn-tool", messages=messages, tools=TOOLS, temperature=0, extra_body=NOTHINK)
    assert r.usage.prompt_tokens == len(ids2)
    # The call rendered back into the prompt is the same four tokens the model wrote, so the snapshot taken
    # where the first answer ended (its prompt and the call, before <|im_end|>) is this prompt's cached prefix.
    assert list(ids2[:len(ids1) + 4]) == list(ids1) + list(first_call_tokens(tok))
    assert r.usage.prompt_tokens_details.cached_tokens == len(ids1) + 4
    # A bigram cannot read the result: the prompt ends with the same token, so it calls the tool again,
    # exactly as offline generation does.
    assert want.text == make_tool_model.CALL_TEXT
    assert r.choices[0].finish_reason == "tool_calls"
    check_call(r.choices[0].message.tool_calls[0])


def first_call_tokens(tok):
    return tok.encode(make_tool_model.CALL_TEXT)
