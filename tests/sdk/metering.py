"""Metering through the official Python SDK (issue 21): what the gateway's token counter
(`portcullis_tokens_total` on its Prometheus listener) must show for requests a client makes
without asking for usage, and that the client still sees what it asked for.

The checks named "... metered" need the gateway to add `stream_options.include_usage` upstream
(and strip the usage chunk it adds) and to meter `/completions`: until it does they fail, by
design, with the counter's increase in the message.
"""
import re
import time
import urllib.request

from harness import CheckFailed, expect, expect_eq

METRICS_WAIT = 2        # seconds the token counter may lag the end of a stream (it moves when the request is logged)
AWAITS = " (needs the gateway's include_usage injection, issue 21)"
AWAITS_COMPLETIONS = " (needs the gateway to meter /completions, issue 21)"


def token_counts(metrics_url, service):
    """{"prompt": n, "completion": n} from portcullis_tokens_total on /metrics (0 when absent)."""
    with urllib.request.urlopen(metrics_url, timeout=20) as r:
        expect_eq(r.status, 200, "GET /metrics status")
        body = r.read()
    counts = {"prompt": 0, "completion": 0}
    for line in body.decode().splitlines():
        m = re.fullmatch(r"portcullis_tokens_total\{([^}]*)\}\s+(\S+)", line)
        if not m:
            continue
        labels = dict(re.findall(r'(\w+)="([^"]*)"', m.group(1)))
        if labels.get("service") == service and labels.get("kind") in counts:
            counts[labels["kind"]] = int(float(m.group(2)))
    return counts


def settled_token_counts(metrics_url, service):
    """The counts once no earlier request's logging is still moving them."""
    before = token_counts(metrics_url, service)
    deadline = time.monotonic() + METRICS_WAIT
    while time.monotonic() < deadline:
        time.sleep(0.1)
        now = token_counts(metrics_url, service)
        if now == before:
            return now
        before = now
    raise CheckFailed(f"portcullis_tokens_total for {service} still moving after {METRICS_WAIT} s")


def expect_increase(metrics_url, service, before, usage):
    """Waits up to METRICS_WAIT for the counters to grow by exactly `usage`'s prompt and
    completion tokens (they move one after the other: wait for the whole increase)."""
    expected = {"prompt": usage.prompt_tokens, "completion": usage.completion_tokens}
    deadline = time.monotonic() + METRICS_WAIT
    while True:
        after = token_counts(metrics_url, service)
        delta = {k: after[k] - before[k] for k in after}
        if delta == expected or time.monotonic() > deadline:
            break
        time.sleep(0.05)
    expect_eq(delta, expected, f"portcullis_tokens_total{{service=\"{service}\"}} increase within {METRICS_WAIT} s")
    return f"usage {usage.prompt_tokens}+{usage.completion_tokens}, counter {before} -> {after}"


def usage_chunk_of(chunks):
    last = chunks[-1]
    expect(last.usage is not None and last.choices == [], f"no usage-only last chunk: {last}")
    return last.usage


def metering_checks(gw, token, service, model, want_chat, want_text):
    """Check functions for one credential. `want_chat(text)` and `want_text(prompt)` are the
    (prompt, completion) tokens the demo model counts for a one-message chat and a text
    completion, as run.py states them independently of the model's code."""
    client = gw.sdk(service, token)
    metrics = gw.metrics_url

    def chat_stream(text, **kw):
        return list(client.chat.completions.create(
            model=model, stream=True, messages=[{"role": "user", "content": text}], **kw))

    def stream_shows_no_usage():
        chunks = chat_stream("no usage for me")
        expect(len(chunks) > 2, f"only {len(chunks)} chunks")
        # OpenAI sends no usage member without include_usage; None is what the SDK makes of
        # a "usage": null the gateway may leave on content chunks.
        for c in chunks:
            expect(c.choices, f"a chunk without choices (a usage chunk?): {c}")
            expect(c.usage is None, f"a chunk with usage: {c}")
        return f"{len(chunks)} chunks, none with usage"

    def stream_metered():
        text = "meter this stream please"
        # The same request with include_usage: what the model counts for it (deterministic).
        usage = usage_chunk_of(chat_stream(text, stream_options={"include_usage": True}))
        expect_eq((usage.prompt_tokens, usage.completion_tokens), want_chat(text), "the model's usage")
        before = settled_token_counts(metrics, service)
        chat_stream(text)
        return expect_increase(metrics, service, before, usage)

    def completions_json_metered():
        prompt = "complete this"
        before = settled_token_counts(metrics, service)
        r = client.completions.create(model=model, prompt=prompt)
        expect_eq((r.object, r.choices[0].text), ("text_completion", "Echo: " + prompt), "answer")
        expect_eq((r.usage.prompt_tokens, r.usage.completion_tokens), want_text(prompt), "usage")
        return expect_increase(metrics, service, before, r.usage)

    def completions_stream_metered():
        prompt = "stream this completion"
        chunks = list(client.completions.create(model=model, prompt=prompt, stream=True,
                                                stream_options={"include_usage": True}))
        usage = usage_chunk_of(chunks)
        before = settled_token_counts(metrics, service)
        chunks = list(client.completions.create(model=model, prompt=prompt, stream=True))
        expect_eq("".join(c.choices[0].text for c in chunks if c.choices), "Echo: " + prompt, "streamed text")
        expect(all(c.choices and c.usage is None for c in chunks), "a usage chunk reached the client")
        return expect_increase(metrics, service, before, usage)

    return [
        (f"{service}: stream=True without stream_options: no chunk carries usage", stream_shows_no_usage),
        (f"{service}: stream=True without stream_options is metered exactly{AWAITS}", stream_metered),
        (f"{service}: completions.create (JSON) is metered{AWAITS_COMPLETIONS}", completions_json_metered),
        (f"{service}: completions.create stream=True without stream_options is metered exactly{AWAITS}",
         completions_stream_metered),
    ]
