#!/usr/bin/env python3
"""SDK conformance and real-identity-provider tests for Portcullis.

Starts, on 127.0.0.1 and free ports: the fake upstream's demo model (target/debug/fake-upstream,
testkit/src/upstream/model.rs), a real OpenID Provider (tests/sdk/idp.mjs, npm oidc-provider
9.x) and the real gateway binary in front of the upstream, with API keys made by the real CLI.
Then it drives the gateway with the official `openai` Python SDK, the official `openai` Node SDK
(tests/sdk/node.test.mjs), the agent APIs (OpenAI Responses, Anthropic Messages) through the
official openai and anthropic SDKs of both languages (tests/sdk/agents.py, agents.test.mjs) and
tokens from the provider, printing one line per check and, last,
exactly `N passed, N failed`. The gateway enforces budgets ([budgets]); the budget checks
(tests/sdk/budgets.py and the Node file's) make budgeted keys of their own.

Run through scripts/sdk-tests.sh, which installs the SDKs; by hand:
    .venv/bin/python tests/sdk/run.py [--bin target/debug/portcullis]
        [--upstream target/debug/fake-upstream] [--config-bin target/debug/gateway-config] [--keep]
Exits 0 only when every check passed. Child processes are always stopped.
"""
import argparse
import base64
import hashlib
import http.cookiejar
import html
import json
import math
import os
import random
import re
import secrets
import signal
import struct
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.parse
import urllib.request
import zlib

import anthropic
import openai
import requests

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from harness import (  # noqa: E402  (tests/harness.py)
    CheckFailed, Child, Results, expect, expect_eq, finish, free_port, tail)
import gateway_config  # noqa: E402  (tests/gateway_config.py)
from metering import METRICS_WAIT, metering_checks, settled_token_counts, token_counts  # noqa: E402
from budgets import BUDGETS, budget_checks, wait_for_a_whole_day  # noqa: E402
from agents import agent_checks, agents_service  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SDK_DIR = os.path.join(ROOT, "tests", "sdk")
AUDIENCE = "urn:portcullis:test"          # the resource indicator = the gateway's audience
OTHER_AUDIENCE = "urn:portcullis:other"   # a resource server that is not the gateway
SERVICES = ("infer", "chatx", "chaty", "embed")
REDIRECT_URI = "http://127.0.0.1/callback"  # registered for the `console` client in idp.mjs
CC_CLIENT = ("svc-cc", "svc-cc-test-secret")
CODE_CLIENT = ("console", "console-test-secret")
START_TIMEOUT = 30      # seconds for any child to say it is ready
ROTATION_WINDOW = 15    # seconds a new kid may take to be accepted (gateway unknown-kid cooldown is 10 s)
HTTP_TIMEOUT = 20
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


class RunTimeout(BaseException):
    """The whole-run limit: a BaseException, so no check can swallow it."""


# ---- plain HTTP (for the provider's endpoints and exact status checks) --------------------------

class _NoRedirect(urllib.request.HTTPRedirectHandler):
    def redirect_request(self, *args, **kwargs):
        return None  # surface every 3xx, so each step of the login flow is explicit


def http_opener(jar=None):
    handlers = [_NoRedirect()]
    if jar is not None:
        handlers.append(urllib.request.HTTPCookieProcessor(jar))
    return urllib.request.build_opener(*handlers)


def http_call(url, method="GET", body=None, headers=None, opener=None):
    """(status, headers, body bytes) for any status; never follows redirects."""
    data = None
    headers = dict(headers or {})
    if isinstance(body, dict):
        data = urllib.parse.urlencode(body).encode()
        headers.setdefault("Content-Type", "application/x-www-form-urlencoded")
    elif isinstance(body, (bytes, str)):
        data = body.encode() if isinstance(body, str) else body
    req = urllib.request.Request(url, data=data, method=method, headers=headers)
    try:
        with (opener or http_opener()).open(req, timeout=HTTP_TIMEOUT) as r:
            return r.status, r.headers, r.read()
    except urllib.error.HTTPError as e:
        return e.code, e.headers, e.read()


def basic_auth(client):
    return "Basic " + base64.b64encode(f"{client[0]}:{client[1]}".encode()).decode()


def jwt_parts(token):
    def seg(s):
        return json.loads(base64.urlsafe_b64decode(s + "=" * (-len(s) % 4)))
    h, p, _ = token.split(".")
    return seg(h), seg(p)


