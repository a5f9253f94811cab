"""The cost of budgets (issue 22) with Redis, on a non-streamed chat: paired CPU per request like
the features (stages_throughput.py), latency at a fixed rate like stages_latency.py, and
instructions under callgrind.

Two gateways of the stage's own, on the proxy core: the run's config plus `[budgets]` (enforcement
"reserve", the defaults) with the `[rate_limits] redis` of target "redis" (the run's redis-server
on the client core), so the budget counters are shared through Redis. Keys made for the stage:
one without budget, one with tokens_per_day = 10^15 and one with requests_per_day = 10^12 (never
refused). The body is CHAT_BODY, which states max_tokens. Pairs, CPU per request feature ÷ base:
- "tokens": service `metered` (api = "openai") by the tokens_per_day key ÷ by the key without
  budget: one Lua script through Redis before forwarding (reserve: the body's bytes / 4 + its
  max_tokens); its refund (the upstream reports fewer tokens) joins the gateway's batch, sent
  in one adjust script per counter batch every 50 ms, so under load far fewer than one per
  request;
- "aa": the key without budget on both sides: the method's own spread;
- "rpd": service `infer` (no api: no body read, no usage) by the requests_per_day key ÷ by the
  key without budget: the reserve script only, nothing to adjust.
Latency: `loadgen rate` at BUDGET_RATE req/s on 16 connections to one of the two gateways, the
key without budget and the tokens_per_day key on `metered` in turn (which goes first alternates
by round): p50, p99 and the process's CPU per request.
Before the rounds the stage checks the keys are told apart: the budgeted responses carry the
x-ratelimit headers of their budget, Redis ran the scripts the design says (a lone request: the
reserve and its batch's adjust, the reserve, none) and the adjust gave back what the reservation
held beyond the usage. The pairs record Redis's scripts per budgeted request
(budget_<name>_scripts). After them, that neither
gateway fell back to counting per process."""

import http.client
import re
import time

from common import CLK_TCK, BenchError, free_port, http_get_text, read_text, split_url
from binaries import ROOT
from servers import CHAT_BODY
from stages_latency import Latency
import callgrind

TOKENS_PER_DAY = 10**15
REQUESTS_PER_DAY = 10**12
# (name, base target, feature target); Servers.SERVICES gives their services.
BUDGET_PAIRS = [
    ("tokens", "bud_plain", "bud_tokens"),
    ("aa", "bud_plain", "bud_plain"),
    ("rpd", "bud_infer", "bud_rpd"),
]
# Scripts Redis must run for one request of each target alone: its reserve and, once the
# gateway's refund batch goes (within 50 ms), that batch's one adjust; the reserve; none. Under
# load the adjusts are shared by many requests: the pairs measure the scripts per request.
SCRIPTS_PER_REQUEST = {"bud_plain": 0, "bud_tokens": 2, "bud_infer": 0, "bud_rpd": 1}


