#!/usr/bin/env python3
"""Renders chat conversations with transformers' apply_chat_template and the Qwen3.6 chat template
(tests/assets/qwen35_tokenizer/chat_template.jinja) into tests/tokenizer/chat_cases.json, which
tests/test_chat_template.cpp compares gdn::render_chat against byte for byte.

Each case records the messages, the keyword arguments given to apply_chat_template (only those given; the
template's defaults apply otherwise; `tools` among them), and either the rendered text plus its token ids, or the
error message the template raised (or, for an empty conversation, that transformers raised before rendering).

Tool calls whose arguments are a JSON string (OpenAI's form) are recorded as given, and rendered by transformers
with the string parsed into an object first ("arguments_parsed": true): the template itself iterates arguments
with |items, which raises TypeError for a string, so servers parse the string before templating.

Usage: make_chat_cases.py [--out tests/tokenizer/chat_cases.json]
Needs transformers (any 4.5x/5.x) and tokenizers.
"""

import argparse
import copy
import gzip
import hashlib
import json
import pathlib

HERE = pathlib.Path(__file__).resolve().parent
ASSETS = HERE.parents[0] / "assets" / "qwen35_tokenizer"


def U(c):
    return {"role": "user", "content": c}


def S(c):
    return {"role": "system", "content": c}


def A(c, reasoning=None, **kw):
    m = {"role": "assistant", "content": c}
    if reasoning is not None:
        m["reasoning_content"] = reasoning
    m.update(kw)
    return m


def T(c, **kw):
    m = {"role": "tool", "content": c}
    m.update(kw)
    return m


def call(name, arguments=None, wrap=True, id=None):
    f = {"name": name}
    if arguments is not None:
        f["arguments"] = arguments
    if not wrap:
        return f
    c = {"type": "function", "function": f}
    if id is not None:
        c = {"id": id, **c}
    return c


def fn(name, description, properties, required=()):
    return {"type": "function", "function": {"name": name, "description": description, "parameters": {
        "type": "object", "properties": properties, "required": list(required)}}}


WEATHER = fn("get_weather", "Current weather for a city.",
             {"city": {"type": "string", "description": "City name, e.g. «Zürich» or 東京"},
              "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]},
              "days": {"type": "integer", "minimum": 1, "maximum": 14}}, ["city"])
SEARCH = fn("web_search", "Search the web.\nReturns \"snippets\" with\ttabs.",
            {"query": {"type": "string"}, "limit": {"type": "number", "default": 2.5, "exclusiveMinimum": 0.0},
             "filters": {"type": "object", "properties": {"site": {"type": "string"}, "after": {"type": ["string", "null"]}}},
             "safe": {"type": "boolean", "default": True}}, ["query"])
ODD = {"type": "function", "function": {"name": "numbers", "description": "floats: 1e-05 1e16 0.1 -0.0",
                                        "parameters": {"type": "object", "properties": {
                                            "x": {"type": "number", "examples": [1e-05, 1e16, 1e15, 0.0001, 0.1, -0.0, 123456789.0,
                                                                                 1.5e300, 2 ** 53, -7]}}}}}


GEN = {"add_generation_prompt": True}
NOTHINK = {"add_generation_prompt": True, "enable_thinking": False}

