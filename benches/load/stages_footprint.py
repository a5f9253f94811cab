"""Stages measuring what the gateway holds and spends rather than how fast it answers: memory
with many held SSE streams, and instructions per request under callgrind (callgrind.py)."""

import subprocess
import time

from common import pairs, status_kb
from binaries import ROOT
from servers import CHAT_BODY, CLIENT_CPU, Servers, json_headers
import callgrind


class Footprint(Servers):
    """Memory with held streams and instructions per request (part of run.Bench)."""

    # ---- memory with held streams -------------------------------------------------------
    def open_streams(self):
        s = self.s
        self.log(f"open streams: {s.stream_rounds} rounds of {s.streams} held SSE streams, each on a fresh gateway")
        for r in range(1, s.stream_rounds + 1):
            gw = self.start_gateway()
            time.sleep(1)
            self.raw.record("idle_rss", status_kb(gw.pid, "VmRSS"))
            self.raw.record("idle_hwm", status_kb(gw.pid, "VmHWM"))
            out = subprocess.run(
                ["taskset", "-c", str(CLIENT_CPU), str(self.tools.loadgen), "streams",
                 "--addr", f"127.0.0.1:{self.gw_port}", "--method", "POST", "--path", "/v1/infer/v1/sse",
                 "--body", CHAT_BODY, *json_headers(self.key),
                 "--count", str(s.streams), "--pid", str(gw.pid), "--hold-s", "2"],
                capture_output=True, text=True, check=True,
            ).stdout
            f = pairs(out)
            if f.get("failed") != "0":
                self.log(f"round {r}: {f.get('failed')} of {s.streams} streams failed to open")
            self.raw.record("streams_open", f["opened"])
            self.raw.record("streams_rss", f["rss_kb"])
            self.raw.record("streams_hwm", f["hwm_kb"])
            self.raw.record("streams_open_s", f["open_s"])
            self.procs.stop(gw)
            time.sleep(1)

    def instructions(self):
        """Instructions per request (deterministic where the rounds above drift): the floor
        (same engine as the gateway) and the gateway under callgrind, and the gateway's hooks."""
        self.log("instructions per request: benches/load/callgrind.py")
        callgrind.ensure_valgrind(self.log)
        figures = callgrind.measure(self.tools, ROOT / "bench-results" / "callgrind",
                                    self.s.cg_requests, self.s.cg_warmup, self.log)
        for name, value in figures.items():
            self.raw.record(name, value)
