"""Stages measured in req/s with wrk: max throughput per target, then the paired rounds (a
feature's cost against "key" on a twin gateway, and the gateway against the bare-Pingora floor)."""

import math
import re
import subprocess

from common import CLK_TCK, BenchError, cpu_ticks, free_port, wait_http
from servers import CHAT_BODY, CLIENT_CPU, PAIRED, PROXY_CPU, TARGETS, Servers


# ---- output of the load tools -------------------------------------------------------------
def parse_wrk(out):
    """wrk's text → {rps, requests, non2xx, socket_errors} (the last two None when absent)."""

    def find(pattern):
        m = re.search(pattern, out, re.M)
        return m.group(1) if m else None

    return {
        "rps": find(r"^Requests/sec:\s+(\S+)"),
        "requests": find(r"^\s*(\d+) requests in"),
        "non2xx": find(r"Non-2xx or 3xx responses:\s*(\d+)"),
        "socket_errors": find(r"^\s*(Socket errors:.*)$"),
    }


def wrk_command(url, token, seconds, conns, script):
    return [
        "taskset", "-c", str(CLIENT_CPU), "wrk", "-t1", f"-c{conns}", f"-d{seconds}s", "-s", str(script),
        "-H", f"Authorization: Bearer {token}", f"{url}/chat/completions",
    ]