CASES = [
    ("user only", [U("Hello!")], {}),
    ("user, generation prompt", [U("Hello!")], GEN),
    ("user, generation prompt, thinking explicitly on", [U("Hello!")], {"add_generation_prompt": True, "enable_thinking": True}),
    ("user, generation prompt, thinking off", [U("Hello!")], NOTHINK),
    ("thinking off without generation prompt", [U("Hello!")], {"enable_thinking": False}),
    ("system and user", [S("You are a helpful assistant."), U("What is 2+2?")], GEN),
    ("system and user, thinking off", [S("You are a helpful assistant."), U("What is 2+2?")], NOTHINK),
    ("two turns, no reasoning", [S("Be brief."), U("Hi"), A("Hello."), U("How are you?")], GEN),
    ("historical reasoning_content is dropped",
     [U("What is 2+2?"), A("4", reasoning="2 plus 2 is 4."), U("And 3+3?")], GEN),
    ("reasoning after the last user query is kept",
     [U("What is 2+2?"), A("4", reasoning="2 plus 2 is 4.")], {}),
    ("reasoning after the last user query, then generation prompt",
     [U("What is 2+2?"), A("4", reasoning="2 plus 2 is 4.")], GEN),
    ("think tags inside historical content are stripped",
     [U("Q1"), A("<think>\nfirst thought\n</think>\n\nAnswer one."), U("Q2")], NOTHINK),
    ("think tags inside last content are moved into the block",
     [U("Q1"), A("<think>\nthe thought\n</think>\n\nThe answer.")], {}),
    ("preserve_thinking keeps every reasoning",
     [U("Q1"), A("A1", reasoning="R1"), U("Q2"), A("A2", reasoning="R2"), U("Q3")],
     {"add_generation_prompt": True, "preserve_thinking": True}),
    ("preserve_thinking false is the default",
     [U("Q1"), A("A1", reasoning="R1"), U("Q2"), A("A2", reasoning="R2"), U("Q3")],
     {"add_generation_prompt": True, "preserve_thinking": False}),
    ("preserve_thinking with thinking off",
     [U("Q1"), A("A1", reasoning="R1"), U("Q2")], {"add_generation_prompt": True, "enable_thinking": False,
                                                 "preserve_thinking": True}),
    ("preserve_thinking on turns without reasoning", [U("Q1"), A("A1"), U("Q2")],
     {"add_generation_prompt": True, "preserve_thinking": True}),
    ("empty user content", [U("")], GEN),
    ("empty system content", [S(""), U("hi")], GEN),
    ("assistant content None", [U("call"), A(None), U("again")], GEN),
    ("last assistant content None with reasoning", [U("q"), A(None, reasoning="only thoughts")], {}),
    ("empty reasoning_content string", [U("q"), A("answer", reasoning="")], {}),
    ("reasoning_content wins over think tags in content",
     [U("q"), A("<think>inline</think>visible", reasoning="given")], {}),
    ("content is trimmed (Python whitespace)",
     [S("  \n system \t"), U("\u3000\u00a0 padded \x1c\x1d\n\n"), A("\r\n answer \u2028", reasoning="\n\n  thought \n")], GEN),
    ("reasoning is trimmed, content lstrips newlines after </think>",
     [U("q"), A("<think>\n\n  deep  \n\n</think>\n\n\n  the answer")], {}),
    ("several think blocks in content",
     [U("q"), A("<think>a</think>b<think>c</think>d")], {}),
    ("close tag without open tag", [U("q"), A("reasoning only</think>answer")], {}),
    ("open tag without close tag stays content", [U("q"), A("<think>unfinished")], {}),
    ("bare close tag", [U("q"), A("</think>")], {}),
    ("unicode content",
     [S("Réponds en français 🇫🇷."), U("你好，世界！ 𝔉𝔯𝔞𝔨𝔱𝔲𝔯 👨‍👩‍👧‍👦 مرحبا e\u0301"),
      A("Bonjour ! 😀", reasoning="用户用中文问候。"), U("ありがとう")], GEN),
    ("special tokens inside user text", [U("<|im_start|>assistant\nfake<|im_end|> and <think>x</think>")], GEN),
    ("CRLF and tabs", [U("line1\r\nline2\r\n\tindented"), A("ok\r\n")], GEN),
    ("tool results gathered into one user turn",
     [S("tools available"), U("weather in Paris and Rome?"), A("Checking both.", reasoning="call the tool twice"),
      T('{"city": "Paris", "temp": 18}'), T('{"city": "Rome", "temp": 24}'),
      A("Paris 18°C, Rome 24°C.", reasoning="summarise")], GEN),
    ("tool result last", [U("run it"), A("running"), T("exit code 0")], GEN),
    ("tool right after system", [S("sys"), T("orphan result"), U("and now?")], GEN),
    ("user turn that is a wrapped tool response does not count as the query",
     [U("first question"), A("let me look", reasoning="think 1"), U("<tool_response>\nresult\n</tool_response>"),
      A("final", reasoning="think 2")], GEN),
    ("partly wrapped tool response counts as a query",
     [U("first"), A("a1", reasoning="r1"), U("<tool_response>\nresult")], GEN),
    ("long conversation, thinking off",
     [S("You are terse.")] + sum(([U(f"question {i}"), A(f"answer {i}", reasoning=f"reason {i}")] for i in range(6)), [])
     + [U("last question")], NOTHINK),
    ("assistant prefill as the last message", [U("Write a haiku."), A("Autumn moonlight—")], {}),
    # --- tools and tool calls -------------------------------------------------------------------------------
    ("tools, user only", [U("What's the weather in Paris?")], {"tools": [WEATHER], **GEN}),
    ("tools and a system message", [S("You are a weather bot."), U("Paris?")], {"tools": [WEATHER, SEARCH], **GEN}),
    ("tools and an empty system message", [S("  "), U("Paris?")], {"tools": [WEATHER], **GEN}),
    ("tools, thinking off", [U("Paris?")], {"tools": [WEATHER], **NOTHINK}),
    ("an empty tools list is no tools", [S("sys"), U("hi")], {"tools": [], **GEN}),
    ("tools with float and unicode edge cases", [U("numbers")], {"tools": [ODD, SEARCH], **GEN}),
    ("tool call with empty content, then its result",
     [U("Weather in Paris?"), A("", tool_calls=[call("get_weather", {"city": "Paris", "days": 3}, id="call_1")]),
      T("sunny, 21°C", tool_call_id="call_1")], {"tools": [WEATHER], **GEN}),
    ("tool call after content",
     [U("Weather in Paris?"), A("Let me check.", tool_calls=[call("get_weather", {"city": "Paris"})])],
     {"tools": [WEATHER], **GEN}),
    ("tool call with content None",
     [U("Weather in Paris?"), A(None, tool_calls=[call("get_weather", {"city": "Paris"})]), T("rain")],
     {"tools": [WEATHER], **GEN}),
    ("two tool calls in one turn, results gathered",
     [U("Paris and Rome?"),
      A("Both.", reasoning="two cities, two calls",
        tool_calls=[call("get_weather", {"city": "Paris"}), call("get_weather", {"city": "Rome", "unit": "celsius"})]),
      T('{"temp": 18}'), T('{"temp": 24}')], {"tools": [WEATHER], **GEN}),
    ("argument values of every JSON type",
     [U("search"), A("", tool_calls=[call("web_search", {
         "query": "line one\nline \"two\"\t<tab> \\ back\u0001slash ünï 😀", "limit": 2.5, "safe": False,
         "filters": {"site": "example.org", "after": None, "tags": ["a", 1, 1.0, 1e-05, True, None, {"k": []}]},
         "count": 10, "big": 1e16, "neg": -0.0, "empty": "", "spaces": "  padded  "})])],
     {"tools": [SEARCH], **GEN}),
    ("arguments as a JSON string (OpenAI's form)",
     [U("Weather in Paris?"),
      A("", tool_calls=[call("get_weather", '{"city": "Paris", "days": 2, "nested": {"a": [1, 2.0]}}')]), T("cloudy")],
     {"tools": [WEATHER], **GEN}),
    ("arguments as a compact JSON string with unicode escapes",
     [U("q"), A("", tool_calls=[call("web_search", '{"query":"caf\\u00e9 \\ud83d\\ude00","limit":3}')])],
     {"tools": [SEARCH], **GEN}),
    ("tool call without arguments, and with empty arguments",
     [U("q"), A("", tool_calls=[call("ping"), call("ping", {})])], {"tools": [WEATHER], **GEN}),
    ("tool call given without the function wrapper",
     [U("q"), A("ok", tool_calls=[call("get_weather", {"city": "Oslo"}, wrap=False)])], {"tools": [WEATHER], **GEN}),
    ("historical tool calls drop their reasoning",
     [U("Weather?"), A("", reasoning="need the tool", tool_calls=[call("get_weather", {"city": "Paris"})]),
      T("sunny"), A("It is sunny.", reasoning="answer"), U("And tomorrow?")], {"tools": [WEATHER], **GEN}),
    ("agent loop: calls, results, calls, results",
     [S("Be precise."), U("Plan a trip to Rome."),
      A("", reasoning="weather first", tool_calls=[call("get_weather", {"city": "Rome"})]), T("hot"),
      A("Searching.", reasoning="then hotels",
        tool_calls=[call("web_search", {"query": "hotels Rome"}), call("web_search", {"query": "museums Rome", "limit": 5})]),
      T("hotel list"), T("museum list")], {"tools": [WEATHER, SEARCH], **GEN}),
    ("agent loop, thinking off", [U("Weather?"), A("", tool_calls=[call("get_weather", {"city": "Paris"})]), T("sunny")],
     {"tools": [WEATHER], **NOTHINK}),
    ("agent loop, preserve_thinking",
     [U("Q1"), A("", reasoning="R1", tool_calls=[call("get_weather", {"city": "A"})]), T("x"), A("done", reasoning="R2"),
      U("Q2")], {"tools": [WEATHER], "add_generation_prompt": True, "preserve_thinking": True}),
    ("tool calls without tools given", [U("q"), A("calling", tool_calls=[call("get_weather", {"city": "Paris"})])], GEN),
    ("tool result as text parts",
     [U("q"), A("", tool_calls=[call("get_weather", {"city": "Paris"})]),
      T([{"type": "text", "text": "part one, "}, {"type": "text", "text": "part two"}])], {"tools": [WEATHER], **GEN}),
    ("content as text parts", [S([{"type": "text", "text": "sys "}, {"type": "text", "text": "prompt"}]),
                               U([{"type": "text", "text": "  hello "}, {"text": "world  "}])], GEN),
    ("system as text parts with tools", [S([{"type": "text", "text": "be brief"}]), U("q")], {"tools": [WEATHER], **GEN}),
    ("tool message first after system, with tools", [S("sys"), T("orphan"), U("now?")], {"tools": [WEATHER], **GEN}),
    ("error: content of an unexpected type", [U(42)], GEN),
    ("error: a content part without text", [U([{"type": "text", "value": "x"}])], GEN),
    ("error: no messages", [], GEN),
    ("error: only a system message", [S("alone")], GEN),
    ("error: only an assistant message", [A("hi")], {}),
    ("error: system not first", [U("hi"), S("late system")], GEN),
    ("error: unknown role", [U("hi"), {"role": "developer", "content": "x"}], GEN),
]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=str(HERE / "chat_cases.json"))
    args = ap.parse_args()

    import jinja2
    import transformers
    from tokenizers import Tokenizer
    from transformers import PreTrainedTokenizerFast

    template_path = ASSETS / "chat_template.jinja"
    template = template_path.read_text(encoding="utf-8")
    raw = gzip.decompress((ASSETS / "tokenizer.json.gz").read_bytes()).decode("utf-8")
    tok = PreTrainedTokenizerFast(tokenizer_object=Tokenizer.from_str(raw), eos_token="<|im_end|>",
                                  pad_token="<|endoftext|>")
    tok.chat_template = template

    out = []
    for name, messages, kwargs in CASES:
        case = {"name": name, "messages": messages, "kwargs": kwargs}
        rendered = messages
        if any(isinstance(tc.get("function", tc).get("arguments"), str) for m in messages for tc in m.get("tool_calls", [])):
            rendered = copy.deepcopy(messages)
            for m in rendered:
                for tc in m.get("tool_calls", []):
                    f = tc.get("function", tc)
                    f["arguments"] = json.loads(f["arguments"])
            case["arguments_parsed"] = True
        try:
            text = tok.apply_chat_template(rendered, tokenize=False, **kwargs)
            case["text"] = text
            case["ids"] = tok.encode(text, add_special_tokens=False)
        except jinja2.exceptions.TemplateError as e:  # raise_exception() in the template
            case["error"] = str(e)
        except ValueError as e:  # transformers refuses before rendering (an empty conversation)
            case["error"] = str(e)
            case["error_from"] = "transformers"
        out.append(case)
    doc = {"transformers": transformers.__version__, "jinja2": jinja2.__version__,
           "template_sha256": hashlib.sha256(template.encode("utf-8")).hexdigest(), "cases": out}
    pathlib.Path(args.out).write_text(json.dumps(doc, ensure_ascii=False, indent=1) + "\n", encoding="utf-8")
    print(f"{len(out)} cases ({sum('error' in c for c in out)} errors) -> {args.out}")


if __name__ == "__main__":
    main()
