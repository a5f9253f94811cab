"""Stages measured in latency with loadgen: fixed-rate p50/p99 per target, failover to a dead
replica, the SSE response head and a 2 MB vision body with the model policy off and on."""

import base64
import json
import os
import re
import socket
import subprocess
import time

from common import BenchError, http_get_text, pairs, split_url
from servers import CHAT_BODY, CLIENT_CPU, TARGETS, Servers, json_headers


class Latency(Servers):
    """Fixed-rate latency stages (part of run.Bench)."""

    # ---- fixed-rate latency (loadgen) -------------------------------------------------------
    def run_rate(self, target, prefix, rate, conns, seconds, body_args, gw_port=None):
        """A fixed-rate loadgen run of chat POSTs, recording <prefix>50_<target>,
        <prefix>99_<target> and <prefix>lag_<target> (µs); gw_port: another gateway than the
        run's. → loadgen's figures."""
        port = gw_port or self.port(target)
        out = subprocess.run(
            ["taskset", "-c", str(CLIENT_CPU), str(self.tools.loadgen), "rate",
             "--addr", f"127.0.0.1:{port}", "--method", "POST",
             "--path", f"{self.path(target)}/chat/completions", *body_args, *json_headers(self.token(target)),
             "--rate", str(rate), "--conns", str(conns), "--seconds", str(seconds), "--warmup-s", "1"],
            capture_output=True, text=True, check=True,
        ).stdout
        f = pairs(out)
        if f.get("errors") != "0":
            raise BenchError(f"{target}: {f.get('errors')} failed requests at {rate} req/s")
        self.raw.record(f"{prefix}50_{target}", f["p50"])
        self.raw.record(f"{prefix}99_{target}", f["p99"])
        self.raw.record(f"{prefix}lag_{target}", f["lag_p99"])
        return f

    def latency(self):
        s = self.s
        self.log(f"latency at {s.rate} req/s: {s.rate_rounds} rounds x {s.rate_seconds}s per target "
                 "(loadgen rate, 16 connections)")
        for _ in range(s.rate_rounds):
            for t in TARGETS:
                self.run_rate(t, "p", s.rate, 16, s.rate_seconds, ["--body", CHAT_BODY])

    def connect_failures(self):
        """portcullis_upstream_connect_failures_total of service "failover", from /metrics."""
        text = http_get_text(f"http://127.0.0.1:{self.metrics_port}/metrics")
        total = 0.0
        for line in text.splitlines():
            if re.match(r'portcullis_upstream_connect_failures_total\{.*service="failover"', line):
                total += float(line.split()[-1])
        return int(total)

    def hold_stream(self, target):
        """An SSE stream left open through target (the upstream sends an event at once)."""
        host, port, path = split_url(self.url(target))
        sock = socket.create_connection((host, port), timeout=10)
        sock.sendall(
            (f"POST {path}/sse HTTP/1.1\r\nhost: {host}:{port}\r\nauthorization: Bearer {self.key}\r\n"
             f"content-type: application/json\r\ncontent-length: {len(CHAT_BODY)}\r\n\r\n{CHAT_BODY}").encode()
        )
        head = b""
        while b"\r\n\r\n" not in head:
            chunk = sock.recv(4096)
            if not chunk:
                break
            head += chunk
        if not head.startswith(b"HTTP/1.1 200"):
            sock.close()
            raise BenchError(f"{target}: the held stream was answered {head[:40]!r}")
        return sock

    def failover(self):
        """One stream held on the live replica, so least_requests always tries the dead one
        first. At a low rate, so the figure is the failover's own latency, not the queueing of
        a loaded core."""
        s = self.s
        held = self.hold_stream("failover")
        try:
            time.sleep(0.5)
            before = self.connect_failures()
            self.log(f"failover latency at {s.failover_rate} req/s: {s.failover_rounds} rounds x {s.rate_seconds}s, "
                     "one replica vs a dead one first")
            for _ in range(s.failover_rounds):
                for t in ("key", "failover"):
                    self.run_rate(t, "f", s.failover_rate, 4, s.rate_seconds, ["--body", CHAT_BODY])
            self.facts["failovers"] = self.connect_failures() - before
        finally:
            held.close()

    def sse_head(self):
        s = self.s
        self.log(f"SSE response head: {s.sse_rounds} rounds x {s.sse_count} sequential streams per target")
        for _ in range(s.sse_rounds):
            for t in ("direct", "nginx", "key"):
                out = subprocess.run(
                    ["taskset", "-c", str(CLIENT_CPU), str(self.tools.loadgen), "sse-head",
                     "--addr", f"127.0.0.1:{self.port(t)}", "--method", "POST",
                     "--path", f"{self.path(t)}/sse?ticks=3", "--body", CHAT_BODY, *json_headers(self.token(t)),
                     "--count", str(s.sse_count), "--warmup", "200"],
                    capture_output=True, text=True, check=True,
                ).stdout
                self.raw.record(f"ssehead_{t}", pairs(out).get("p50", ""))

    def vision(self):
        """A 2 MB vision request (one base64 PNG-sized image part) with and without the model
        policy: the policy reads the whole body before sending it on, so its cost shows in the
        latency."""
        s = self.s
        image = base64.b64encode(os.urandom(1536 * 1024)).decode()
        body = {"model": "bench", "max_tokens": 16, "messages": [{"role": "user", "content": [
            {"type": "text", "text": "What is in this image?"},
            {"type": "image_url", "image_url": {"url": "data:image/png;base64," + image}}]}]}
        path = self.work / "vision.json"
        path.write_text(json.dumps(body))
        self.facts["vision_bytes"] = path.stat().st_size
        self.log(f"2 MB vision body ({self.facts['vision_bytes']} bytes) at {s.vision_rate} req/s: "
                 f"{s.rate_rounds} rounds x {s.vision_seconds}s, policy off and on")
        for _ in range(s.rate_rounds):
            for t in ("key", "policy"):
                self.run_rate(t, "vision", s.vision_rate, 4, s.vision_seconds, ["--body-file", str(path)])