def cpu_split(pid):
    """(user, system) CPU time of pid in clock ticks (/proc/PID/stat fields 14 and 15)."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return int(fields[11]), int(fields[12])


class Budgeting(Latency):
    """Budgets with Redis: what a budget check costs a chat (part of run.Bench)."""

    def budgets(self):
        """The pairs and the fixed-rate latency, on two gateways with [budgets] started here
        and stopped after."""
        s = self.s
        self.start_budget_gateways()
        try:
            self.check_budgets()
            script = self.work / "budget-post.lua"
            script.write_text(f'wrk.method = "POST"\nwrk.body = \'{CHAT_BODY}\'\n'
                              'wrk.headers["Content-Type"] = "application/json"\n')
            calls = self.script_calls()
            self.log(f"budgets with Redis, paired on one core: {s.budget_rounds} rounds x 2 x {s.budget_seconds}s "
                     f"per pair, {' '.join(p[0] for p in BUDGET_PAIRS)}")
            for r in range(1, s.budget_rounds + 1):
                for name, base, target in BUDGET_PAIRS:
                    self.budget_pair(name, base, target, script)
                self.log(f"budget round {r}, CPU per request ÷ without budget: "
                         + " ".join(f"{p[0]}={self.raw.values(f'budget_{p[0]}')[-1]}" for p in BUDGET_PAIRS)
                         + "; Redis scripts per budgeted request: "
                         + " ".join(f"{p[0]}={self.raw.values(f'budget_{p[0]}_scripts')[-1]}"
                                    for p in BUDGET_PAIRS if self.raw.values(f"budget_{p[0]}_scripts")))
            self.facts["budget_pair_scripts"] = self.script_calls() - calls
            errors = self.backend_errors(self.bud_twin_metrics)
            self.procs.stop(self.bud_twin)
            self.budget_latency()
            self.budget_fallbacks(errors + self.backend_errors(self.bud_metrics))
        finally:
            for proc in (self.bud_gw, self.bud_twin):
                self.procs.stop(proc)

    # ---- the gateways and their keys --------------------------------------------------------
    def start_budget_gateways(self):
        # The run's config has the [rate_limits] redis of target "redis".
        self.bud_port, self.bud_twin_port = free_port(), free_port()
        config, self.bud_metrics = self.config_copy("budget", self.bud_port, budgets=True)
        twin_config, self.bud_twin_metrics = self.config_copy("budget-twin", self.bud_twin_port, budgets=True)
        gateway = self.tools.gateway
        self.target_keys = {
            "bud_plain": callgrind.create_key(gateway, config, "bench-no-budget"),
            "bud_tokens": callgrind.create_key(gateway, config, "bench-tokens-per-day",
                                               "--tokens-per-day", str(TOKENS_PER_DAY)),
            "bud_rpd": callgrind.create_key(gateway, config, "bench-requests-per-day",
                                            "--requests-per-day", str(REQUESTS_PER_DAY)),
        }
        self.target_keys["bud_infer"] = self.target_keys["bud_plain"]
        self.bud_gw = self.start_gateway(config, self.bud_port, "budget.log")
        self.bud_twin = self.start_gateway(twin_config, self.bud_twin_port, "budget-twin.log")

    def script_calls(self):
        """EVALSHA and EVAL calls Redis has answered so far."""
        calls = 0
        for line in self.redis_cli("info", "commandstats").splitlines():
            if line.startswith(("cmdstat_evalsha:", "cmdstat_eval:")):
                calls += int(re.search(r"calls=(\d+)", line).group(1))
        return calls

    def budget_chat(self, target):
        """One chat POST through the budget gateway → (status, headers as a dict)."""
        host, port, path = split_url(self.url(target, self.bud_port))
        conn = http.client.HTTPConnection(host, port, timeout=5)
        try:
            conn.request("POST", f"{path}/chat/completions", body=CHAT_BODY,
                         headers={"authorization": f"Bearer {self.token(target)}", "content-type": "application/json"})
            resp = conn.getresponse()
            resp.read()
            return resp.status, {k.lower(): v for k, v in resp.getheaders()}
        finally:
            conn.close()

    def check_budgets(self):
        """Each target answers 200; a budgeted one carries its budget's headers and makes Redis
        run its scripts (SCRIPTS_PER_REQUEST), an unbudgeted one neither; the adjust really
        replaced the reservation by the usage."""
        # The first request of each: a new key's counters are missing in Redis, so seeded from
        # the ledger (one more script); the tokens key's first reservation is all it holds.
        first = {target: self.budget_chat(target)[1] for target in SCRIPTS_PER_REQUEST}
        reserved = TOKENS_PER_DAY - int(first["bud_tokens"].get("x-ratelimit-remaining-tokens", TOKENS_PER_DAY))
        time.sleep(0.3)
        heads = {}
        for target, expected in SCRIPTS_PER_REQUEST.items():
            before = self.script_calls()
            status, heads[target] = self.budget_chat(target)
            time.sleep(0.3)  # the refund's batch goes within 50 ms of the response
            ran = self.script_calls() - before
            if status != 200:
                raise BenchError(f"budgets: {target} answered {status}")
            if ran != expected:
                raise BenchError(f"budgets: a chat by {target} ran {ran} Redis script(s), not {expected}")
        limit = {"bud_tokens": ("tokens", TOKENS_PER_DAY), "bud_rpd": ("requests", REQUESTS_PER_DAY)}
        for target, h in heads.items():
            if target in limit:
                unit, value = limit[target]
                if h.get(f"x-ratelimit-limit-{unit}") != str(value):
                    raise BenchError(f"budgets: {target} was not answered its budget's headers: {h}")
            elif any(k.startswith("x-ratelimit-") for k in h):
                raise BenchError(f"budgets: {target} has no budget but got x-ratelimit headers: {h}")
        # A remaining is the limit less the settled requests' usage and this one's reservation;
        # one more request finds gone what the one before was settled at: its usage, not its
        # reservation, if the adjust ran.
        used_before = TOKENS_PER_DAY - int(heads["bud_tokens"]["x-ratelimit-remaining-tokens"])
        _, h = self.budget_chat("bud_tokens")
        time.sleep(0.3)
        charged = TOKENS_PER_DAY - int(h["x-ratelimit-remaining-tokens"]) - used_before
        if charged <= 0 or charged == reserved:
            raise BenchError(f"budgets: a chat reserved {reserved} tokens and was settled at {charged}")
        self.facts.update(budget_reserved=reserved, budget_charged=charged)

    def budget_pair(self, name, base, target, script):
        """budget_<name>: the target's CPU per request ÷ the base's, both ways round on the two
        budget gateways; budget_<name>_base_us and budget_<name>_us: each side's CPU µs."""
        gw, twin = (self.bud_gw, self.bud_port), (self.bud_twin, self.bud_twin_port)
        before = self.script_calls()
        pair = self.pair_both_ways(base, target, self.s.budget_seconds, gw, twin, script)
        # Only the target's requests run scripts (the base's key has no budget).
        served = self.pair_requests[1] if base != target else 0
        if served:
            self.raw.record(f"budget_{name}_scripts", "%.3f" % ((self.script_calls() - before) / served))
        if pair is None:
            self.raw.record(f"budget_{name}", "nan")
            return
        ratio, base_us, us = pair
        self.raw.record(f"budget_{name}", "%.4f" % ratio)
        self.raw.record(f"budget_{name}_base_us", "%.2f" % base_us)
        self.raw.record(f"budget_{name}_us", "%.2f" % us)

    # ---- latency at a fixed rate ------------------------------------------------------------
    def budget_latency(self):
        """Both keys at BUDGET_RATE on one budget gateway alone on its core; each run's p50,
        p99, lag (µs, bp*_<target>) and the gateway's user and system CPU per request
        (bcpu_user_<target>, bcpu_sys_<target>); budget_added99: the budgeted p99 − the
        unbudgeted one, within a round."""
        s = self.s
        self.log(f"budgets at {s.budget_rate} req/s: {s.budget_rounds} rounds x {s.budget_seconds}s per key "
                 "(loadgen rate, 16 connections, 1 s warm-up)")
        for r in range(s.budget_rounds):
            order = ["bud_plain", "bud_tokens"] if r % 2 == 0 else ["bud_tokens", "bud_plain"]
            p99 = {}
            for t in order:
                u0, s0 = cpu_split(self.bud_gw.pid)
                f = self.run_rate(t, "bp", s.budget_rate, 16, s.budget_seconds, ["--body", CHAT_BODY],
                                  gw_port=self.bud_port)
                u1, s1 = cpu_split(self.bud_gw.pid)
                # The warm-up's requests are served too: count them at the rate asked.
                served = int(f["count"]) + s.budget_rate
                self.raw.record(f"bcpu_user_{t}", "%.2f" % ((u1 - u0) / CLK_TCK * 1e6 / served))
                self.raw.record(f"bcpu_sys_{t}", "%.2f" % ((s1 - s0) / CLK_TCK * 1e6 / served))
                self.raw.record(f"brate_{t}", f["rate"])
                p99[t] = float(f["p99"])
            self.raw.record("budget_added99", "%.1f" % (p99["bud_tokens"] - p99["bud_plain"]))
            self.log(f"budget latency round {r + 1}: p99 without {p99['bud_plain']:.0f} µs, "
                     f"with {p99['bud_tokens']:.0f} µs")

    def backend_errors(self, metrics_port):
        """portcullis_rate_limit_backend_errors_total of a gateway, every reason."""
        text = http_get_text(f"http://127.0.0.1:{metrics_port}/metrics")
        return sum(float(line.split()[-1]) for line in text.splitlines()
                   if line.startswith("portcullis_rate_limit_backend_errors_total{"))

    def budget_fallbacks(self, errors):
        """Every budget must have been decided through Redis: `errors` (both gateways' backend
        errors) 0, no per-process warning in their logs."""
        warned = sum(len(re.findall(r"Redis at .* unavailable", read_text(self.work / log)))
                     for log in ("budget.log", "budget-twin.log"))
        self.facts.update(budget_backend_errors=int(errors), budget_fallback_warnings=warned)
        if errors or warned:
            self.log(f"warning: budgets fell back to per-process counting ({int(errors)} request(s), "
                     f"{warned} warning(s))")

    # ---- instructions -----------------------------------------------------------------------
    def budget_instructions(self):
        """Instructions per chat without and with budgets: exact where the pairs move, and a
        profile (bench-results/callgrind/budget-*.out) of where a budget's cost goes."""
        self.log("instructions per chat without and with budgets: benches/load/callgrind.py budgets")
        callgrind.ensure_valgrind(self.log)
        figures = callgrind.measure(self.tools, ROOT / "bench-results" / "callgrind", self.s.cg_requests // 2,
                                    self.s.cg_warmup, self.log, budgets=True)
        for name, value in figures.items():
            self.raw.record(name, value)

