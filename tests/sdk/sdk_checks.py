"""The official `openai` Python SDK through the gateway with one credential (an API key or a
provider's JWT): chat on every OpenAI service (plain, streamed with reasoning deltas, the final
`data: [DONE]`), a vision message, `enable_thinking` reaching the upstream, embeddings in both
encodings, models, chatx's model policy (default, aliases, pass-through, body validation, usage
counted), the 401 and 403 as SDK exceptions, metering (tests/sdk/metering.py), and a
`requests.Session` kept working after answers the gateway wrote itself."""
import base64
import hashlib
import json
import math
import random
import re
import struct
import time
import zlib

import openai
import requests

from harness import CheckFailed, expect, expect_eq
from metering import METRICS_WAIT, metering_checks, settled_token_counts, token_counts
from plain_http import HTTP_TIMEOUT

# run.py's OpenAI services (tests/gateway_config.py); chatx has this model policy.
SERVICES = ("infer", "chatx", "chaty", "embed")
CHATX_DEFAULT = "x-large-2"                               # chatx's model when a request names none
CHATX_ALIASES = {"large": "x-large-2", "small": "x-small-1"}

# What the fake upstream's demo model answers (testkit/src/upstream/model.rs), mirrored here
# so the checks test the Rust server against an independent statement of it.
CHAT_MODEL = "alpha3.6-vl"
EMB_MODEL = "emb-m3"
REASONING = "Thinking about it."   # reasoned before every answer unless enable_thinking=false


def fragments(text):
    """The model's tokens: runs of non-space characters with the spaces after them."""
    return re.findall(r"\S+\s*", text) or ([text] if text else [])


def embed(text):
    """The model's embedding of one text: 1024 values from CPython's PRNG seeded by the text's
    SHA-256 (model.rs implements that PRNG), L2-normalised, rounded to 6 decimals."""
    rng = random.Random(hashlib.sha256(text.encode("utf-8")).digest())
    vec = [rng.uniform(-1.0, 1.0) for _ in range(1024)]
    total = 0.0
    for v in vec:  # a plain running sum, as model.rs adds (sum() compensates since Python 3.12)
        total += v * v
    norm = math.sqrt(total) or 1.0
    return [round(v / norm, 6) for v in vec]


def png_1x1():
    def chunk(kind, data):
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))
    return (b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", 1, 1, 8, 6, 0, 0, 0))
            + chunk(b"IDAT", zlib.compress(b"\x00\xff\x00\x00\xff")) + chunk(b"IEND", b""))


def echo(text):
    return "Echo: " + text


def reasoning_of(obj):
    # Fields outside the SDK's models land in model_extra; getattr covers both.
    return getattr(obj, "reasoning_content", None)


def chat_checks(gw, token, service, model):
    client = gw.sdk(service, token)

    def non_streaming():
        r = client.chat.completions.create(model=model, messages=[
            {"role": "system", "content": "Be brief."}, {"role": "user", "content": f"hello {service}"}])
        expect_eq(r.object, "chat.completion", "object")
        expect_eq(r.model, model, "model echoed by the upstream")
        msg = r.choices[0].message
        expect_eq((msg.role, msg.content), ("assistant", echo(f"hello {service}")), "message")
        expect_eq(r.choices[0].finish_reason, "stop", "finish_reason")
        expect_eq(reasoning_of(msg), REASONING, "message.reasoning_content")
        expect(r.usage and r.usage.total_tokens == r.usage.prompt_tokens + r.usage.completion_tokens > 0,
               f"usage: {r.usage}")
        return f"id {r.id}"

    def streaming():
        stream = client.chat.completions.create(
            model=model, stream=True, messages=[{"role": "user", "content": f"stream {service} please"}])
        kinds, content, reasoning, finish = [], [], [], None
        for chunk in stream:
            expect_eq(chunk.object, "chat.completion.chunk", "chunk object")
            choice = chunk.choices[0]
            r = reasoning_of(choice.delta)
            if r:
                reasoning.append(r)
                kinds.append("r")
            if choice.delta.content:
                content.append(choice.delta.content)
                kinds.append("c")
            finish = choice.finish_reason or finish
        expect(stream.response.is_closed, "the SDK's stream did not end by itself")
        expect_eq("".join(reasoning), REASONING, "joined reasoning_content deltas")
        expect_eq("".join(content), echo(f"stream {service} please"), "joined content deltas")
        expect(len(content) > 1, f"answer arrived in {len(content)} delta(s), not token by token")
        expect("".join(kinds) == "r" * len(reasoning) + "c" * len(content), "reasoning deltas must precede content")
        expect_eq(finish, "stop", "final finish_reason")
        return f"{len(reasoning)} reasoning + {len(content)} content deltas"

    def done_line():
        # The SDK hides [DONE]; read the same request's raw SSE through the SDK's streaming response.
        with client.chat.completions.with_streaming_response.create(
                model=model, stream=True, messages=[{"role": "user", "content": "done?"}]) as resp:
            expect_eq(resp.status_code, 200, "status")
            expect(resp.headers.get("content-type", "").startswith("text/event-stream"),
                   f"content-type {resp.headers.get('content-type')}")
            expect("set-cookie" not in resp.headers, "upstream Set-Cookie reached the client")
            data = [line for line in resp.iter_lines() if line.startswith("data:")]
        expect(data and data[-1].strip() == "data: [DONE]", f"last data line {data[-1:]!r}")
        expect(all(json.loads(d[5:])["object"] == "chat.completion.chunk" for d in data[:-1]),
               "every other data line is a JSON chunk")
        return f"{len(data)} data lines, last [DONE]"

    return non_streaming, streaming, done_line