class Throughput(Servers):
    """Max throughput and the paired rounds (part of run.Bench)."""

    # ---- max throughput (wrk) --------------------------------------------------------------
    def run_wrk(self, target, seconds):
        """One wrk run → (req/s, the proxy's CPU µs per request), both as printed."""
        pid = self.server_pid(target)
        before = cpu_ticks(pid)
        out = subprocess.run(
            wrk_command(self.url(target), self.token(target), seconds, self.s.conns, self.lua),
            capture_output=True, text=True, check=True,
        ).stdout
        after = cpu_ticks(pid)
        w = parse_wrk(out)
        if w["non2xx"]:
            raise BenchError(f"{target}: {w['non2xx']} non-2xx responses under load")
        if w["socket_errors"]:
            self.log(f"{target}: {w['socket_errors']}")
        if not w["rps"]:
            raise BenchError(f"{target}: no Requests/sec in wrk's output: {out}")
        rps = float(w["rps"])
        cpu_us = (after - before) / CLK_TCK * 1e6 / (rps * seconds) if rps > 0 else math.nan
        return "%.0f" % rps, "%.2f" % cpu_us

    def max_throughput(self):
        self.lua = self.work / "post.lua"
        self.lua.write_text(
            f'wrk.method = "POST"\nwrk.body = \'{CHAT_BODY}\'\nwrk.headers["Content-Type"] = "application/json"\n'
        )
        self.log("warming up (each target, 2 s)")
        for t in TARGETS:
            self.run_wrk(t, 2)
        s = self.s
        self.log(f"max throughput: {s.rounds} rounds x {s.seconds_per_run}s per target, wrk -t1 -c{s.conns}")
        for r in range(1, s.rounds + 1):
            for t in TARGETS:
                rps, cpu = self.run_wrk(t, s.seconds_per_run)
                self.raw.record(f"rps_{t}", rps)
                self.raw.record(f"cpu_{t}", cpu)
            self.log(f"round {r}: " + " ".join(f"rps_{t}={self.raw.values(f'rps_{t}')[-1]}" for t in TARGETS))

    # ---- paired rounds ----------------------------------------------------------------------
    # A feature's cost as a ratio that the machine's drift cannot skew. A twin gateway (same
    # config, other ports) runs on the same core; one wrk loads "key" on the first, another the
    # feature's service on the twin, at the same moment. Each process's CPU time over its
    # requests is its cost per request; their ratio is the feature's req/s per core relative to
    # "key". (Two loads on one process would not do: a closed-loop client gets its share of
    # turns whatever a request costs.)
    def start_twin(self):
        self.twin_port = free_port()
        twin_config, _ = self.config_copy("twin", self.twin_port)
        self.twin = self.start_gateway(twin_config, self.twin_port, "twin.log")

    def config_copy(self, name, port, budgets=False):
        """The gateway's config on `port`, with a metrics port, pid file and upgrade socket of
        its own, and with [budgets] if `budgets`: written to <work>/<name>.toml → (its path, its
        metrics port)."""
        metrics_port = free_port()
        path = self.work / f"{name}.toml"
        path.write_text(self.gateway_config(self.access_log == "off", port, metrics_port, name, budgets))
        return path, metrics_port

    def pair_cpu(self, base, target, seconds, a, port_a, b, port_b, script=None):
        """base on process a and target on process b at once, both sending `script`'s request
        (the chat POST by default) → each process's CPU µs per request, (base's, target's);
        None if either did nothing."""
        script = script or self.lua
        ca0, cb0 = cpu_ticks(a.pid), cpu_ticks(b.pid)
        first = subprocess.Popen(wrk_command(self.url(base, port_a), self.token(base), seconds, 32, script),
                                 stdout=subprocess.PIPE, text=True)
        try:
            out_b = subprocess.run(wrk_command(self.url(target, port_b), self.token(target), seconds, 32, script),
                                   capture_output=True, text=True).stdout
            out_a = first.communicate()[0]
        finally:
            if first.poll() is None:
                first.kill()
                first.wait()
        ca, cb = cpu_ticks(a.pid) - ca0, cpu_ticks(b.pid) - cb0
        wa, wb = parse_wrk(out_a), parse_wrk(out_b)
        for w in (wa, wb):
            if w["non2xx"]:
                raise BenchError(f"paired run: non-2xx responses: Non-2xx or 3xx responses: {w['non2xx']}")
        na, nb = int(wa["requests"] or 0), int(wb["requests"] or 0)
        self.pair_requests = (na, nb)
        if ca > 0 and cb > 0 and na > 0 and nb > 0:
            return ca / CLK_TCK * 1e6 / na, cb / CLK_TCK * 1e6 / nb
        return None

    def pair_both_ways(self, base, target, seconds, gw, twin, script):
        """pair_cpu both ways round (base on gw and target on twin, then the reverse; each a
        (process, port)), so a difference between the two processes cancels out → (target's
        CPU per request ÷ base's, geometric mean of the two ways; base's and target's CPU µs
        per request, means of the two ways), None if either did nothing."""
        ways = [self.pair_cpu(base, target, seconds, *gw, *twin, script=script)]
        served = self.pair_requests
        ways.append(self.pair_cpu(base, target, seconds, *twin, *gw, script=script))
        # The requests each side served, both ways together (pair_requests after this call).
        self.pair_requests = tuple(x + y for x, y in zip(served, self.pair_requests))
        if None in ways:
            return None
        ratio = math.sqrt((ways[0][1] / ways[0][0]) * (ways[1][1] / ways[1][0]))
        return ratio, (ways[0][0] + ways[1][0]) / 2, (ways[0][1] + ways[1][1]) / 2

    def pair_once(self, base, target, seconds, a, port_a, b, port_b):
        """The target's req/s per core ÷ the base's (pair_cpu), "nan" if either did nothing."""
        cpu = self.pair_cpu(base, target, seconds, a, port_a, b, port_b)
        # base's CPU per request ÷ target's: above 1, the target costs less per request.
        return "%.4f" % (cpu[0] / cpu[1]) if cpu else "nan"

    def run_pair(self, base, target, seconds):
        """Both ways round (base on the gateway and the feature on the twin, then the reverse),
        so a difference between the two processes cancels out: their geometric mean."""
        gw, twin = (self.gateway, self.gw_port), (self.twin, self.twin_port)
        x = float(self.pair_once(base, target, seconds, *gw, *twin))
        y = float(self.pair_once(base, target, seconds, *twin, *gw))
        return "%.3f" % math.sqrt(x * y)

    def floors(self):
        """The engine's floor: a bare Pingora ProxyHttp that only compares a static bearer,
        strips the prefix and drops Set-Cookie, on the gateway's core. The gateway (engine
        patches included) is paired with the floor on crates.io's unpatched Pingora; the same
        floor built with the patches, paired with the unpatched one, is what they gain."""
        s = self.s
        self.floor_port, self.pfloor_port = free_port(), free_port()
        common = ["--upstream", f"127.0.0.1:{self.up_port}", "--key", self.key]
        floor = self.procs.start([self.tools.floor_unpatched, "--listen", f"127.0.0.1:{self.floor_port}", *common],
                                 cpu=PROXY_CPU, stdout=self.work / "floor.log", stderr=subprocess.STDOUT)
        pfloor = self.procs.start([self.tools.floor, "--listen", f"127.0.0.1:{self.pfloor_port}", *common],
                                  cpu=PROXY_CPU, stdout=self.work / "pfloor.log", stderr=subprocess.STDOUT)
        wait_http(f"http://127.0.0.1:{self.floor_port}/")
        wait_http(f"http://127.0.0.1:{self.pfloor_port}/")
        self.log(f"paired with the floor: {s.pair_rounds} rounds x {s.seconds_per_run}s, unpatched bare Pingora "
                 "and Portcullis (key) at once, then the patched floor")
        for _ in range(s.pair_rounds):
            self.raw.record("pair_floor", self.pair_once(
                "floor", "key", s.seconds_per_run, floor, self.floor_port, self.gateway, self.gw_port))
            self.raw.record("pair_engine", self.pair_once(
                "floor", "pfloor", s.seconds_per_run, floor, self.floor_port, pfloor, self.pfloor_port))
        self.log(f"Portcullis ÷ unpatched floor, req/s per core: {' '.join(self.raw.values('pair_floor'))}")
        self.log(f"patched ÷ unpatched floor, req/s per core: {' '.join(self.raw.values('pair_engine'))}")
        self.procs.stop(floor)
        self.procs.stop(pfloor)

    def paired_features(self):
        s = self.s
        self.log(f"paired: {s.pair_rounds} rounds x {s.seconds_per_run}s of key and each of {' '.join(PAIRED)} at once")
        for r in range(1, s.pair_rounds + 1):
            for t in PAIRED:
                self.raw.record(f"pair_{t}", self.run_pair("key", t, s.seconds_per_run))
            self.log(f"paired round {r}: " + " ".join(f"{t}={self.raw.values(f'pair_{t}')[-1]}" for t in PAIRED))
        self.procs.stop(self.twin)