# ---- the identity provider ----------------------------------------------------------------------

class Idp:
    def __init__(self, tmp):
        self.tmp, self.child, self.port = tmp, None, 0

    def start(self):
        """Starts (or restarts, on the same port) the provider: fresh signing keys each time."""
        self.child = Child("idp", ["node", os.path.join(SDK_DIR, "idp.mjs"), "--port", str(self.port),
                                   "--audience", AUDIENCE, "--other-audience", OTHER_AUDIENCE],
                           os.path.join(self.tmp, "idp.log"), wait_listening=True)
        self.port = self.child.port

    @property
    def issuer(self):
        return f"http://127.0.0.1:{self.port}"

    def stop(self):
        if self.child:
            self.child.stop()

    def client_credentials(self, scope, resource=AUDIENCE):
        status, _, body = http_call(
            f"{self.issuer}/token", "POST",
            {"grant_type": "client_credentials", "scope": scope, "resource": resource},
            {"Authorization": basic_auth(CC_CLIENT)})
        expect(status == 200, f"client_credentials token request: {status} {body[:300]!r}")
        return json.loads(body)

    def authorization_code(self, scope):
        """The authorization-code flow with PKCE, driven headless through oidc-provider's
        devInteractions login and consent pages with a cookie jar, as a browser would.
        Returns the token endpoint's JSON (access_token, id_token, ...)."""
        opener = http_opener(http.cookiejar.CookieJar())
        verifier = secrets.token_urlsafe(48)
        challenge = base64.urlsafe_b64encode(hashlib.sha256(verifier.encode()).digest()).rstrip(b"=").decode()
        state, nonce = secrets.token_urlsafe(16), secrets.token_urlsafe(16)
        url = f"{self.issuer}/auth?" + urllib.parse.urlencode({
            "client_id": CODE_CLIENT[0], "response_type": "code", "redirect_uri": REDIRECT_URI,
            "scope": scope, "resource": AUDIENCE, "state": state, "nonce": nonce,
            "code_challenge": challenge, "code_challenge_method": "S256"})
        method, form, code, prompts = "GET", None, None, []
        for _ in range(12):
            status, headers, body = http_call(url, method, form, opener=opener)
            method, form = "GET", None
            if status in (301, 302, 303, 307):
                nxt = urllib.parse.urljoin(url, headers["Location"])
                if nxt.startswith(REDIRECT_URI):
                    q = urllib.parse.parse_qs(urllib.parse.urlsplit(nxt).query)
                    expect("error" not in q, f"authorization error: {q}")
                    expect_eq(q.get("state"), [state], "state returned to the client")
                    code = q["code"][0]
                    break
                url = nxt
                continue
            page = body.decode("utf-8", "replace")
            action = re.search(r'<form[^>]*action="([^"]+)"[^>]*method="post"', page)
            prompt = re.search(r'name="prompt" value="(\w+)"', page)
            expect(status == 200 and action and prompt,
                   f"unexpected page in the login flow at {url}: {status} {page[:300]!r}")
            prompts.append(prompt.group(1))
            url, method = urllib.parse.urljoin(url, html.unescape(action.group(1))), "POST"
            form = {"prompt": prompt.group(1)}
            if prompt.group(1) == "login":
                form.update(login="alice", password="any")
        expect(code, f"no authorization code after the steps {prompts}")
        expect_eq(prompts, ["login", "consent"], "interaction prompts shown")
        status, _, body = http_call(
            f"{self.issuer}/token", "POST",
            {"grant_type": "authorization_code", "code": code, "redirect_uri": REDIRECT_URI,
             "code_verifier": verifier, "resource": AUDIENCE},
            {"Authorization": basic_auth(CODE_CLIENT)})
        expect(status == 200, f"code exchange: {status} {body[:300]!r}")
        return json.loads(body)


# ---- the gateway --------------------------------------------------------------------------------

