#!/usr/bin/env python3
"""Recording stand-in for an LLM upstream, used to capture real agent CLI requests as fixtures.
Usage: python3 scripts/capture-agent-fixtures.py PORT OUT.jsonl

Listens on 127.0.0.1:PORT and appends one JSON line per request to OUT.jsonl:
{"method", "path" (with query), "headers" (Authorization / x-api-key values redacted),
 "body" (the raw body as UTF-8 text, or "body_base64" if it is not UTF-8)}.
It answers just plausibly enough that the client goes on to send its main request:
  POST .../v1/messages/count_tokens  -> {"input_tokens": 10}
  POST .../v1/messages               -> Anthropic Messages reply (SSE when "stream": true)
  POST .../responses                 -> OpenAI Responses SSE stream
  GET  .../models                    -> {"data": [], "object": "list"}
  anything else (HEAD, GET, ...)     -> 200 {}
Point a CLI at it (see tests/fixtures/agents/README.md), then cut the bodies out of OUT.jsonl.
"""
import base64
import json
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

REDACT = {"authorization", "x-api-key"}
LOCK = threading.Lock()


def sse(events):
    """Server-sent events text: an `event:` and a `data:` line per (name, payload)."""
    return "".join(f"event: {name}\ndata: {json.dumps(data)}\n\n" for name, data in events)


def anthropic_stream(model):
    """A minimal valid Anthropic Messages stream that says "ok"."""
    msg = {"id": "msg_rec", "type": "message", "role": "assistant", "model": model,
           "content": [], "stop_reason": None, "stop_sequence": None,
           "usage": {"input_tokens": 10, "output_tokens": 1}}
    return sse([
        ("message_start", {"type": "message_start", "message": msg}),
        ("content_block_start", {"type": "content_block_start", "index": 0,
                                 "content_block": {"type": "text", "text": ""}}),
        ("content_block_delta", {"type": "content_block_delta", "index": 0,
                                 "delta": {"type": "text_delta", "text": "ok"}}),
        ("content_block_stop", {"type": "content_block_stop", "index": 0}),
        ("message_delta", {"type": "message_delta",
                           "delta": {"stop_reason": "end_turn", "stop_sequence": None},
                           "usage": {"output_tokens": 1}}),
        ("message_stop", {"type": "message_stop"}),
    ])


def anthropic_message(model):
    """The same reply as a single JSON message."""
    return {"id": "msg_rec", "type": "message", "role": "assistant", "model": model,
            "content": [{"type": "text", "text": "ok"}], "stop_reason": "end_turn",
            "stop_sequence": None, "usage": {"input_tokens": 10, "output_tokens": 1}}


def responses_stream(model):
    """A minimal valid OpenAI Responses stream that says "ok"."""
    text = {"type": "output_text", "text": "ok", "annotations": []}
    item = {"id": "msg_rec", "type": "message", "role": "assistant", "status": "in_progress",
            "content": []}
    done_item = dict(item, status="completed", content=[text])
    resp = {"id": "resp_rec", "object": "response", "created_at": 0, "status": "in_progress",
            "model": model, "output": []}
    usage = {"input_tokens": 10, "output_tokens": 1, "total_tokens": 11}
    done = dict(resp, status="completed", output=[done_item], usage=usage)
    common = {"item_id": "msg_rec", "output_index": 0, "content_index": 0}
    return sse([
        ("response.created", {"type": "response.created", "sequence_number": 0,
                              "response": resp}),
        ("response.output_item.added", {"type": "response.output_item.added",
                                        "sequence_number": 1, "output_index": 0,
                                        "item": item}),
        ("response.output_text.delta", dict(common, type="response.output_text.delta",
                                            sequence_number=2, delta="ok")),
        ("response.output_text.done", dict(common, type="response.output_text.done",
                                           sequence_number=3, text="ok")),
        ("response.output_item.done", {"type": "response.output_item.done",
                                       "sequence_number": 4, "output_index": 0,
                                       "item": done_item}),
        ("response.completed", {"type": "response.completed", "sequence_number": 5,
                                "response": done}),
    ])


class Recorder(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"  # keep-alive, as the CLIs expect
    out_path = None

    def handle_one(self):
        raw = self.read_body()
        headers = [[k, "<redacted>" if k.lower() in REDACT else v]
                   for k, v in self.headers.items()]
        rec = {"method": self.command, "path": self.path, "headers": headers}
        try:
            rec["body"] = raw.decode("utf-8")
        except UnicodeDecodeError:  # e.g. a compressed body: keep the bytes
            rec["body_base64"] = base64.b64encode(raw).decode()
        with LOCK, open(self.out_path, "a", encoding="utf-8") as f:
            f.write(json.dumps(rec) + "\n")
        try:
            body = json.loads(raw) if raw else {}
        except ValueError:
            body = {}
        body = body if isinstance(body, dict) else {}
        model = body.get("model", "unknown")
        route = self.path.split("?", 1)[0].rstrip("/")
        if self.command == "POST" and route.endswith("/v1/messages/count_tokens"):
            self.reply("application/json", json.dumps({"input_tokens": 10}))
        elif self.command == "POST" and route.endswith("/v1/messages"):
            if body.get("stream"):
                self.reply("text/event-stream", anthropic_stream(model))
            else:
                self.reply("application/json", json.dumps(anthropic_message(model)))
        elif self.command == "POST" and route.endswith("/responses"):
            self.reply("text/event-stream", responses_stream(model))
        elif self.command == "GET" and route.endswith("/models"):
            self.reply("application/json", json.dumps({"data": [], "object": "list"}))
        else:
            self.reply("application/json", "{}")

    def read_body(self):
        """The request body, by Content-Length or chunked transfer encoding."""
        if "chunked" in self.headers.get("Transfer-Encoding", "").lower():
            raw = b""
            while True:
                size = int(self.rfile.readline().split(b";")[0], 16)
                if size == 0:
                    while self.rfile.readline() not in (b"\r\n", b"\n", b""):
                        pass  # trailers
                    return raw
                raw += self.rfile.read(size)
                self.rfile.readline()  # CRLF after each chunk
        n = int(self.headers.get("Content-Length") or 0)
        return self.rfile.read(n) if n else b""

    def reply(self, ctype, text):
        data = text.encode()
        self.send_response(200)
        self.send_header("Content-Type", ctype)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(data)

    do_GET = do_POST = do_PUT = do_DELETE = do_PATCH = do_HEAD = do_OPTIONS = handle_one

    def log_message(self, fmt, *args):  # one short line per request on stderr
        sys.stderr.write("%s %s\n" % (self.command, self.path))


def main():
    if len(sys.argv) != 3:
        sys.exit(__doc__)
    Recorder.out_path = sys.argv[2]
    server = ThreadingHTTPServer(("127.0.0.1", int(sys.argv[1])), Recorder)
    print(f"recording to {sys.argv[2]} on http://127.0.0.1:{sys.argv[1]}", file=sys.stderr)
    server.serve_forever()


if __name__ == "__main__":
    main()
