"""Routing (`ONLY=routing`, and part of the whole run): least_requests, round_robin and
prefix_affinity on three simulated model servers (testkit's sim-replica: an LRU prefix cache of
16-token blocks, prefill paid per uncached prompt token one request at a time, decoding per
generated token), the same workload each, fresh replicas each.

The workload: 200 conversations of 8 turns, over 4 shared system prompts; each turn streams
and appends the answer and a new user message. Skew: 4 of them are hot, each turn fanned out to
HOT_FANOUT parallel requests on the same history (an agent's parallel calls), so their key is
many requests at once. ROUTING_CLIENTS conversations run at a time (a load that keeps the
replicas' prefill busy under least_requests).

Figures per policy: the prefix-cache hit rate over every block the replicas were asked for,
against the rate one replica with an unbounded cache gets on the same requests in the same
order (computed here); TTFT p50/p99 (to the first streamed event); max/mean replica load (each
replica's busy time: the sum of its requests' durations); requests per replica; and
portcullis_affinity_total."""

import http.client
import json
import queue
import random
import re
import subprocess
import threading
import time

from binaries import ROOT, TARGET
from common import BenchError, free_port, http_get_text, wait_http, wait_line
import callgrind
import configs

SIM = TARGET / "release" / "sim-replica"
POLICIES = ["least_requests", "round_robin", "prefix_affinity"]
CONVERSATIONS, TURNS, SYSTEM_PROMPTS, HOT, HOT_FANOUT = 200, 8, 4, 4, 8
MAX_TOKENS = 32
BLOCK = 16
CACHE_BLOCKS, PREFILL_US, DECODE_US = 4096, 50, 2000


def words(rng, n):
    return " ".join(f"w{rng.randrange(50_000)}" for _ in range(n))


