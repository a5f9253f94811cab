"""The dialect bridge through the official Anthropic Python SDK (issue 32): `bridge`, an
`api = "anthropic"` service with `translate = { messages = "chat" }` in front of the fake
upstream's chat completions (its demo model: `Echo: <last user text>`, with the reasoning
`Thinking about it.` unless the request turns thinking off).

`messages.create` and `messages.stream` must give what a Messages server would: the blocks
(thinking, text), the stop reason, the usage in Messages' terms; the stream helper's final
message must equal the JSON answer to the same request; a server tool is the SDK's
BadRequestError with the gateway's message; `count_tokens` is answered by the gateway.
"""
import anthropic

from harness import expect, expect_eq

REASONING = "Thinking about it."


def bridge_service(port):
    """`bridge`: Messages clients in front of the fake upstream's chat endpoint."""
    return {"name": "bridge", "upstream": f"http://127.0.0.1:{port}/chatx", "api": "anthropic",
            "read_timeout_seconds": 30, "translate": {"messages": "chat"}}


def bridge_checks(gw):
    """(name, fn) pairs; the key is made here with the real CLI."""
    key = gw.create_key("sdk-bridge", "bridge")
    an = anthropic.Anthropic(base_url=f"{gw.url}/v1/bridge", auth_token=key, max_retries=0, timeout=20)
    ask = dict(model="demo-bridge", max_tokens=200, system="be brief",
               messages=[{"role": "user", "content": "hi bridge"}])

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

    return [
        ("bridge: messages.create gets thinking and text blocks from a chat server", create),
        ("bridge: thinking disabled turns the chat template's thinking off", thinking_off),
        ("bridge: messages.stream's final message equals the JSON answer", stream_equals_json),
        ("bridge: a server tool raises BadRequestError naming it, never forwarded", server_tool_refused),
        ("bridge: count_tokens is answered by the gateway", count_tokens),
    ]