def infer_checks(gw, token):
    client = gw.sdk("infer", token)

    def vision():
        url = "data:image/png;base64," + base64.b64encode(png_1x1()).decode()
        r = client.chat.completions.create(model=CHAT_MODEL, messages=[{"role": "user", "content": [
            {"type": "text", "text": "What is in this image?"},
            {"type": "image_url", "image_url": {"url": url}}]}])
        # The upstream answers " [image:<media type>]" for each data: image part it parsed.
        expect_eq(r.choices[0].message.content, echo("What is in this image? [image:image/png]"), "answer")

    def thinking_off():
        msgs = [{"role": "user", "content": "no thinking"}]
        on = client.chat.completions.create(model=CHAT_MODEL, messages=msgs,
                                            extra_body={"chat_template_kwargs": {"enable_thinking": True}})
        off = client.chat.completions.create(model=CHAT_MODEL, messages=msgs,
                                             extra_body={"chat_template_kwargs": {"enable_thinking": False}})
        # The upstream drops reasoning only for a JSON `false` under chat_template_kwargs, so the
        # difference proves the field reached it as sent (object, key and boolean type intact).
        expect_eq(reasoning_of(on.choices[0].message), REASONING, "reasoning with enable_thinking=true")
        expect_eq(reasoning_of(off.choices[0].message), None, "reasoning with enable_thinking=false")
        expect_eq(off.choices[0].message.content, echo("no thinking"), "answer")
        stream = client.chat.completions.create(model=CHAT_MODEL, messages=msgs, stream=True,
                                                extra_body={"chat_template_kwargs": {"enable_thinking": False}})
        chunks = list(stream)
        expect(not any(reasoning_of(c.choices[0].delta) for c in chunks if c.choices),
               "a streamed reasoning delta despite enable_thinking=false")
        expect_eq("".join(c.choices[0].delta.content or "" for c in chunks if c.choices), echo("no thinking"),
                  "streamed answer")

    def models():
        ids = [m.id for m in client.models.list()]
        expect(CHAT_MODEL in ids, f"{CHAT_MODEL} not in {ids}")
        return ", ".join(ids)

    return vision, thinking_off, models


def embed_checks(gw, token):
    client = gw.sdk("embed", token)
    texts = ["first text", "zweiter Text", "troisième texte", "第四"]

    def compare(data):
        expect_eq([d.index for d in data], list(range(len(texts))), "indices, in order")
        for d, text in zip(data, texts):
            expect(isinstance(d.embedding, list) and len(d.embedding) == 1024
                   and all(isinstance(x, float) for x in d.embedding),
                   f"item {d.index}: not 1024 floats ({type(d.embedding).__name__}, {len(d.embedding)})")
            want = embed(text)  # deterministic per text: proves item i embeds input i
            worst = max(abs(a - b) for a, b in zip(d.embedding, want))
            expect(worst < 1e-6, f"item {d.index} is not the embedding of {text!r} (max diff {worst})")
        norm = math.sqrt(sum(x * x for x in data[0].embedding))
        expect(abs(norm - 1) < 1e-3, f"vector norm {norm}")

    def default_encoding():
        # The SDK asks for base64 by default and decodes it itself.
        r = client.embeddings.create(model=EMB_MODEL, input=texts)
        expect_eq((r.object, r.model), ("list", EMB_MODEL), "object, model")
        compare(r.data)
        expect(r.usage.total_tokens > 0, f"usage {r.usage}")
        return f"{len(r.data)} x {len(r.data[0].embedding)}"

    def float_encoding():
        r = client.embeddings.create(model=EMB_MODEL, input=texts, encoding_format="float")
        compare(r.data)

    def models():
        ids = [m.id for m in client.models.list()]
        expect(EMB_MODEL in ids, f"{EMB_MODEL} not in {ids}")

    return default_encoding, float_encoding, models