def workload(seed=24):
    """Conversations: (system prompt, first user message, later user messages, hot)."""
    rng = random.Random(seed)
    systems = [words(rng, 1200) for _ in range(SYSTEM_PROMPTS)]
    hot = set(range(0, CONVERSATIONS, CONVERSATIONS // HOT))
    return [(systems[c % SYSTEM_PROMPTS], words(rng, 150), [words(rng, 60) for _ in range(TURNS - 1)], c in hot)
            for c in range(CONVERSATIONS)]


def reference_hit_rate(sent):
    """Hit rate of one replica with an unbounded cache on `sent` (message lists, in order),
    tokenised and chained as the sim does."""
    cache, hits, total = set(), 0, 0
    for messages in sent:
        tokens = [t for m in messages for t in (m["role"].split() + m["content"].split())]
        previous, leading = 0, True
        for i in range(len(tokens) // BLOCK):
            previous = hash((previous, tuple(tokens[i * BLOCK:(i + 1) * BLOCK])))
            total += 1
            if leading and previous in cache:
                hits += 1
            else:
                leading = False
            cache.add(previous)
    return hits / total if total else 0.0


def percentile(values, p):
    values = sorted(values)
    return values[min(len(values) - 1, int(p / 100 * len(values)))] if values else float("nan")


class Routing:
    """The routing stage (part of run.Bench)."""

    def routing(self):
        self.log("routing: building sim-replica")
        subprocess.run(["cargo", "build", "--release", "--quiet", "-p", "testkit", "--bin", "sim-replica"],
                       cwd=ROOT, check=True)
        clients = int(self.s.routing_clients)
        convs = workload()
        rows = []
        for policy in POLICIES:
            self.log(f"routing: {policy}, {CONVERSATIONS} conversations x {TURNS} turns, {clients} at a time")
            rows.append(self.route_run(policy, convs, clients))
        self.routing_text = render(rows, clients)
        self.log("routing:\n" + self.routing_text)
        return self.routing_text

    def route_run(self, policy, convs, clients):
        w = self.work / f"routing-{policy}"
        w.mkdir()
        sims, ports = [], []
        for i in range(3):
            log = w / f"sim{i}.log"
            sims.append(self.procs.start(
                [SIM, "--port", 0, "--name", f"sim{i}", "--cache-blocks", CACHE_BLOCKS,
                 "--prefill-us-per-token", PREFILL_US, "--decode-us-per-token", DECODE_US],
                stdout=log, stderr=w / f"sim{i}.err"))
            ports.append(int(wait_line(log, "LISTENING")))
        gw_port, metrics_port = free_port(), free_port()
        config = w / "portcullis.toml"
        config.write_text(configs.routing(self.tools.config_writer, w, gw_port, metrics_port, ports, policy))
        key = callgrind.create_key(self.tools.gateway, config, "routing")
        gw = self.procs.start([self.tools.gateway, "serve", "--config", config], stderr=w / "gateway.log",
                              env={"RUST_LOG": "warn"})
        wait_http(f"http://127.0.0.1:{gw_port}/healthz")
        sent, ttfts, errors = [], [], []
        lock = threading.Lock()
        todo = queue.Queue()
        for c in convs:
            todo.put(c)

        def ask(messages):
            body = json.dumps({"model": "sim", "stream": True, "max_tokens": MAX_TOKENS, "messages": messages})
            conn = http.client.HTTPConnection("127.0.0.1", gw_port, timeout=60)
            try:
                with lock:
                    sent.append(list(messages))
                start = time.monotonic()
                conn.request("POST", "/v1/infer/v1/chat/completions", body=body,
                             headers={"authorization": f"Bearer {key}", "content-type": "application/json"})
                resp = conn.getresponse()
                if resp.status != 200:
                    raise BenchError(f"{policy}: answered {resp.status}")
                first = None
                while True:
                    line = resp.readline()
                    if not line:
                        break
                    if first is None and line.startswith(b"data: {"):
                        first = time.monotonic() - start
                with lock:
                    ttfts.append(first)
            except Exception as e:  # noqa: BLE001: counted and reported
                with lock:
                    errors.append(str(e))
            finally:
                conn.close()

        def converse():
            while True:
                try:
                    system, first, later, hot = todo.get_nowait()
                except queue.Empty:
                    return
                messages = [{"role": "system", "content": system}, {"role": "user", "content": first}]
                for turn in range(TURNS):
                    if hot:
                        fan = [threading.Thread(target=ask, args=(messages + [
                            {"role": "user", "content": f"branch {b}"}],)) for b in range(HOT_FANOUT - 1)]
                        for t in fan:
                            t.start()
                        ask(messages)
                        for t in fan:
                            t.join()
                    else:
                        ask(messages)
                    if turn + 1 < TURNS:
                        messages = messages + [{"role": "assistant", "content": ("tok " * MAX_TOKENS).strip()},
                                               {"role": "user", "content": later[turn]}]

        began = time.monotonic()
        runners = [threading.Thread(target=converse) for _ in range(clients)]
        for t in runners:
            t.start()
        for t in runners:
            t.join()
        elapsed = time.monotonic() - began
        stats = [sim_metrics(p) for p in ports]
        affinity = {m.group(1): int(float(m.group(2))) for m in re.finditer(
            r'portcullis_affinity_total\{result="(\w+)",service="infer"\} (\S+)',
            http_get_text(f"http://127.0.0.1:{metrics_port}/metrics"))}
        for p in [gw, *sims]:
            self.procs.stop(p)
        if errors:
            raise BenchError(f"{policy}: {len(errors)} requests failed, e.g. {errors[0]}")
        busy = [s["sim_busy_seconds_total"] for s in stats]
        hits = sum(s["sim_prefix_cache_hit_blocks_total"] for s in stats)
        queried = sum(s["sim_prefix_cache_query_blocks_total"] for s in stats)
        return dict(
            policy=policy, requests=len(sent), seconds=elapsed, hit_rate=hits / queried,
            reference=reference_hit_rate(sent), p50=percentile(ttfts, 50) * 1000, p99=percentile(ttfts, 99) * 1000,
            load=max(busy) / (sum(busy) / len(busy)),
            per_replica=[int(s["sim_requests_total"]) for s in stats], affinity=affinity,
        )


def sim_metrics(port):
    text = http_get_text(f"http://127.0.0.1:{port}/metrics")
    return {name: float(value) for name, value in (line.split() for line in text.splitlines() if line)}


def render(rows, clients):
    least = next(r for r in rows if r["policy"] == "least_requests")
    out = [f"### Routing: 3 simulated replicas, {CONVERSATIONS} conversations x {TURNS} turns "
           f"({HOT} hot, fanned out x{HOT_FANOUT}), {clients} at a time",
           "", f"Sim: {CACHE_BLOCKS} cached blocks of {BLOCK} tokens per replica, prefill {PREFILL_US} µs per "
           f"uncached token (one at a time), decode {DECODE_US} µs per token, {MAX_TOKENS} tokens per answer.", "",
           "| policy | requests | s | hit rate | ÷ unbounded single replica | TTFT p50 ms | p99 ms "
           "| TTFT p50 ÷ least_requests | max/mean load | requests per replica | affinity |",
           "|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        out.append(
            f"| {r['policy']} | {r['requests']} | {r['seconds']:.1f} | {r['hit_rate']:.1%} | "
            f"{r['hit_rate'] / r['reference']:.1%} (of {r['reference']:.1%}) | {r['p50']:.1f} | {r['p99']:.1f} | "
            f"{least['p50'] / r['p50']:.2f}x better | {r['load']:.2f} | "
            f"{' / '.join(map(str, r['per_replica']))} | "
            f"{' '.join(f'{k}={v}' for k, v in sorted(r['affinity'].items())) or '-'} |")
    return "\n".join(out) + "\n"