def config(tmp, port, metrics_port, upstream_port, gone_port, issuer, key_store=None):
    """The gateway's config (tests/gateway_config.py): the four SERVICES, `gone` (on `gone_port`,
    where nothing listens), the agent checks' `claude`, API keys (SQLite in `tmp` unless
    `key_store`), the provider's JWTs and budgets."""
    # All four speak the OpenAI API (bodies validated, usage counted); chatx has a model policy.
    services = [{"name": s, "upstream": f"http://127.0.0.1:{upstream_port}/{s}", "api": "openai",
                 "read_timeout_seconds": 30} for s in SERVICES]
    services[SERVICES.index("chatx")]["models"] = {"default": CHATX_DEFAULT, "aliases": CHATX_ALIASES}
    # Nothing listens here: every request to `gone` is a 502 the gateway writes itself.
    services.append({"name": "gone", "upstream": f"http://127.0.0.1:{gone_port}", "scope": "infer"})
    services.append(agents_service(upstream_port))
    return {
        "comment": "written by tests/sdk/run.py", "dir": tmp, "port": port, "metrics_port": metrics_port,
        "server": {"threads": 2, "grace_period_seconds": 1, "graceful_shutdown_timeout_seconds": 1},
        "api_keys": {"database": key_store or f"sqlite://{tmp}/keys.db"},
        "jwt": {"issuer": issuer, "audience": AUDIENCE},
        "budgets": BUDGETS,
        "services": services,
    }


class Gateway:
    def __init__(self, binary, tmp, upstream_port, issuer, key_store=None, config_bin=gateway_config.BINARY):
        self.binary, self.tmp = binary, tmp
        self.port = free_port()
        self.metrics_port = free_port()
        self.config = gateway_config.write(os.path.join(tmp, "portcullis.toml"), config(
            tmp, self.port, self.metrics_port, upstream_port, free_port(), issuer, key_store), config_bin)
        self.child = Child("gateway", [binary, "serve", "--config", self.config],
                           os.path.join(tmp, "gateway.log"), wait_listening=False,
                           env={**os.environ, "RUST_LOG": os.environ.get("RUST_LOG", "info")})
        self.url = f"http://127.0.0.1:{self.port}"
        self.metrics_url = f"http://127.0.0.1:{self.metrics_port}/metrics"
        deadline = time.monotonic() + START_TIMEOUT
        while True:
            try:
                status, _, body = http_call(self.url + "/healthz")
                if status == 200 and json.loads(body) == {"status": "ok"}:
                    break
            except OSError:
                pass
            if self.child.proc.poll() is not None or time.monotonic() > deadline:
                code = self.child.proc.poll()
                self.child.stop()
                raise RuntimeError(f"gateway not healthy within {START_TIMEOUT}s (exit code {code}); "
                                   f"log:\n{tail(self.child.log_path)}")
            time.sleep(0.05)

    def create_key(self, name, scopes, *flags):
        """A key made by the real CLI; `flags`: more `keys create` flags (a budget)."""
        out = subprocess.run([self.binary, "keys", "create", "--config", self.config,
                              "--name", name, "--scopes", scopes, *flags],
                             capture_output=True, text=True, timeout=30, cwd=ROOT)
        if out.returncode != 0:
            raise RuntimeError(f"keys create failed ({out.returncode}): {out.stderr}")
        key = out.stdout.strip().splitlines()[-1]
        if not re.fullmatch(r"ak_[0-9a-f]{16}\.[A-Za-z0-9_-]{43}", key):
            raise RuntimeError(f"keys create: last line is not a key: {key!r}")
        return key

    def base(self, service):
        return f"{self.url}/v1/{service}/v1"

    def sdk(self, service, token):
        return openai.OpenAI(base_url=self.base(service), api_key=token, max_retries=0, timeout=HTTP_TIMEOUT)

    def get(self, service, path, token):
        return http_call(f"{self.url}/v1/{service}{path}", headers={"Authorization": f"Bearer {token}"})

    def post_json(self, service, path, token, obj):
        return http_call(f"{self.url}/v1/{service}{path}", "POST", json.dumps(obj),
                         {"Authorization": f"Bearer {token}", "Content-Type": "application/json"})


# ---- the checks ---------------------------------------------------------------------------------

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


def run_budget_suite(res, gw, free_token):
    """The budget checks (tests/sdk/budgets.py), once: `free_token` has no budget."""
    print(f"budgets: {wait_for_a_whole_day()}", flush=True)
    for name, fn in budget_checks(gw, free_token):
        res.check(f"[py budgets] {name}", fn)


