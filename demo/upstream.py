#!/usr/bin/env python3
"""Demo OpenAI-compatible upstream for Portcullis (`make run`, integration tests).

Standard library only. Answers are deterministic ("Echo: <last user text>") so
tests can assert on them. Every response carries `Set-Cookie: demo_session=abc`
on purpose: the gateway in front is expected to strip it.

Usage: python3 demo/upstream.py --port PORT [--host 127.0.0.1]
           [--token-delay-ms 50] [--name NAME] [--verbose]
Prints exactly one line `LISTENING <port>` to stdout once bound.
"""
import argparse
import base64
import hashlib
import itertools
import json
import math
import random
import re
import signal
import struct
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

CHAT_MODEL = "alpha3.6-vl"
EMB_MODEL = "emb-m3"
EMB_DIM = 1024
REASONING = "Thinking about it."
MAX_BODY = 32 * 1024 * 1024  # refuse absurd bodies instead of exhausting memory
_ids = itertools.count(1)


class BadRequest(Exception):
    pass


def fragments(text):
    # Word-ish pieces that keep their trailing spaces, so joining them restores the text.
    return re.findall(r"\S+\s*", text) or ([text] if text else [])


def part_text(part):
    if not isinstance(part, dict):
        return ""
    if part.get("type") == "text":
        return str(part.get("text", ""))
    if part.get("type") == "image_url":
        img = part.get("image_url")
        url = img.get("url", "") if isinstance(img, dict) else str(img or "")
        m = re.match(r"data:([^;,]+)", url)
        return f" [image:{m.group(1)}]" if m else " [image:url]"
    return ""


def content_text(content):
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(part_text(p) for p in content)
    return ""


def embed(text):
    # Deterministic per text: PRNG seeded by sha256, then L2-normalised.
    rng = random.Random(hashlib.sha256(text.encode("utf-8")).digest())
    vec = [rng.uniform(-1.0, 1.0) for _ in range(EMB_DIM)]
    norm = math.sqrt(sum(v * v for v in vec)) or 1.0
    return [round(v / norm, 6) for v in vec]


def received_model(body):
    model = body.get("model")
    return model if isinstance(model, str) else "(none received)"


