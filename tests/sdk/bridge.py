"""The dialect bridge through the official Python SDKs (issue 32), in front of the fake upstream's
demo model (`Echo: <last user text>`, with the reasoning `Thinking about it.` unless the request
turns thinking off; with function tools offered it calls the first, or the first two when the
user's text says `parallel`, with arguments `{"text": "<last user text>"}` and ids `call_<n>`,
and after a tool's result answers `Echo: <the result>`; testkit/src/upstream/model/tools.rs):
  bridge        api = "anthropic", translate = { messages = "chat" }: the anthropic SDK
  bridge_codex  api = "openai", translate = { responses = "chat" }: openai's Responses API
  bridge_gpt    api = "openai", translate = { chat = "responses" }: openai's chat completions
                on the demo model's Responses endpoint

Each must give what a server of the client's dialect would: the blocks, items or message
(thinking, text, tool calls), the stop reason, the usage in the client's terms; a whole tool
turn (the call, its result sent back, the echo) with the conversation resent each time (the
bridge is stateless); each SDK's stream helper accumulating the same answer as the JSON one;
what the target cannot express refused with BadRequestError naming it; `count_tokens` answered
by the gateway.
"""
import json

import anthropic
import openai

from agents import n
from harness import expect, expect_eq

REASONING = "Thinking about it."
SCHEMA = {"type": "object", "properties": {"text": {"type": "string"}}, "required": ["text"],
          "additionalProperties": False}
# The same two tools in each dialect (strict: the openai SDK's stream helpers parse only those).
MESSAGES_TOOLS = [{"name": name, "description": f"{name.title()}s a text.", "input_schema": SCHEMA}
                  for name in ("lookup", "fetch")]
RESPONSES_TOOLS = [{"type": "function", "name": t["name"], "description": t["description"],
                    "parameters": SCHEMA, "strict": True} for t in MESSAGES_TOOLS]
CHAT_TOOLS = [{"type": "function", "function": {k: v for k, v in t.items() if k != "type"}}
              for t in RESPONSES_TOOLS]


def bridge_services(port):
    """The three bridged services, each on the fake upstream's `/chatx` (its chat and its
    Responses endpoints)."""
    upstream = f"http://127.0.0.1:{port}/chatx"
    return [
        {"name": "bridge", "upstream": upstream, "api": "anthropic", "read_timeout_seconds": 30,
         "translate": {"messages": "chat"}},
        {"name": "bridge_codex", "upstream": upstream, "api": "openai", "read_timeout_seconds": 30,
         "translate": {"responses": "chat"}},
        {"name": "bridge_gpt", "upstream": upstream, "api": "openai", "read_timeout_seconds": 30,
         "translate": {"chat": "responses"}},
    ]


def arguments(text):
    """The demo model's arguments for a call on `text`, as its JSON writer spells them."""
    return json.dumps({"text": text}, separators=(",", ":"))


def bridge_checks(gw):
    """(name, fn) pairs; the key is made here with the real CLI."""
    key = gw.create_key("sdk-bridge", "bridge,bridge_codex,bridge_gpt")
    return messages_checks(gw, key) + responses_checks(gw, key) + chat_checks(gw, key)


# ---- messages = "chat": the anthropic SDK ---------------------------------------------------------