def run_agent_suite(res, gw):
    """The agent API checks (tests/sdk/agents.py), once: they make their keys themselves."""
    try:
        checks = agent_checks(gw, CHATX_DEFAULT, CHATX_ALIASES)
    except Exception as e:  # no key: report it, run the rest
        res.record("[py agents] a key for the agent checks", False, f"{type(e).__name__}: {e}")
        return
    for name, fn in checks:
        res.check(f"[py agents] {name}", fn)


def run_node_suite(res, gw, label, token, tmp, budgets=False, file="node.test.mjs"):
    """`budgets`: also the Node budget tests, which make their keys with the gateway's CLI (as
    the agent tests, agents.test.mjs, always do)."""
    env = {**os.environ, "PORTCULLIS_URL": gw.url, "PORTCULLIS_TOKEN": token,
           "PORTCULLIS_METRICS_URL": gw.metrics_url}
    if budgets:
        env.update(PORTCULLIS_CLI=os.path.abspath(gw.binary), PORTCULLIS_CONFIG=gw.config)  # node runs in SDK_DIR
    log = os.path.join(tmp, f"node-{label}.log")
    try:
        out = subprocess.run(["node", "--test", "--test-reporter=tap", os.path.join(SDK_DIR, file)],
                             capture_output=True, text=True, timeout=120, env=env, cwd=SDK_DIR)
        text, code = out.stdout + out.stderr, out.returncode
    except subprocess.TimeoutExpired as e:
        text, code = f"timed out after 120 s\n{e.stdout or ''}", -1
    with open(log, "w") as f:
        f.write(text)
    # Top-level TAP results, each with its YAML diagnostics block (error, expected, actual...).
    results = re.findall(r"^(ok|not ok) \d+ - (.*?)(?: # \w+.*)?\n(?:  ---\n((?:  .*\n)*?)  \.\.\.)?",
                         text, re.M)
    for status, name, diag in results:
        detail = "" if status == "ok" else " / ".join(
            line.strip() for line in diag.splitlines()
            if re.match(r"  (error|expected|actual|operator|failureType):", line)) + f" (full output: {log})"
        res.record(f"[node {label}] {name}", status == "ok", detail)
    declared = re.search(r"^# tests (\d+)$", text, re.M)
    if not results or code != 0 and all(s == "ok" for s, _, _ in results) or \
            not declared or int(declared.group(1)) != len(results):
        res.record(f"[node {label}] node --test completed", False,
                   f"exit code {code}, {len(results)} results parsed; output:\n{text[-1500:]}")


