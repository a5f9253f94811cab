"""The agent APIs through the official Python SDKs (issue 23): OpenAI's Responses API
(`client.responses.create`, plain and `stream=True`) on chatx, an `api = "openai"` service, and
Anthropic's Messages API (`messages.create`, plain and streamed, `messages.count_tokens`) on
claude, an `api = "anthropic"` service, with `auth_token=` (Bearer) as Claude Code sends it.

Each request checks what the demo model answered (text and usage, stated here from its rules,
testkit/src/upstream/model/agents.rs), the model the upstream received (the policy applied),
and the usage ledger (`portcullis usage`, the key store's rows for this key, service and model)
against the usage the upstream stated; malformed bodies are the SDK's BadRequestError carrying
the gateway's message, and a spent budget its RateLimitError.
"""
import re
import subprocess
import time

import anthropic
import openai

from harness import CheckFailed, expect, expect_eq

# run.py's services for these checks (chatx's policy is run.py's CHATX_DEFAULT / CHATX_ALIASES).
CLAUDE_DEFAULT = "demo-claude-default"
CLAUDE_ALIASES = {"claude-sonnet-4-5": "demo-sonnet", "claude-haiku-4-5": "demo-haiku"}
REASONING = "Thinking about it."
LEDGER_WAIT = 10        # seconds: the ledger is written every flush_seconds (1 s)
COLUMNS = ("REQUESTS", "PROMPT", "COMPLETION", "REASONING", "CACHED")


def agents_service(port):
    """`claude`, the Anthropic service of these checks, on the fake upstream at `port` (a service
    of run.py's config, tests/gateway_config.py)."""
    return {"name": "claude", "upstream": f"http://127.0.0.1:{port}/claude", "api": "anthropic",
            "read_timeout_seconds": 30, "models": {"default": CLAUDE_DEFAULT, "aliases": CLAUDE_ALIASES}}


def fragments(text):
    """The demo model's tokens: runs of non-space characters with the spaces after them."""
    return re.findall(r"\S+\s*", text) or ([text] if text else [])


def n(text):
    return len(fragments(text))


class Ledger:
    """The usage ledger as `portcullis usage --group-by key,service,model` prints it."""

    def __init__(self, gw):
        self.gw = gw

    def rows(self):
        out = subprocess.run([self.gw.binary, "usage", "--config", self.gw.config, "--group-by", "key,service,model"],
                             capture_output=True, text=True, timeout=30)
        expect(out.returncode == 0, f"portcullis usage failed ({out.returncode}): {out.stderr.strip()}")
        lines = out.stdout.splitlines()
        header = lines[0].replace("KEY ID", "KEY_ID").split()
        return [dict(zip(header, line.split())) for line in lines[1:] if line.strip()]

    def of(self, key_id, service, model):
        for row in self.rows():
            if (row.get("KEY_ID"), row.get("SERVICE"), row.get("MODEL")) == (key_id, service, model):
                return {c: int(row[c]) for c in COLUMNS}
        return dict.fromkeys(COLUMNS, 0)

    def expect_added(self, key_id, service, model, before, want):
        """Waits for the row to grow by exactly `want` (one request's usage)."""
        want = {"REQUESTS": 1, **want}
        deadline = time.monotonic() + LEDGER_WAIT
        while True:
            now = self.of(key_id, service, model)
            delta = {c: now[c] - before[c] for c in COLUMNS}
            if delta == want or time.monotonic() > deadline:
                break
            time.sleep(0.2)
        expect_eq(delta, want, f"ledger row ({service}, {model}) increase within {LEDGER_WAIT} s")
        return f"ledger +{delta['PROMPT']}/{delta['COMPLETION']} (reasoning {delta['REASONING']}, " \
               f"cached {delta['CACHED']})"


def key_id_of(key):
    return re.fullmatch(r"ak_([0-9a-f]{16})\..*", key).group(1)


def responses_usage(u):
    return {"PROMPT": u.input_tokens, "COMPLETION": u.output_tokens,
            "REASONING": u.output_tokens_details.reasoning_tokens, "CACHED": u.input_tokens_details.cached_tokens}


def messages_usage(u):
    prompt = u.input_tokens + (u.cache_creation_input_tokens or 0) + (u.cache_read_input_tokens or 0)
    return {"PROMPT": prompt, "COMPLETION": u.output_tokens, "REASONING": 0,
            "CACHED": u.cache_read_input_tokens or 0}


