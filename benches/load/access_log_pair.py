#!/usr/bin/env python3
"""What the access log costs per request, paired: two gateways of one binary at once on the
proxy core, one with the access log off and one writing it to a file, each loaded by its own
`wrk -t1 -c32` (the upstream, fast_upstream, and both wrk on the other core); each gateway's CPU
per request from /proc over the same seconds. Both share every disturbance of the machine, so
their ratio holds where a target measured after another swings by ±25% (docs/performance.md,
"Scaling with the cores").

  python3 benches/load/access_log_pair.py [BIN_DIR] [ROUNDS] [SECONDS]

BIN_DIR (target/release) holds portcullis, gateway-config and examples/fast_upstream. Prints
each round and `access_log_pair_ratio <median>`: the per-core rate with the log to a file ÷
with it off (issue 33's target: ≥ 0.93), and checks that the file has a line per request.
Needs wrk and two cores (on one, everything shares it)."""

import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from common import CLK_TCK, BenchError, cpu_ticks, free_port, median, wait_http

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "tests"))
import gateway_config  # noqa: E402  (tests/gateway_config.py)

BODY = '{"model":"m","messages":[{"role":"user","content":"hi"}],"max_tokens":16}'


def main():
    root = Path(__file__).resolve().parents[2]
    bins = Path(sys.argv[1]) if len(sys.argv) > 1 else root / "target" / "release"
    rounds = int(sys.argv[2]) if len(sys.argv) > 2 else 4
    seconds = int(sys.argv[3]) if len(sys.argv) > 3 else 6
    if not shutil.which("wrk"):
        raise BenchError("wrk is needed (apt-get install wrk)")
    cores = os.cpu_count() or 1
    proxy_core, other_core = "0", str(min(1, cores - 1))
    work = Path(tempfile.mkdtemp(prefix="portcullis-logpair."))
    procs = []

    def start(argv, core, log):
        proc = subprocess.Popen(["taskset", "-c", core, *map(str, argv)], stdout=open(work / log, "w"),
                                stderr=subprocess.STDOUT)
        procs.append(proc)
        return proc

    try:
        up = free_port()
        start([bins / "examples" / "fast_upstream", "--port", up, "--hosts", "1", "--tick-ms", "5000",
               "--max-life-s", "3600"], other_core, "upstream.log")
        gateways = {}
        for name in ("off", "file"):
            port = free_port()
            description = {
                "dir": str(work), "port": port, "metrics_port": free_port(), "server": {"threads": 1},
                "access_log": {"destination": "off" if name == "off" else str(work / "access.log")},
                "services": [{"name": "infer", "upstream": f"http://127.0.0.1:{up}"}],
            }
            config = work / f"{name}.toml"
            config.write_text(gateway_config.render(description, bins / "gateway-config"))
            gateways[name] = (config, port)
        made = subprocess.run([bins / "portcullis", "keys", "create", "--config", gateways["off"][0],
                               "--name", "pair", "--scopes", "infer"], capture_output=True, text=True)
        key = (made.stdout.strip().splitlines() or [""])[-1]
        if not key.startswith("ak_"):
            raise BenchError(f"keys create printed no key: {made.stderr.strip()}")
        script = work / "post.lua"
        script.write_text(f'wrk.method = "POST"\nwrk.body = {json.dumps(BODY)}\n'
                          'wrk.headers["Content-Type"] = "application/json"\n'
                          f'wrk.headers["Authorization"] = "Bearer {key}"\n')
        served = {}
        for name, (config, port) in gateways.items():
            served[name] = start([bins / "portcullis", "serve", "--config", config], proxy_core, f"{name}.log")
            wait_http(f"http://127.0.0.1:{port}/healthz")

        def wrk(port):
            return subprocess.Popen(["taskset", "-c", other_core, "wrk", "-t1", "-c32", f"-d{seconds}s", "-s",
                                     str(script), f"http://127.0.0.1:{port}/v1/infer/v1/chat/completions"],
                                    stdout=subprocess.PIPE, text=True)

        def answered(out):
            if "Non-2xx" in out:
                raise BenchError(f"non-2xx answers: {out}")
            return next(int(line.split()[0]) for line in out.splitlines() if "requests in" in line)

        ratios, total = [], 0
        for r in range(1, rounds + 1):
            before = {n: cpu_ticks(p.pid) for n, p in served.items()}
            runs = {n: wrk(port) for n, (_, port) in gateways.items()}
            outs = {n: w.communicate()[0] for n, w in runs.items()}
            cpu = {n: (cpu_ticks(p.pid) - before[n]) / CLK_TCK * 1e6 / answered(outs[n]) for n, p in served.items()}
            total += answered(outs["file"])
            ratios.append(cpu["off"] / cpu["file"])
            print(f"round {r}: CPU per request off {cpu['off']:.1f} µs, file {cpu['file']:.1f} µs; "
                  f"per core, file ÷ off {ratios[-1]:.3f}", flush=True)
        time.sleep(0.5)  # the writer's last batch (every 50 ms)
        lines = sum(1 for _ in open(work / "access.log", "rb"))
        print(f"access log lines {lines} for {total} requests wrk counted (it leaves out those it saw end "
              "after its clock stopped)")
        if lines < total:
            raise BenchError("lines were lost")
        print(f"access_log_pair_ratio {median(ratios):.3f}")
    finally:
        for proc in procs:
            proc.kill()
            proc.wait()
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