def idp_checks(res, gw, idp):
    """The gateway against the real provider. Returns the authorization-code access token."""
    tokens = {}

    def discovery():
        status, _, body = http_call(idp.issuer + "/.well-known/openid-configuration")
        doc = json.loads(body)
        expect_eq((status, doc.get("issuer")), (200, idp.issuer), "discovery issuer")
        return f"jwks_uri {doc['jwks_uri']}"
    res.check("[idp] discovery document names the issuer the gateway was given", discovery)

    def cc_token():
        t = idp.client_credentials("infer embed")
        header, claims = jwt_parts(t["access_token"])
        expect_eq(header.get("typ"), "at+jwt", "typ (RFC 9068)")
        expect_eq(header.get("alg"), "RS256", "alg")
        expect(header.get("kid"), "no kid")
        expect_eq((claims.get("iss"), claims.get("aud")), (idp.issuer, AUDIENCE), "iss, aud")
        expect_eq(claims.get("scope"), "infer embed", "scope")
        expect(claims.get("sub"), f"no sub in a client_credentials token: {claims}")
        tokens["cc"] = t["access_token"]
        return f"sub={claims['sub']!r} client_id={claims.get('client_id')!r} kid={header['kid']}"
    if not res.check("[idp] client_credentials grant issues an RFC 9068 JWT access token", cc_token):
        return None

    cc = tokens["cc"]
    for service in ("infer", "embed"):
        def allowed(service=service):
            if service == "embed":
                status, _, body = gw.post_json("embed", "/v1/embeddings", cc, {"model": EMB_MODEL, "input": "x"})
                expect_eq(status, 200, f"status ({body[:200]!r})")
                expect_eq(len(json.loads(body)["data"][0]["embedding"]), 1024, "dimensions")
            else:
                status, _, body = gw.post_json(service, "/v1/chat/completions", cc,
                                               {"messages": [{"role": "user", "content": "hi"}]})
                expect_eq(status, 200, f"status ({body[:200]!r})")
                expect_eq(json.loads(body)["choices"][0]["message"]["content"], echo("hi"), "answer")
        res.check(f"[idp] client_credentials token (scope infer embed) accepted on {service}", allowed)
    for service in ("chatx", "chaty"):
        def refused(service=service):
            status, _, body = gw.post_json(service, "/v1/chat/completions", cc,
                                           {"messages": [{"role": "user", "content": "hi"}]})
            expect_eq(status, 403, f"status ({body[:200]!r})")
            expect_eq(json.loads(body).get("error"), "forbidden", "error")
        res.check(f"[idp] client_credentials token refused with 403 on {service}", refused)

    def other_audience():
        t = idp.client_credentials("infer embed", resource=OTHER_AUDIENCE)["access_token"]
        expect_eq(jwt_parts(t)[1]["aud"], OTHER_AUDIENCE, "aud of the other resource's token")
        status, headers, body = gw.get("infer", "/v1/models", t)
        expect_eq((status, json.loads(body)), (401, {"error": "unauthorized"}), "response")
    res.check("[idp] a well-signed token for another audience is refused with 401", other_audience)

    def auth_code():
        t = idp.authorization_code("openid infer chatx chaty embed")
        at, idt = t.get("access_token"), t.get("id_token")
        expect(at and idt, f"token response lacks access_token or id_token: {sorted(t)}")
        header, claims = jwt_parts(at)
        expect_eq((header.get("typ"), claims.get("sub"), claims.get("aud")), ("at+jwt", "alice", AUDIENCE),
                  "access token typ, sub, aud")
        for service in SERVICES:
            path = "/v1/embeddings" if service == "embed" else "/v1/chat/completions"
            body = {"model": EMB_MODEL, "input": "x"} if service == "embed" else \
                {"messages": [{"role": "user", "content": "hi"}]}
            status, _, resp = gw.post_json(service, path, at, body)
            expect_eq(status, 200, f"{service} status ({resp[:200]!r})")
        tokens["code"], tokens["id"] = at, idt
        return f"scope {claims.get('scope')!r}"
    res.check("[idp] authorization-code flow (headless login + consent) token accepted on all four services",
              auth_code)

    def id_token():
        expect("id" in tokens, "no ID token (the authorization-code check failed)")
        header, claims = jwt_parts(tokens["id"])
        status, headers, body = gw.get("infer", "/v1/models", tokens["id"])
        expect_eq((status, json.loads(body)), (401, {"error": "unauthorized"}), "response")
        expect_eq(headers.get("WWW-Authenticate"), "Bearer", "WWW-Authenticate")
        same_kid = header.get("kid") == jwt_parts(tokens["code"])[0].get("kid")
        return (f"typ={header.get('typ')!r} aud={claims.get('aud')!r} sub={claims.get('sub')!r}, "
                f"{'same' if same_kid else 'other'} kid as the access token")
    res.check("[idp] the provider's ID token is refused with 401", id_token)

    def tampered():
        h, p, s = cc.split(".")
        forged_claims = dict(jwt_parts(cc)[1], scope="infer chatx chaty embed")
        p2 = base64.urlsafe_b64encode(json.dumps(forged_claims).encode()).rstrip(b"=").decode()
        return expect_unauthorized(lambda: gw.sdk("chatx", f"{h}.{p2}.{s}").models.list(), "a token with a forged scope")
    res.check("[py] a JWT whose claims were altered (scope widened) raises AuthenticationError", tampered)
    return tokens.get("code"), tokens.get("cc")