def policy_checks(gw, token):
    """chatx's model policy (default, aliases, pass-through), body validation and token usage."""
    client = gw.sdk("chatx", token)
    msgs = [{"role": "user", "content": "which model?"}]

    def default_model():
        # The SDK requires `model`; its omit sentinel leaves the key out of the JSON entirely.
        r = client.chat.completions.create(model=openai.omit, messages=msgs)
        expect_eq(r.model, CHATX_DEFAULT, "model the upstream received")
        expect_eq(r.choices[0].message.content, echo("which model?"), "answer")
        return f"model {r.model!r}"

    def alias_large():
        r = client.chat.completions.create(model="large", messages=msgs)
        expect_eq(r.model, CHATX_ALIASES["large"], "model the upstream received")
        return f"model {r.model!r}"

    def alias_small_streaming():
        chunks = list(client.chat.completions.create(model="small", stream=True, messages=msgs))
        expect(len(chunks) > 2, f"only {len(chunks)} chunks")
        models = {c.model for c in chunks}
        expect_eq(models, {CHATX_ALIASES["small"]}, "models of the streamed chunks")
        expect_eq("".join(c.choices[0].delta.content or "" for c in chunks if c.choices), echo("which model?"),
                  "streamed answer")
        return f"{len(chunks)} chunks, all {CHATX_ALIASES['small']!r}"

    def unknown_passes():
        r = client.chat.completions.create(model="x-medium-9", messages=msgs)
        expect_eq(r.model, "x-medium-9", "model the upstream received")

    def malformed():
        try:
            client.chat.completions.create(model="large", messages=[{"content": "no role"}])
        except openai.BadRequestError as e:
            expect_eq(e.status_code, 400, "status")
            expect_eq(e.response.json(), {"error": "bad_request", "message": "messages[0].role must be a string"},
                      "body")
            return f"BadRequestError 400, SDK message {e.message!r}"
        raise CheckFailed("a message without a role was accepted")

    def usage_counted():
        before = settled_token_counts(gw.metrics_url, "chatx")
        text = "count my tokens please"
        stream = client.chat.completions.create(model="small", stream=True, stream_options={"include_usage": True},
                                                messages=[{"role": "user", "content": text}])
        chunks = list(stream)
        last = chunks[-1]
        expect(last.usage is not None, f"last chunk has no usage: {last}")
        expect_eq(last.choices, [], "choices of the usage chunk")
        expect(all(c.usage is None for c in chunks[:-1]), "usage on a chunk before the last")
        u = last.usage
        # What the upstream counts: fragments of the prompt; answer plus reasoning fragments.
        want = (len(fragments(text)), len(fragments(echo(text))) + len(fragments(REASONING)))
        expect_eq((u.prompt_tokens, u.completion_tokens), want, "usage (prompt, completion)")
        expect_eq(u.total_tokens, u.prompt_tokens + u.completion_tokens, "total_tokens")
        # The two counters move one after the other: a scrape may fall between them, so wait
        # for the whole increase rather than the first change.
        expected = {"prompt": u.prompt_tokens, "completion": u.completion_tokens}
        deadline = time.monotonic() + METRICS_WAIT
        while True:
            after = token_counts(gw.metrics_url, "chatx")
            delta = {k: after[k] - before[k] for k in after}
            if delta == expected or time.monotonic() > deadline:
                break
            time.sleep(0.05)
        expect_eq(delta, expected,
                  f"portcullis_tokens_total{{service=\"chatx\"}} increase within {METRICS_WAIT} s")
        return f"usage {u.prompt_tokens}+{u.completion_tokens}, counter {before} -> {after}"

    return default_model, alias_large, alias_small_streaming, unknown_passes, malformed, usage_counted


def expect_unauthorized(fn, what):
    try:
        fn()
    except openai.AuthenticationError as e:
        expect_eq(e.status_code, 401, "status")
        expect_eq(e.response.json(), {"error": "unauthorized"}, "body")
        expect_eq(e.response.headers.get("www-authenticate"), "Bearer", "WWW-Authenticate")
        return "AuthenticationError 401"
    raise CheckFailed(f"{what} was accepted")


def expect_forbidden(fn, what):
    try:
        fn()
    except openai.PermissionDeniedError as e:
        expect_eq(e.status_code, 403, "status")
        expect_eq(e.response.json().get("error"), "forbidden", "error code")
        return "PermissionDeniedError 403"
    raise CheckFailed(f"{what} was accepted")