def messages_checks(gw, key):
    an = anthropic.Anthropic(base_url=f"{gw.url}/v1/bridge", auth_token=key, max_retries=0, timeout=20)
    ask = dict(model="demo-bridge", max_tokens=200, system="be brief",
               messages=[{"role": "user", "content": "hi bridge"}])

    def with_tools(text, **kw):
        return dict(model="demo-bridge", max_tokens=2048, system="be brief", tools=MESSAGES_TOOLS,
                    messages=[{"role": "user", "content": text}], **kw)

    def create():
        m = an.messages.create(**ask)
        expect_eq([b.type for b in m.content], ["thinking", "text"], "blocks")
        expect_eq(m.content[0].thinking, REASONING, "thinking block (the chat reasoning_content)")
        expect_eq(m.content[1].text, "Echo: hi bridge", "text block")
        expect_eq((m.role, m.stop_reason, m.type), ("assistant", "end_turn", "message"), "message fields")
        expect(m.usage.output_tokens > 0 and m.usage.input_tokens > 0, f"usage stated: {m.usage}")
        return f"id {m.id}, usage {m.usage.input_tokens}+{m.usage.output_tokens}"

    def thinking_off():
        m = an.messages.create(**ask, thinking={"type": "disabled"})
        expect_eq([b.type for b in m.content], ["text"], "blocks with thinking off")

    def stream_equals_json():
        whole = an.messages.create(**ask)
        with an.messages.stream(**ask) as s:
            texts = list(s.text_stream)
            final = s.get_final_message()
        expect_eq("".join(texts), "Echo: hi bridge", "text_stream joined")
        same = lambda m: ([b.model_dump(exclude={"signature"}) for b in m.content], m.stop_reason, m.model)
        expect_eq(same(final), same(whole), "the stream helper's final message and the JSON answer")
        expect(final.usage.output_tokens > 0, f"stream usage: {final.usage}")

    def server_tool_refused():
        try:
            an.messages.create(**ask, tools=[{"type": "web_search_20250305", "name": "web_search"}])
        except anthropic.BadRequestError as e:
            expect("web_search_20250305" in str(e), f"the message names the tool type: {e}")
            return str(e)[:120]
        raise AssertionError("a server tool was not refused")

    def count_tokens():
        c = an.messages.count_tokens(model="demo-bridge", messages=[{"role": "user", "content": "count me"}])
        expect(c.input_tokens > 0, f"input_tokens: {c.input_tokens}")
        return f"{c.input_tokens} tokens"

    def tool_round_trip():
        text, result = "look the bridge up", "the bridge is up"
        first = an.messages.create(**with_tools(text))
        expect_eq([b.type for b in first.content], ["thinking", "tool_use"], "blocks of the call")
        use = first.content[1]
        expect_eq((use.id, use.name, use.input), ("call_0", "lookup", {"text": text}), "tool_use block")
        expect_eq(first.stop_reason, "tool_use", "stop_reason")
        expect_eq((first.usage.input_tokens, first.usage.output_tokens),
                  (n("be brief") + n(text), n(arguments(text)) + n(REASONING)), "usage the upstream stated")
        # The whole conversation again, the assistant's blocks as the SDK returned them.
        second = an.messages.create(**with_tools(text) | {"messages": [
            {"role": "user", "content": text}, {"role": "assistant", "content": first.content},
            {"role": "user", "content": [{"type": "tool_result", "tool_use_id": use.id, "content": result}]}]})
        expect_eq([b.type for b in second.content], ["thinking", "text"], "blocks of the answer")
        expect_eq((second.content[1].text, second.stop_reason), ("Echo: " + result, "end_turn"),
                  "the tool result echoed")
        return f"{use.id} {use.name}({use.input}) -> {second.content[1].text!r}"

    def parallel_tools():
        text = "look both up in parallel"
        first = an.messages.create(**with_tools(text))
        uses = [b for b in first.content if b.type == "tool_use"]
        expect_eq([(u.id, u.name, u.input) for u in uses],
                  [("call_0", "lookup", {"text": text}), ("call_1", "fetch", {"text": text})], "tool_use blocks")
        expect_eq(first.stop_reason, "tool_use", "stop_reason")
        results = [{"type": "tool_result", "tool_use_id": u.id, "content": f"result of {u.name}"} for u in uses]
        second = an.messages.create(**with_tools(text) | {"messages": [
            {"role": "user", "content": text}, {"role": "assistant", "content": first.content},
            {"role": "user", "content": results}]})
        expect_eq(second.content[-1].text, "Echo: result of fetch", "the answer echoes the last result")
        one = an.messages.create(**with_tools(text, tool_choice={"type": "auto", "disable_parallel_tool_use": True}))
        expect_eq([b.name for b in one.content if b.type == "tool_use"], ["lookup"],
                  "disable_parallel_tool_use: one call")

    def tool_choice_and_thinking():
        text = "think about a fetch"
        on = an.messages.create(**with_tools(text, thinking={"type": "enabled", "budget_tokens": 1024},
                                             tool_choice={"type": "tool", "name": "fetch"}))
        expect_eq([b.type for b in on.content], ["thinking", "tool_use"], "blocks with thinking enabled")
        expect_eq((on.content[0].thinking, on.content[1].name), (REASONING, "fetch"),
                  "the thinking block, the tool tool_choice names")
        off = an.messages.create(**with_tools(text, thinking={"type": "disabled"}))
        expect_eq([b.type for b in off.content], ["tool_use"], "blocks with thinking disabled")
        expect_eq(off.usage.output_tokens, n(arguments(text)), "output_tokens without reasoning")

    def tool_stream_equals_json():
        request = with_tools("stream two lookups in parallel")
        whole = an.messages.create(**request)
        partial = {}
        snapshots = []
        with an.messages.stream(**request) as s:
            for event in s:
                if event.type == "content_block_delta" and event.delta.type == "input_json_delta":
                    partial[event.index] = partial.get(event.index, "") + event.delta.partial_json
                elif event.type == "input_json":
                    snapshots.append(event.snapshot)
            final = s.get_final_message()
        same = lambda m: ([b.model_dump(exclude={"signature"}) for b in m.content], m.stop_reason, m.model)
        expect_eq(same(final), same(whole), "the stream helper's final message and the JSON answer")
        inputs = {i: b.input for i, b in enumerate(whole.content) if b.type == "tool_use"}
        expect_eq(len(inputs), 2, "tool_use blocks in the JSON answer")
        expect_eq({i: json.loads(p) for i, p in partial.items()}, inputs, "input_json_delta pieces joined, per block")
        expect_eq(snapshots[-1], inputs[max(inputs)], "the last input_json snapshot")
        expect_eq((final.usage.input_tokens, final.usage.output_tokens),
                  (whole.usage.input_tokens, whole.usage.output_tokens), "stream usage and the JSON answer's")
        expect(final.usage.output_tokens > 0, f"stream usage: {final.usage}")
        return f"{len(snapshots)} input_json events"

    return [
        ("bridge: messages.create gets thinking and text blocks from a chat server", create),
        ("bridge: thinking disabled turns the chat template's thinking off", thinking_off),
        ("bridge: messages.stream's final message equals the JSON answer", stream_equals_json),
        ("bridge: a server tool raises BadRequestError naming it, never forwarded", server_tool_refused),
        ("bridge: count_tokens is answered by the gateway", count_tokens),
        ("bridge: a tool_use -> tool_result turn: the call's input, stop_reason tool_use, then the echo",
         tool_round_trip),
        ("bridge: parallel tool calls are two tool_use blocks; disable_parallel_tool_use makes one",
         parallel_tools),
        ("bridge: tool_choice names the tool called; thinking enabled adds a thinking block, disabled none",
         tool_choice_and_thinking),
        ("bridge: messages.stream with tools: the final message equals the JSON answer, input_json gives its input",
         tool_stream_equals_json),
    ]