def expect_bad_request(call, error_type, message):
    """`call` raises the SDK's BadRequestError with the gateway's body; Anthropic's SDK also
    writes the message into the error's text. (The openai SDK takes a text only from OpenAI's
    nested `{"error": {"message"}}`, and interface.md pins a flat `{"error", "message"}`.)"""
    try:
        call()
    except error_type as e:
        expect_eq(e.status_code, 400, "status")
        expect_eq(e.response.json(), {"error": "bad_request", "message": message}, "body")
        if error_type is anthropic.BadRequestError:
            expect(message in str(e), f"the SDK's error text {str(e)!r} lacks {message!r}")
        return f"{type(e).__name__}: {str(e)!r}"
    raise CheckFailed("a malformed body was answered")


def expect_budget_refusal(call, error_type, window):
    try:
        call()
    except error_type as e:
        expect_eq(e.status_code, 429, "status")
        body = e.response.json()
        expect_eq(body.get("error"), "budget_exceeded", "error code")
        expect(window in body.get("message", ""), f"message {body.get('message')!r} does not name {window}")
        expect(e.response.headers.get("retry-after", "").isdigit(), "Retry-After")
        return f"{type(e).__name__}: {body['message']!r}"
    raise CheckFailed(f"a request past a {window} budget was answered")