def rotation_check(res, gw, idp):
    def rotate():
        old_kid = jwt_parts(idp.client_credentials("infer")["access_token"])[0]["kid"]
        port = idp.port
        idp.stop()
        idp.start()  # same port, fresh signing key
        expect_eq(idp.port, port, "provider port after restart")
        new = idp.client_credentials("infer")["access_token"]
        new_kid = jwt_parts(new)[0]["kid"]
        expect(new_kid != old_kid, f"the restarted provider signs with the same kid {new_kid}")
        t0 = time.monotonic()
        last = None
        while time.monotonic() - t0 < ROTATION_WINDOW:
            status, _, body = gw.post_json("infer", "/v1/chat/completions", new,
                                           {"messages": [{"role": "user", "content": "rotated"}]})
            if status == 200:
                return f"new kid accepted after {time.monotonic() - t0:.2f} s, gateway not restarted"
            last = (status, body[:200])
            time.sleep(0.25)
        raise CheckFailed(f"token with the new kid still refused after {ROTATION_WINDOW} s: {last}")
    res.check("[idp] provider restarted on the same port with new signing keys: new kid accepted", rotate)
    res.check("[idp] the gateway kept running through the provider restart (same process)",
              lambda: expect(gw.child.proc.poll() is None, "the gateway exited"))


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--bin", default=os.path.join(ROOT, "target", "debug", "portcullis"))
    ap.add_argument("--upstream", default=os.path.join(ROOT, "target", "debug", "fake-upstream"),
                    help="the fake upstream binary (package testkit)")
    ap.add_argument("--config-bin", default=gateway_config.BINARY,
                    help="the test kit's gateway-config binary, which writes the gateway's TOML")
    ap.add_argument("--keep", action="store_true", help="keep the temp dir with the logs")
    ap.add_argument("--key-store", help="[auth.api_keys] database (default: a SQLite file in the temp dir)")
    ap.add_argument("--timeout", type=int, default=600, help="whole-run limit in seconds")
    ap.add_argument("--only", choices=("all", "agents"), default="all",
                    help="agents: the agent API checks alone (Python and Node)")
    args = ap.parse_args()

    def on_signal(signum, frame):
        raise SystemExit(f"stopped by signal {signum}")
    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)

    def on_alarm(signum, frame):
        raise RunTimeout(f"the whole run exceeded {args.timeout} s")
    signal.signal(signal.SIGALRM, on_alarm)
    signal.alarm(args.timeout)

    started = time.monotonic()
    tmp = tempfile.mkdtemp(prefix="portcullis-sdk-")
    res = Results(quiet=(openai.APIError,))
    store = "Postgres" if (args.key_store or "").startswith("postgres") else "SQLite"
    print(f"openai (Python) {openai.__version__}, anthropic {anthropic.__version__}; {store} key store; "
          f"logs in {tmp}", flush=True)
    try:
        upstream = Child("upstream", [args.upstream, "--port", "0", "--token-delay-ms", "2"],
                         os.path.join(tmp, "upstream.log"), wait_listening=True)
        idp = Idp(tmp)
        idp.start()
        gw = Gateway(args.bin, tmp, upstream.port, idp.issuer, args.key_store, args.config_bin)
        print(f"upstream :{upstream.port}, provider {idp.issuer}, gateway {gw.url}", flush=True)
        key_all = gw.create_key("sdk-all", "infer,chatx,chaty,embed,claude")
        key_embed = gw.create_key("sdk-embed-only", "embed")

        res.check("[py] a bad API key raises AuthenticationError", expect_unauthorized,
                  lambda: gw.sdk("infer", "ak_0123456789abcdef." + "A" * 43).models.list(), "an unknown key")
        res.check("[py] a malformed bearer token raises AuthenticationError", expect_unauthorized,
                  lambda: gw.sdk("embed", "sk-not-a-portcullis-key").embeddings.create(
                      model=EMB_MODEL, input=["x"]), "a malformed token")

        run_agent_suite(res, gw)
        run_node_suite(res, gw, "agents", key_all, tmp, budgets=True, file="agents.test.mjs")
        if args.only == "all":
            code_token, cc_token = idp_checks(res, gw, idp)
            run_sdk_suite(res, gw, "api-key", key_all, key_embed)
            connection_reuse_checks(res, gw, key_all)
            run_budget_suite(res, gw, key_all)
            run_node_suite(res, gw, "api-key", key_all, tmp, budgets=True)
            if code_token and cc_token:
                # cc_token holds infer+embed only: its chatx call must give 403.
                run_sdk_suite(res, gw, "jwt", code_token, cc_token)
                run_node_suite(res, gw, "jwt", code_token, tmp)
            else:
                res.record("[py jwt] SDK suite with a provider-issued JWT", False, "no JWT could be obtained")
            rotation_check(res, gw, idp)
    except BaseException as e:  # setup failure, timeout or signal: count it, then clean up
        res.failed += 1
        print(f"FAIL  run aborted: {type(e).__name__}: {e}", flush=True)
    finally:
        code = finish(res, tmp, args.keep, started)
    return code


if __name__ == "__main__":
    sys.exit(main())