def error_body(message):
    return {"error": {"message": message, "type": "invalid_request_error"}}


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"  # keep-alive, like a real upstream
    # Headers and body go out in separate writes: without this, Nagle plus delayed ACKs
    # hold every response after the first on a kept-alive connection for ~40 ms.
    disable_nagle_algorithm = True
    server_version = "DemoUpstream/1.0"
    cfg = None  # argparse namespace, set in main()

    def log_message(self, fmt, *args):
        if self.cfg is not None and self.cfg.verbose:
            sys.stderr.write("%s - %s\n" % (self.address_string(), fmt % args))

    def end_headers(self):
        # Added to *every* response (incl. stdlib-generated errors): the gateway must strip it.
        self.send_header("Set-Cookie", "demo_session=abc; Path=/")
        self.send_header("X-Demo-Upstream", self.cfg.name if self.cfg else "demo")
        super().end_headers()

    def send_error(self, code, message=None, explain=None):
        # Stdlib protocol errors (bad request line, etc.) as JSON too.
        self.close_connection = True
        try:
            msg = message or self.responses.get(code, ("error",))[0]
            self.send_json(code, error_body(msg), close=True)
        except OSError:
            pass

    # ---- I/O helpers -------------------------------------------------------
    def send_json(self, code, obj, close=False):
        data = json.dumps(obj).encode("utf-8")
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        if close:
            self.send_header("Connection", "close")
        self.end_headers()
        self.wfile.write(data)
        self.wfile.flush()

    def read_body(self):
        if "chunked" in self.headers.get("Transfer-Encoding", "").lower():
            out = bytearray()
            while True:
                line = self.rfile.readline(1024)
                try:
                    size = int(line.split(b";", 1)[0].strip(), 16)
                except ValueError:
                    raise BadRequest("malformed chunked request body")
                if size == 0:
                    while self.rfile.readline(1024) not in (b"\r\n", b"\n", b""):
                        pass  # skip trailers
                    return bytes(out)
                if len(out) + size > MAX_BODY:
                    raise BadRequest("request body too large")
                out += self.rfile.read(size)
                self.rfile.readline(1024)  # CRLF after chunk data
        try:
            length = int(self.headers.get("Content-Length") or 0)
        except ValueError:
            raise BadRequest("invalid Content-Length")
        if length < 0 or length > MAX_BODY:
            raise BadRequest("invalid Content-Length")
        return self.rfile.read(length) if length else b""

    def write_chunk(self, data):
        # Manual chunked framing; flush so each SSE event reaches the client immediately.
        self.wfile.write(b"%x\r\n%s\r\n" % (len(data), data))
        self.wfile.flush()

    # ---- routing -----------------------------------------------------------
    def do_GET(self):
        path = self.path.split("?", 1)[0].rstrip("/")
        if path.endswith("/models"):
            created = 1700000000
            self.send_json(200, {"object": "list", "data": [
                {"id": CHAT_MODEL, "object": "model", "created": created, "owned_by": "demo"},
                {"id": EMB_MODEL, "object": "model", "created": created, "owned_by": "demo"},
            ]})
        else:
            self.send_json(404, error_body("not found"))

    def do_POST(self):
        path = self.path.split("?", 1)[0].rstrip("/")
        try:
            try:
                raw = self.read_body()  # always drain the body so keep-alive stays in sync
            except BadRequest as e:
                # Body framing is unknown, so the connection can't be reused.
                self.close_connection = True
                return self.send_json(400, error_body(str(e)), close=True)
            try:
                if path.endswith("/chat/completions"):
                    self.chat(self.parse_json(raw))
                elif path.endswith("/embeddings"):
                    self.embeddings(self.parse_json(raw))
                else:
                    self.send_json(404, error_body("not found"))
            except BadRequest as e:
                self.send_json(400, error_body(str(e)))
        except (BrokenPipeError, ConnectionResetError):
            self.close_connection = True

    @staticmethod
    def parse_json(raw):
        try:
            body = json.loads(raw.decode("utf-8"))
        except (UnicodeDecodeError, ValueError):
            raise BadRequest("invalid JSON body")
        if not isinstance(body, dict):
            raise BadRequest("request body must be a JSON object")
        return body

    # ---- endpoints ---------------------------------------------------------
    def chat(self, body):
        messages = body.get("messages")
        if not isinstance(messages, list) or not all(isinstance(m, dict) for m in messages):
            raise BadRequest("'messages' must be an array of message objects")
        # Echo exactly what arrived, so the gateway's model policy shows in the answer.
        model = received_model(body)
        user = [m for m in messages if m.get("role") == "user"]
        answer_frags = fragments("Echo: " + (content_text(user[-1].get("content")) if user else ""))
        finish = "stop"
        max_tokens = body.get("max_tokens")
        if isinstance(max_tokens, int) and 0 < max_tokens < len(answer_frags):
            answer_frags, finish = answer_frags[:max_tokens], "length"
        kwargs = body.get("chat_template_kwargs")
        # Reasoning is on unless the client explicitly sets enable_thinking=false.
        thinking = not (isinstance(kwargs, dict) and kwargs.get("enable_thinking") is False)
        reasoning_frags = fragments(REASONING) if thinking else []
        prompt_tokens = sum(len(fragments(content_text(m.get("content")))) for m in messages) or 1
        completion = len(answer_frags) + len(reasoning_frags)
        usage = {"prompt_tokens": prompt_tokens, "completion_tokens": completion,
                 "total_tokens": prompt_tokens + completion}
        cid, created = f"chatcmpl-demo-{next(_ids)}", int(time.time())

        if not body.get("stream"):
            msg = {"role": "assistant", "content": "".join(answer_frags)}
            if thinking:
                msg["reasoning_content"] = REASONING
            self.send_json(200, {"id": cid, "object": "chat.completion", "created": created,
                                 "model": model, "usage": usage, "choices": [
                                     {"index": 0, "finish_reason": finish, "message": msg}]})
            return

        def chunk(delta, finish_reason=None):
            return {"id": cid, "object": "chat.completion.chunk", "created": created, "model": model,
                    "choices": [{"index": 0, "delta": delta, "finish_reason": finish_reason}]}

        events = [chunk({"role": "assistant", "content": ""})]
        events += [chunk({"reasoning_content": f}) for f in reasoning_frags]
        events += [chunk({"content": f}) for f in answer_frags]
        events.append(chunk({}, finish))
        opts = body.get("stream_options")
        if isinstance(opts, dict) and opts.get("include_usage") is True:
            events.append({"id": cid, "object": "chat.completion.chunk", "created": created,
                           "model": model, "choices": [], "usage": usage})

        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Cache-Control", "no-cache")
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()
        delay = max(self.cfg.token_delay_ms, 0) / 1000.0
        try:
            for i, ev in enumerate(events):
                if i and delay:
                    time.sleep(delay)  # simulate token-by-token generation
                self.write_chunk(b"data: " + json.dumps(ev).encode("utf-8") + b"\n\n")
            self.write_chunk(b"data: [DONE]\n\n")
            self.wfile.write(b"0\r\n\r\n")
            self.wfile.flush()
        except (BrokenPipeError, ConnectionResetError):
            # Client went away (e.g. the gateway cancelled): stop generating, tell the tests.
            self.close_connection = True
            sys.stderr.write("STREAM_ABORTED\n")
            sys.stderr.flush()

    def embeddings(self, body):
        inp = body.get("input")
        if isinstance(inp, str):
            texts = [inp]
        elif isinstance(inp, list) and inp and all(isinstance(t, str) for t in inp):
            texts = inp
        elif isinstance(inp, list) and inp and all(isinstance(t, int) for t in inp):
            texts = [" ".join(map(str, inp))]  # a single token array (some SDKs send these)
        elif isinstance(inp, list) and inp and all(
                isinstance(t, list) and all(isinstance(x, int) for x in t) for t in inp):
            texts = [" ".join(map(str, t)) for t in inp]
        else:
            raise BadRequest("'input' must be a non-empty string or array of strings")
        fmt = body.get("encoding_format") or "float"
        if fmt not in ("float", "base64"):
            raise BadRequest("'encoding_format' must be 'float' or 'base64'")
        data = []
        for i, text in enumerate(texts):
            vec = embed(text)
            if fmt == "base64":  # what the official openai Python SDK asks for by default
                vec = base64.b64encode(struct.pack(f"<{len(vec)}f", *vec)).decode("ascii")
            data.append({"object": "embedding", "index": i, "embedding": vec})
        n = sum(max(len(fragments(t)), 1) for t in texts)
        self.send_json(200, {"object": "list", "data": data, "model": received_model(body),
                             "usage": {"prompt_tokens": n, "total_tokens": n}})


def main():
    ap = argparse.ArgumentParser(description="Demo OpenAI-compatible upstream")
    ap.add_argument("--port", type=int, required=True, help="0 picks a free port")
    ap.add_argument("--host", default="127.0.0.1")
    ap.add_argument("--token-delay-ms", type=int, default=50)
    ap.add_argument("--name", default="demo", help="sent back as X-Demo-Upstream header")
    ap.add_argument("--verbose", action="store_true")
    Handler.cfg = ap.parse_args()

    server = ThreadingHTTPServer((Handler.cfg.host, Handler.cfg.port), Handler)
    server.daemon_threads = True  # in-flight streams must not block exit

    def stop(signum, frame):
        # shutdown() blocks until serve_forever returns, so it can't run on this thread.
        threading.Thread(target=server.shutdown, daemon=True).start()

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    print(f"LISTENING {server.server_address[1]}", flush=True)
    server.serve_forever()
    server.server_close()
    sys.exit(0)


if __name__ == "__main__":
    main()