def run_sdk_suite(res, gw, label, token, scoped):
    """The Python SDK checks with one credential; `scoped` is a credential with the embed scope
    but not chatx, for the 403 check."""
    for service, model in (("infer", CHAT_MODEL), ("chatx", "x-small"), ("chaty", "y-large")):
        non_streaming, streaming, done_line = chat_checks(gw, token, service, model)
        res.check(f"[py {label}] {service}: chat.completions.create", non_streaming)
        res.check(f"[py {label}] {service}: streaming content + reasoning_content deltas", streaming)
        res.check(f"[py {label}] {service}: stream ends with data: [DONE]", done_line)
    vision, thinking_off, infer_models = infer_checks(gw, token)
    res.check(f"[py {label}] infer: vision message with a data:image/png part", vision)
    res.check(f"[py {label}] infer: extra_body chat_template_kwargs.enable_thinking=false reaches the upstream",
              thinking_off)
    res.check(f"[py {label}] infer: models.list", infer_models)
    default_encoding, float_encoding, embed_models = embed_checks(gw, token)
    res.check(f"[py {label}] embed: embeddings.create, list input (SDK default base64)", default_encoding)
    res.check(f"[py {label}] embed: embeddings.create, list input, encoding_format=float", float_encoding)
    res.check(f"[py {label}] embed: models.list", embed_models)

    default_model, alias_large, alias_small, unknown, malformed, usage = policy_checks(gw, token)
    res.check(f"[py {label}] chatx: model omitted (openai.omit) gets the default {CHATX_DEFAULT}", default_model)
    res.check(f"[py {label}] chatx: model=\"large\" is replaced by {CHATX_ALIASES['large']}", alias_large)
    res.check(f"[py {label}] chatx: model=\"small\" streaming, every chunk {CHATX_ALIASES['small']}", alias_small)
    res.check(f"[py {label}] chatx: unknown model=\"x-medium-9\" passes unchanged", unknown)
    res.check(f"[py {label}] chatx: a message without role raises BadRequestError 400 naming the field", malformed)
    res.check(f"[py {label}] chatx: stream_options.include_usage: last chunk's usage counted in "
              f"portcullis_tokens_total", usage)

    def forbidden():
        detail = expect_forbidden(lambda: gw.sdk("chatx", scoped).chat.completions.create(
            model="x", messages=[{"role": "user", "content": "hi"}]), "chatx without the chatx scope")
        # The same credential works where its scope allows: the 403 is about scope, not the token.
        gw.sdk("embed", scoped).embeddings.create(model=EMB_MODEL, input=["ok"])
        return detail
    res.check(f"[py {label}] chatx without the chatx scope raises PermissionDeniedError", forbidden)

    # What the demo model counts: prompt fragments (at least 1); answer plus reasoning fragments.
    def want_chat(text):
        return len(fragments(text)), len(fragments(echo(text))) + len(fragments(REASONING))

    def want_text(prompt):
        return max(1, len(fragments(prompt))), len(fragments(echo(prompt)))
    for name, fn in metering_checks(gw, token, "infer", CHAT_MODEL, want_chat, want_text):
        res.check(f"[py {label}] {name}", fn)


def connection_reuse_checks(res, gw, token):
    """A real client that keeps its connections (requests.Session): after an answer the gateway
    wrote itself, the next request on the session must be answered, never sent into a
    connection the gateway closes after saying keep-alive. `gone` has no upstream listening
    (502); POSTs, which no client library replays."""
    def reuse():
        session = requests.Session()
        seen = []
        for path, status in (("/v1/gone/x", 502), ("/v1/infer/v1/chat/completions", 200),
                             ("/v1/nope/x", 404), ("/v1/infer/v1/chat/completions", 200),
                             ("/v1/gone/x", 502), ("/v1/gone/x", 502),
                             ("/v1/infer/v1/chat/completions", 200)):
            r = session.post(gw.url + path, json={"model": "m", "messages": [{"role": "user", "content": "hi"}]},
                             headers={"Authorization": f"Bearer {token}"}, timeout=HTTP_TIMEOUT)
            expect_eq(r.status_code, status, f"POST {path}")
            connection = r.headers.get("connection", "").lower()
            if status == 502:
                expect_eq(connection, "close", f"the 502 of {path} says whether the connection stays")
            seen.append(f"{status} {connection or 'keep-alive'}")
        return ", ".join(seen)
    res.check("[py] requests.Session keeps working after gateway-written 502s and a 404 (Connection: close "
              "when it closes)", reuse)