# ---- responses = "chat": openai's Responses API on a chat server ----------------------------------

def response_summary(r):
    """What a Responses answer says, ids of the envelope aside."""
    def item(o):
        if o.type == "function_call":
            return (o.type, o.call_id, o.name, o.arguments, o.status)
        if o.type == "message":
            return (o.type, o.role, [(c.type, c.text) for c in o.content], o.status)
        return (o.type,)
    return [item(o) for o in r.output], r.status, r.usage.model_dump()


def responses_checks(gw, key):
    oc = openai.OpenAI(base_url=gw.base("bridge_codex"), api_key=key, max_retries=0, timeout=20)

    def turn(text):
        return dict(model="demo-codex", instructions="be brief", tools=RESPONSES_TOOLS,
                    input=[{"role": "user", "content": text}])

    def resent(request, output, result):
        """The whole conversation: the request's input, the output items, the call's output."""
        call = next(o for o in output if o.type == "function_call")
        return request | {"input": [*request["input"], *[o.model_dump(exclude_none=True) for o in output],
                                    {"type": "function_call_output", "call_id": call.call_id, "output": result}]}

    def function_call_round_trip():
        text, result = "find the codex", "the codex is found"
        request = turn(text)
        first = oc.responses.create(**request)
        expect_eq([o.type for o in first.output], ["reasoning", "function_call"], "output items")
        call = first.output[1]
        expect_eq((call.call_id, call.name, json.loads(call.arguments)), ("call_0", "lookup", {"text": text}),
                  "function_call item")
        expect_eq((first.status, first.output_text), ("completed", ""), "status, no output_text")
        u = first.usage
        expect_eq((u.input_tokens, u.output_tokens, u.output_tokens_details.reasoning_tokens),
                  (n("be brief") + n(text), n(arguments(text)) + n(REASONING), n(REASONING)),
                  "usage the upstream stated")
        second = oc.responses.create(**resent(request, first.output, result))
        expect_eq(second.output_text, "Echo: " + result, "output_text: the function output echoed")
        expect_eq([o.type for o in second.output], ["reasoning", "message"], "output items of the answer")
        return f"{call.call_id} {call.name}{call.arguments} -> {second.output_text!r}"

    def parallel_function_calls():
        text = "find both in parallel"
        r = oc.responses.create(**turn(text))
        expect_eq([(o.call_id, o.name, o.arguments) for o in r.output if o.type == "function_call"],
                  [("call_0", "lookup", arguments(text)), ("call_1", "fetch", arguments(text))], "function_call items")
        one = oc.responses.create(**turn(text), parallel_tool_calls=False)
        expect_eq([o.name for o in one.output if o.type == "function_call"], ["lookup"],
                  "parallel_tool_calls false: one call")

    def stream_equals_json():
        text = "stream the codex"
        request = turn(text)
        whole = oc.responses.create(**request)
        deltas, snapshot = [], None
        with oc.responses.stream(**request) as s:
            for event in s:
                if event.type == "response.function_call_arguments.delta":
                    deltas.append(event.delta)
                    snapshot = event.snapshot
            final = s.get_final_response()
        expect_eq(response_summary(final), response_summary(whole),
                  "get_final_response() and the JSON answer: items, status, usage")
        expect_eq(("".join(deltas), snapshot), (arguments(text),) * 2, "arguments deltas joined, the last snapshot")
        # The answer after the call's output, streamed: its text.
        answer = resent(request, whole.output, "streamed result")
        whole = oc.responses.create(**answer)
        with oc.responses.stream(**answer) as s:
            texts = [e.delta for e in s if e.type == "response.output_text.delta"]
            final = s.get_final_response()
        expect_eq(response_summary(final), response_summary(whole), "the answer streamed and the JSON answer")
        expect_eq(("".join(texts), final.output_text), ("Echo: streamed result",) * 2, "text deltas, output_text")
        return f"{len(deltas)} argument deltas, {len(texts)} text deltas"

    def previous_response_id_refused():
        try:
            oc.responses.create(model="demo-codex", input="again", previous_response_id="resp_earlier")
        except openai.BadRequestError as e:
            body = e.response.json()
            expect_eq((e.status_code, body.get("error")), (400, "bad_request"), "status and error")
            expect("previous_response_id" in body.get("message", ""), f"the message names it: {body}")
            return body["message"]
        raise AssertionError("previous_response_id was not refused")

    return [
        ("bridge responses>chat: a function_call item, then the whole conversation with its output gets the echo",
         function_call_round_trip),
        ("bridge responses>chat: parallel calls are two function_call items; parallel_tool_calls false makes one",
         parallel_function_calls),
        ("bridge responses>chat: responses.stream's get_final_response() equals the JSON answer, call and text",
         stream_equals_json),
        ("bridge responses>chat: previous_response_id raises BadRequestError naming it", previous_response_id_refused),
    ]