def agent_checks(gw, chatx_default, chatx_aliases):
    """(name, fn) pairs; keys of their own are made here with the real CLI."""
    key = gw.create_key("sdk-agents", "chatx,claude")
    kid = key_id_of(key)
    ledger = Ledger(gw)
    oa = openai.OpenAI(base_url=gw.base("chatx"), api_key=key, max_retries=0, timeout=20)

    def claude(token, **kw):
        # auth_token sends Authorization: Bearer, as Claude Code's ANTHROPIC_AUTH_TOKEN does.
        return anthropic.Anthropic(base_url=f"{gw.url}/v1/claude", max_retries=0, timeout=20,
                                   **({"auth_token": token} if token else {}), **kw)
    an = claude(key)
    instructions, text = "Answer briefly.", "what does the gateway meter"

    def responses_plain():
        before = ledger.of(kid, "chatx", chatx_default)
        r = oa.responses.create(model=openai.omit, instructions=instructions, input=text)
        expect_eq(r.output_text, "Echo: " + text, "output_text")
        expect_eq(r.model, chatx_default, "model the upstream received (the default)")
        expect_eq([o.type for o in r.output], ["reasoning", "message"], "output items")
        want = {"PROMPT": n(instructions) + n(text), "COMPLETION": n("Echo: " + text) + n(REASONING),
                "REASONING": n(REASONING), "CACHED": n(instructions)}
        expect_eq(responses_usage(r.usage), want, "usage the upstream stated")
        return ledger.expect_added(kid, "chatx", chatx_default, before, want)

    def responses_stream():
        model = chatx_aliases["small"]
        before = ledger.of(kid, "chatx", model)
        words = "stream the responses"
        stream = oa.responses.create(model="small", input=[{"role": "user", "content": words}], stream=True)
        events = list(stream)
        types = [e.type for e in events]
        expect_eq((types[0], types[-1]), ("response.created", "response.completed"), "first and last event")
        expect_eq([e.sequence_number for e in events], list(range(len(events))), "sequence numbers")
        deltas = [e.delta for e in events if e.type == "response.output_text.delta"]
        expect_eq("".join(deltas), "Echo: " + words, "joined output_text deltas")
        expect_eq(deltas, fragments("Echo: " + words), "one delta per token, unchanged")
        final = events[-1].response
        expect_eq({events[0].response.model, final.model}, {model}, "models the upstream received (the alias)")
        want = {"PROMPT": n(words), "COMPLETION": n("Echo: " + words) + n(REASONING),
                "REASONING": n(REASONING), "CACHED": 0}
        expect_eq(responses_usage(final.usage), want, "usage in response.completed")
        return f"{len(events)} events; " + ledger.expect_added(kid, "chatx", model, before, want)

    def responses_stream_helper():
        # responses.stream(): the SDK's accumulator over the same events.
        with oa.responses.stream(model="x-medium-9", input="helper stream") as s:
            final = s.get_final_response()
        expect_eq((final.output_text, final.model), ("Echo: helper stream", "x-medium-9"),
                  "final response (an unknown model passes unchanged)")

    def responses_malformed():
        return expect_bad_request(lambda: oa.responses.create(model="large", input=5),
                                  openai.BadRequestError, "input must be a string or an array")

    def responses_malformed_stream():
        return expect_bad_request(lambda: oa.responses.create(model="large", input="x", max_output_tokens=-1,
                                                              stream=True),
                                  openai.BadRequestError, "max_output_tokens must be a non-negative integer")

    def messages_plain():
        model = CLAUDE_ALIASES["claude-sonnet-4-5"]
        before = ledger.of(kid, "claude", model)
        system, cached_part, rest = "You are terse.", "a long shared context", " then the question"
        m = an.messages.create(model="claude-sonnet-4-5", max_tokens=64, system=system, messages=[
            {"role": "user", "content": [{"type": "text", "text": cached_part, "cache_control": {"type": "ephemeral"}},
                                         {"type": "text", "text": rest}]}])
        answer = "Echo: " + cached_part + rest
        expect_eq([(b.type, b.text) for b in m.content], [("text", answer)], "content")
        expect_eq((m.model, m.stop_reason), (model, "end_turn"), "model the upstream received (the alias), stop")
        u = m.usage
        expect_eq((u.input_tokens, u.cache_creation_input_tokens, u.cache_read_input_tokens, u.output_tokens),
                  (n(rest), n(cached_part), n(system), n(answer)), "usage the upstream stated")
        return ledger.expect_added(kid, "claude", model, before, messages_usage(u))

    def messages_default_model():
        m = an.messages.create(model=anthropic.omit, max_tokens=64, messages=[{"role": "user", "content": "hi"}])
        expect_eq((m.model, m.content[0].text), (CLAUDE_DEFAULT, "Echo: hi"), "model (the default), answer")

    def messages_stream():
        model = CLAUDE_ALIASES["claude-haiku-4-5"]
        before = ledger.of(kid, "claude", model)
        words = "stream the messages please"
        events = list(an.messages.create(model="claude-haiku-4-5", max_tokens=64, stream=True, system="Be kind.",
                                         messages=[{"role": "user", "content": words}]))
        types = [e.type for e in events]
        expect_eq((types[0], types[-2], types[-1]), ("message_start", "message_delta", "message_stop"), "events")
        deltas = [e.delta.text for e in events if e.type == "content_block_delta"]
        expect_eq(deltas, fragments("Echo: " + words), "one text_delta per token, unchanged")
        start, delta = events[0].message, events[-2]
        expect_eq(start.model, model, "model the upstream received (the alias)")
        expect_eq((start.usage.input_tokens, start.usage.cache_read_input_tokens, start.usage.output_tokens),
                  (n(words), n("Be kind."), 1), "message_start usage")
        expect_eq(delta.usage.output_tokens, len(deltas), "message_delta output_tokens")
        want = {"PROMPT": n(words) + n("Be kind."), "COMPLETION": len(deltas), "REASONING": 0,
                "CACHED": n("Be kind.")}
        return f"{len(events)} events; " + ledger.expect_added(kid, "claude", model, before, want)

    def messages_stream_helper():
        with an.messages.stream(model="claude-sonnet-4-5", max_tokens=64,
                                messages=[{"role": "user", "content": "accumulate me"}]) as s:
            joined = "".join(s.text_stream)
            final = s.get_final_message()
        expect_eq((joined, final.content[0].text), ("Echo: accumulate me",) * 2, "text_stream, final message")
        expect_eq((final.usage.input_tokens, final.usage.output_tokens), (2, 3), "accumulated usage")

    def count_tokens():
        model = CLAUDE_ALIASES["claude-haiku-4-5"]
        before = ledger.of(kid, "claude", model)
        msgs = [{"role": "user", "content": "count these four words"}]
        raw = an.messages.with_raw_response.count_tokens(model="claude-haiku-4-5", system="Sys.", messages=msgs)
        expect_eq(raw.parse().input_tokens, 4 + 1, "input_tokens")
        expect_eq(raw.headers.get("x-demo-model"), model, "model the upstream received (the alias)")
        # A count is a request in the ledger, not tokens (docs/metering.md).
        zero = {"PROMPT": 0, "COMPLETION": 0, "REASONING": 0, "CACHED": 0}
        return ledger.expect_added(kid, "claude", model, before, zero)

    def messages_malformed():
        return expect_bad_request(
            lambda: an.messages.create(model="claude-sonnet-4-5", max_tokens=64, messages=[]),
            anthropic.BadRequestError, "messages must be a non-empty array")

    def messages_malformed_stream():
        return expect_bad_request(
            lambda: an.messages.create(model="claude-sonnet-4-5", max_tokens=0, stream=True,
                                       messages=[{"role": "user", "content": "x"}]),
            anthropic.BadRequestError, "max_tokens must be a positive integer")

    def count_tokens_malformed():
        return expect_bad_request(
            lambda: an.messages.count_tokens(model="claude-sonnet-4-5", messages=[{"role": 7, "content": "x"}]),
            anthropic.BadRequestError, "messages[0].role must be a string")

    def messages_mid_conversation_system():
        # As Claude Code sends on its default model: the role is the upstream's to judge.
        m = an.messages.create(model="claude-sonnet-4-5", max_tokens=64, messages=[
            {"role": "user", "content": "hi"}, {"role": "system", "content": "be terse"},
            {"role": "assistant", "content": "ok"}, {"role": "user", "content": "again"}])
        expect_eq(m.stop_reason, "end_turn", "a mid-conversation system message is forwarded and answered")

    def x_api_key_refused():
        # The key in x-api-key alone (Anthropic's own header) is no credential here. (These SDK
        # versions send api_key= as a Bearer token too, so the header is set by hand.)
        sent = {}
        try:
            claude(None, default_headers={"X-Api-Key": key}).messages.with_raw_response.create(
                model="claude-sonnet-4-5", max_tokens=8, messages=[{"role": "user", "content": "x"}])
        except anthropic.AuthenticationError as e:
            sent = e.response.request.headers
            expect_eq((e.status_code, e.response.json()), (401, {"error": "unauthorized"}), "response")
            expect("authorization" not in sent and sent.get("x-api-key") == key, f"headers sent {sent}")
            expect_eq(e.response.headers.get("www-authenticate"), "Bearer", "WWW-Authenticate")
            return "x-api-key alone gets 401"
        raise CheckFailed("a key sent as x-api-key was accepted")

    def budgets():
        out = []
        tokens = gw.create_key("sdk-agents-tokens", "chatx,claude", "--tokens-per-day", "1")
        out.append(expect_budget_refusal(lambda: openai.OpenAI(
            base_url=gw.base("chatx"), api_key=tokens, max_retries=0).responses.create(
                input="x", max_output_tokens=16), openai.RateLimitError, "tokens_per_day"))
        out.append(expect_budget_refusal(lambda: claude(tokens).messages.create(
            model="claude-sonnet-4-5", max_tokens=16, stream=True, messages=[{"role": "user", "content": "x"}]),
            anthropic.RateLimitError, "tokens_per_day"))
        requests = gw.create_key("sdk-agents-requests", "chatx,claude", "--requests-per-day", "2")
        rc, ac = openai.OpenAI(base_url=gw.base("chatx"), api_key=requests, max_retries=0), claude(requests)
        expect_eq(rc.responses.create(input="one").output_text, "Echo: one", "first answer")
        expect_eq(ac.messages.create(model="claude-haiku-4-5", max_tokens=8, messages=[
            {"role": "user", "content": "two"}]).content[0].text, "Echo: two", "second answer")
        out.append(expect_budget_refusal(lambda: list(rc.responses.create(input="three", stream=True)),
                                         openai.RateLimitError, "requests_per_day"))
        out.append(expect_budget_refusal(lambda: ac.messages.create(
            model="claude-haiku-4-5", max_tokens=8, messages=[{"role": "user", "content": "four"}]),
            anthropic.RateLimitError, "requests_per_day"))
        return "; ".join(out)

    return [
        (f"chatx: responses.create, model omitted gets {chatx_default}; text, usage and ledger as stated",
         responses_plain),
        ("chatx: responses.create stream=True, model=\"small\" replaced; events, usage and ledger as stated",
         responses_stream),
        ("chatx: responses.stream() accumulates the final response; an unknown model passes", responses_stream_helper),
        ("chatx: responses.create with input=5 raises BadRequestError with the gateway's message",
         responses_malformed),
        ("chatx: responses.create stream=True, max_output_tokens=-1 raises BadRequestError", responses_malformed_stream),
        ("claude: messages.create (auth_token), alias replaced; text, cache usage and ledger as stated",
         messages_plain),
        (f"claude: messages.create, model omitted gets {CLAUDE_DEFAULT}", messages_default_model),
        ("claude: messages.create stream=True, alias replaced; events, usage and ledger as stated", messages_stream),
        ("claude: messages.stream() text_stream and final message", messages_stream_helper),
        ("claude: messages.count_tokens, alias replaced; a request without tokens in the ledger", count_tokens),
        ("claude: messages=[] raises BadRequestError with the gateway's message", messages_malformed),
        ("claude: stream=True, max_tokens=0 raises BadRequestError", messages_malformed_stream),
        ("claude: count_tokens with a role that is not a string raises BadRequestError", count_tokens_malformed),
        ("claude: messages.create with a mid-conversation system message is answered",
         messages_mid_conversation_system),
        ("claude: a key in x-api-key alone is not accepted: AuthenticationError 401", x_api_key_refused),
        ("budgets: tokens_per_day and requests_per_day refusals are each SDK's RateLimitError", budgets),
    ]