# ---- chat = "responses": openai's chat completions on a Responses server ----------------------------

def chat_checks(gw, key):
    og = openai.OpenAI(base_url=gw.base("bridge_gpt"), api_key=key, max_retries=0, timeout=20)

    def turn(text):
        return dict(model="demo-gpt", tools=CHAT_TOOLS, messages=[{"role": "user", "content": text}])

    def calls_of(message):
        return [(c.id, c.type, c.function.name, c.function.arguments) for c in message.tool_calls or []]

    def tool_round_trip():
        text, result = "ask the responses server", "it answered"
        request = turn(text)
        first = og.chat.completions.create(**request)
        choice = first.choices[0]
        expect_eq(calls_of(choice.message), [("call_0", "function", "lookup", arguments(text))], "tool_calls")
        expect_eq((choice.finish_reason, choice.message.content), ("tool_calls", None), "finish_reason, content")
        u = first.usage
        expect_eq((u.prompt_tokens, u.completion_tokens, u.completion_tokens_details.reasoning_tokens),
                  (n(text), n(arguments(text)) + n(REASONING), n(REASONING)), "usage the upstream stated")
        # The assistant's message as the SDK returned it, then the tool's.
        second = og.chat.completions.create(**request | {"messages": [
            *request["messages"], choice.message, {"role": "tool", "tool_call_id": "call_0", "content": result}]})
        expect_eq((second.choices[0].message.content, second.choices[0].finish_reason), ("Echo: " + result, "stop"),
                  "the tool message echoed")
        return f"{calls_of(choice.message)} -> {second.choices[0].message.content!r}"

    def stream_helper_equals_json():
        text = "stream a lookup"
        request = turn(text) | {"stream_options": {"include_usage": True}}
        whole = og.chat.completions.create(**turn(text))
        done = []
        with og.chat.completions.stream(**request) as s:
            for event in s:
                if event.type == "tool_calls.function.arguments.done":
                    done.append((event.name, event.arguments, event.parsed_arguments))
            final = s.get_final_completion()
        choice = final.choices[0]
        expect_eq((calls_of(choice.message), choice.finish_reason),
                  (calls_of(whole.choices[0].message), "tool_calls"), "get_final_completion() and the JSON answer")
        expect_eq(choice.message.tool_calls[0].function.parsed_arguments, {"text": text}, "parsed_arguments")
        expect_eq(done, [("lookup", arguments(text), {"text": text})], "arguments.done events")
        expect(final.usage is not None, "usage with stream_options.include_usage")
        expect_eq(final.usage.model_dump(), whole.usage.model_dump(), "stream usage and the JSON answer's")

    def stream_chunks_accumulate():
        text = "stream both in parallel"
        request = turn(text)
        whole = og.chat.completions.create(**request)
        calls, finish = {}, None
        chunks = list(og.chat.completions.create(**request, stream=True, stream_options={"include_usage": True}))
        for chunk in chunks:
            for choice in chunk.choices:
                finish = choice.finish_reason or finish
                for d in choice.delta.tool_calls or []:
                    c = calls.setdefault(d.index, {"id": None, "type": None, "name": "", "arguments": ""})
                    c["id"], c["type"] = d.id or c["id"], d.type or c["type"]
                    if d.function:
                        c["name"] += d.function.name or ""
                        c["arguments"] += d.function.arguments or ""
        got = [(c["id"], c["type"], c["name"], c["arguments"]) for _, c in sorted(calls.items())]
        expect_eq((got, finish), (calls_of(whole.choices[0].message), "tool_calls"),
                  "tool-call deltas accumulated by index, and the JSON answer")
        expect_eq(len(got), 2, "parallel calls")
        last = chunks[-1]
        expect_eq((last.choices, last.usage.model_dump() if last.usage else None), ([], whole.usage.model_dump()),
                  "the last chunk: no choices, the usage")
        plain = list(og.chat.completions.create(**request, stream=True))
        expect(all(c.usage is None for c in plain), "no usage chunk without stream_options.include_usage")
        return f"{len(chunks)} chunks"

    return [
        ("bridge chat>responses: tool_calls with finish_reason tool_calls, then a tool message gets the echo",
         tool_round_trip),
        ("bridge chat>responses: chat.completions.stream's final completion equals the JSON answer, with usage",
         stream_helper_equals_json),
        ("bridge chat>responses: stream=True tool-call deltas accumulate to the JSON answer's calls; usage last",
         stream_chunks_accumulate),
    ]
