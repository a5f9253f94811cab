"""The load benchmark's report: a markdown table of medians with ratios and targets, then how
each figure was measured. The table's layout is the one README.md quotes; keep them alike."""

import math

from common import median


class Raw:
    """Every figure of every round, as `name value` rows (bench-results/latest-raw.txt)."""

    def __init__(self, path):
        self.path = path
        self.rows = []
        path.write_text("")

    def record(self, name, value):
        self.rows.append((name, str(value)))
        with open(self.path, "a") as f:  # kept as it goes, for KEEP_WORK after a failure
            f.write(f"{name} {value}\n")

    def values(self, name):
        return [v for k, v in self.rows if k == name]

    def median(self, name):
        return median(self.values(name))


def num(text):
    try:
        return float(text)
    except (TypeError, ValueError):
        return math.nan


def ratio(a, b):
    a, b = num(a), num(b)
    return "%.2f" % (a / b) if b > 0 else "n/a"


def ms(us):
    return "%.3f" % (num(us) / 1000)


def mb(kb):
    return "%.1f" % (num(kb) / 1024)


def whole(x):
    return "%.0f" % num(x)


def ok(condition):
    return "met" if condition else "**missed**"


def spread(raw, name):
    """`median× (min–max)` of a paired figure's rounds."""
    values = [num(v) for v in raw.values(name) if num(v) == num(v)]
    if not values:
        return "n/a"
    return f"{raw.median(name)}× ({min(values):.3f}–{max(values):.3f})"


def metering_rows(raw, facts):
    """The rows of metering on vs off on a streamed chat (stages_metering.py)."""
    m = raw.median
    on = m("meter_on")
    us = " / ".join(m(f"meter_{n}") for n in ("on_base_us", "on_us", "asked_us"))
    ir = {n: m(f"ir_stream_{n}") for n in ("off", "on", "asked")}
    return [
        f"| paired CPU per request, streamed chat ({facts.get('stream_events', '?')} events), metering on ÷ off "
        f"| | | {spread(raw, 'meter_on')} | | | ≤ 1.05× | {ok(num(on) <= 1.05)} |",
        f"| … the client asks include_usage itself (scan only, no stripping) ÷ off | | | {spread(raw, 'meter_asked')} "
        "| | | | |",
        f"| … off ÷ off (the pairing's own spread) | | | {spread(raw, 'meter_aa')} | | | | |",
        f"| proxy CPU per streamed chat in the pairs, off / on / asked (µs) | | | {us} | | | | |",
        f"| instructions per streamed chat (callgrind), off / on / asked | | | "
        f"{whole(ir['off'])} / {whole(ir['on'])} / {whole(ir['asked'])} | | "
        f"| on {ratio(ir['on'], ir['off'])}×, asked {ratio(ir['asked'], ir['off'])}× off | |",
    ]


def metering_method(facts):
    f = facts
    return [
        "Metering on a streamed chat: the fast upstream answers a chat POST with \"stream\": true by a",
        f"text/event-stream of {f.get('stream_events', '?')} OpenAI chat.completion.chunk events ({f.get('stream_bytes', '?')} bytes "
        "to the client) and `data: [DONE]`,",
        "written at once; with include_usage in the request, `\"usage\":null` in every chunk and a usage-only",
        "chunk before [DONE], as OpenAI does. Off: service `infer` (no `api`, bytes relayed). On: service",
        "`metered` (api = \"openai\", no model policy, key store on SQLite), the client sending no",
        "stream_options, so the gateway adds include_usage upstream, reads the usage and strips it from the",
        "client's stream (checked before the rounds: the client gets the very bytes it gets from `infer`,",
        "and portcullis_tokens_total moves). Asked: the client sends include_usage itself, both sides get",
        "the usage chunk. Paired like the features: the gateway and its twin on one core, two `wrk -t1 -c32` at",
        f"once for {f['meter_seconds']} s each way round, CPU per request of the feature ÷ the base, geometric mean",
        f"of the two ways, median (min–max) of {f['meter_rounds']} rounds. Instructions: one gateway under",
        f"callgrind, {f['cg_requests'] // 2} sequential streamed chats of each kind after {f['cg_warmup']} of warm-up.",
    ]


def budget_rows(raw, facts):
    """The rows of budgets with Redis on a chat (stages_budgets.py)."""
    m = raw.median
    rate = facts.get("budget_rate", "?")
    tok = m("budget_tokens")
    p50 = {t: m(f"bp50_{t}") for t in ("bud_plain", "bud_tokens")}
    p99 = {t: m(f"bp99_{t}") for t in ("bud_plain", "bud_tokens")}
    added = [num(v) for v in raw.values("budget_added99") if num(v) == num(v)]
    added_ms = f"{ms(m('budget_added99'))} ({min(added) / 1000:.3f} to {max(added) / 1000:.3f})" if added else "n/a"
    cpu = {t: "%.1f + %.1f" % (num(m(f"bcpu_user_{t}")), num(m(f"bcpu_sys_{t}"))) for t in ("bud_plain", "bud_tokens")}
    ir = {n: m(f"ir_budget_{n}") for n in ("plain", "tokens", "infer", "rpd")}
    return [
        "| paired CPU per request, chat by a key with tokens_per_day through Redis (reserve + batched adjust) "
        f"÷ by a key without budget | | | {spread(raw, 'budget_tokens')} | | | ≤ 1.10× | {ok(num(tok) <= 1.10)} |",
        f"| … without budget ÷ without budget (the pairing's own spread) | | | {spread(raw, 'budget_aa')} | | | | |",
        "| … requests_per_day key on a service without api (reserve only) ÷ without budget | | | "
        f"{spread(raw, 'budget_rpd')} | | | | |",
        "| Redis scripts per budgeted request in the pairs: tokens_per_day; requests_per_day | | | "
        f"{m('budget_tokens_scripts')}; {m('budget_rpd_scripts')} | | | | |",
        "| proxy CPU per chat in the pairs (µs): metered without / with tokens_per_day; infer without / with "
        f"requests_per_day | | | {m('budget_tokens_base_us')} / {m('budget_tokens_us')}; {m('budget_rpd_base_us')} / "
        f"{m('budget_rpd_us')} | | | | |",
        f"| p50 / p99 at {rate} req/s, chat by a key without budget (ms) | | | "
        f"{ms(p50['bud_plain'])} / {ms(p99['bud_plain'])} | | | | |",
        f"| p50 / p99 at {rate} req/s, chat by a key with tokens_per_day through Redis (ms) | | | "
        f"{ms(p50['bud_tokens'])} / {ms(p99['bud_tokens'])} | | | | |",
        f"| loadgen's sends behind schedule at {rate} req/s, p99, without / with budget (ms): the core kept up "
        f"if small | | | {ms(m('bplag_bud_plain'))} / {ms(m('bplag_bud_tokens'))} | | | | |",
        f"| p99 added by the budget at {rate} req/s, within a round (ms) | | | {added_ms} | | "
        f"| ≤ 0.5 ms | {ok(num(m('budget_added99')) <= 500)} |",
        f"| proxy CPU per chat at {rate} req/s, user + system, without / with budget (µs) | | | "
        f"{cpu['bud_plain']} / {cpu['bud_tokens']} | | | | |",
        "| instructions per chat (callgrind): metered without / with tokens_per_day; infer without / with "
        f"requests_per_day | | | {whole(ir['plain'])} / {whole(ir['tokens'])}; {whole(ir['infer'])} / {whole(ir['rpd'])} "
        f"| | | {ratio(ir['tokens'], ir['plain'])}×; {ratio(ir['rpd'], ir['infer'])}× | |",
    ]


def budget_method(facts):
    f = facts
    return [
        "Budgets: two gateways of their own on the proxy core, the config above plus `[budgets]` (reserve, the",
        "defaults) with its `[rate_limits] redis`, so the counters are shared through the redis-server on the",
        "client core. Keys made with `portcullis keys create`: one without budget, one with `--tokens-per-day",
        "1000000000000000`, one with `--requests-per-day 1000000000000` (never refused). The chat POST states",
        f"max_tokens: {f.get('budget_reserved', '?')} tokens reserved (body bytes ÷ 4 + max_tokens), "
        f"{f.get('budget_charged', '?')} charged once the upstream's usage is read,",
        "so a budgeted chat on `metered` (api = \"openai\") runs a reserve script before forwarding and its refund",
        "joins a batch sent in one adjust script every 50 ms; one on `infer` (no api) with requests_per_day the reserve script only (checked",
        "before the rounds through Redis's command counts, with the headers and the settled charge). Paired like",
        f"the metering: the two gateways at once, two `wrk -t1 -c32` for {f.get('budget_seconds', '?')} s each way round, CPU per request",
        f"of the budgeted key ÷ the key without budget, geometric mean of the two ways, median (min–max) of {f.get('budget_rounds', '?')}",
        f"rounds; Redis ran {f.get('budget_pair_scripts', '?')} scripts during them. Latency: `loadgen rate` at "
        f"{f.get('budget_rate', '?')} req/s on 16 connections for",
        f"{f.get('budget_seconds', '?')} s after 1 s of warm-up to one of the gateways alone on the core, the two keys in turn (the first",
        "alternating by round); the added p99 is the budgeted run's p99 less the other's of the same round, median",
        "(min–max); CPU per chat there is the gateway's user and system time over the requests served. Decided",
        f"per process instead of through Redis: {f.get('budget_backend_errors', '?')} request(s), "
        f"{f.get('budget_fallback_warnings', '?')} warning(s). Instructions: one gateway",
        f"under callgrind with a redis-server of its own, {f['cg_requests'] // 2} sequential chats by each key after "
        f"{f['cg_warmup']} (profiles in bench-results/callgrind/budget-*.out).",
    ]


def render_budgets(raw, facts):
    """The report of ONLY=budgets."""
    f = facts
    lines = [
        f"Portcullis budgets benchmark, {f['date']}, {f['commit']},",
        f"{f['cores']} cores ({f['cpu_model']}), Linux {f['kernel']}, load average at start {f['load_at_start']}.",
        f"Gateways on core {f['proxy_cpu']}; wrk/loadgen, the upstream and Redis on core {f['client_cpu']}.",
        "",
        "| measure | | | Portcullis | | | target | |",
        "|---|---:|---:|---:|---:|---:|---|---|",
        *budget_rows(raw, f),
        "",
        *budget_method(f),
        f"Whole run: {f['elapsed']} s.",
    ]
    return "\n".join(lines) + "\n"


def render_metering(raw, facts):
    """The report of ONLY=metering."""
    f = facts
    lines = [
        f"Portcullis metering benchmark, {f['date']}, {f['commit']},",
        f"{f['cores']} cores ({f['cpu_model']}), Linux {f['kernel']}, load average at start {f['load_at_start']}.",
        f"Gateway and twin on core {f['proxy_cpu']}; wrk and the upstream on core {f['client_cpu']}.",
        "",
        "| measure | | | Portcullis | | | target | |",
        "|---|---:|---:|---:|---:|---:|---|---|",
        *metering_rows(raw, f),
        "",
        *metering_method(f),
        f"Whole run: {f['elapsed']} s.",
    ]
    return "\n".join(lines) + "\n"


def render(raw, facts):
    """The report's text. facts: the run's settings and one-off readings (see run.py)."""
    f = facts
    m = raw.median
    D, N, K, J, P, R = (m(f"rps_{t}") for t in ("direct", "nginx", "key", "jwt", "policy", "redis"))
    RR = m("rps_replicas")
    PR, PD, PP, PF, PE = (m(f"pair_{t}") for t in ("replicas", "redis", "policy", "floor", "engine"))
    IRF, IRK = m("ir_floor"), m("ir_key")
    hooks = ", ".join(
        f"{k[len('hook_'):]} {int(num(v))}" for k, v in raw.rows if k.startswith("hook_") and num(v) > 0
    )
    F0, F1 = m("f50_key"), m("f50_failover")
    FADD = "%.0f" % (num(F1) - num(F0))
    V0, V1 = m("vision50_key"), m("vision50_policy")
    VADD = "%.0f" % (num(V1) - num(V0))
    SH = m("ssehead_key")
    IH, SR, SO = m("idle_hwm"), m("streams_hwm"), m("streams_open")
    opened = num(SO)
    # Memory per held stream: what the streams added over the idle gateway, per stream opened.
    per_stream = "%.1f" % ((num(SR) - num(IH)) / opened) if opened > 0 else "0"
    # Per-stream cost from the measured count, scaled to 10,000 when the fd limit forced fewer.
    s10k = "%.0f" % (num(IH) + (num(SR) - num(IH)) * 10000 / opened) if opened > 0 else "0"
    cpu = {t: m(f"cpu_{t}") for t in ("direct", "nginx", "key", "jwt", "redis")}
    p50 = {t: m(f"p50_{t}") for t in ("direct", "nginx", "key", "jwt", "policy", "redis")}
    p99 = {t: m(f"p99_{t}") for t in ("direct", "nginx", "key", "jwt", "policy", "redis")}
    sse = {t: m(f"ssehead_{t}") for t in ("direct", "nginx")}
    rate, frate = f["rate"], f["failover_rate"]

    lines = [
        f"Portcullis load benchmark, {f['date']}, {f['commit']},",
        f"{f['cores']} cores ({f['cpu_model']}), Linux {f['kernel']}, load average at start {f['load_at_start']}.",
        f"Proxy under test on core {f['proxy_cpu']}; wrk/loadgen and the upstream on core {f['client_cpu']}. Medians of",
        f"{f['rounds']} rounds (throughput), {f['rate_rounds']} (fixed rate), {f['sse_rounds']} (SSE head), "
        f"{f['stream_rounds']} (RSS).",
        "",
        "| measure | direct | nginx (static key) | Portcullis | ÷ direct | ÷ nginx | target | |",
        "|---|---:|---:|---:|---:|---:|---|---|",
        f"| max req/s, chat POST, API key | {whole(D)} | {whole(N)} | {whole(K)} | {ratio(K, D)} | {ratio(K, N)} "
        f"| ≥ 0.6× direct, ≥ 1.0× nginx | {ok(num(K) >= 0.6 * num(D))} / {ok(num(K) >= num(N))} |",
        f"| max req/s, chat POST, JWT (RS256) | | | {whole(J)} | {ratio(J, D)} | {ratio(J, N)} "
        f"| ≥ 0.9× API key ({ratio(J, K)}×) | {ok(num(J) >= 0.9 * num(K))} |",
        f"| max req/s, chat POST, api = \"openai\" + model policy | | | {whole(P)} | {ratio(P, D)} | {ratio(P, N)} "
        f"| ≥ 0.9× without ({ratio(P, K)}×) | {ok(num(P) >= 0.9 * num(K))} |",
        f"| max req/s, chat POST, rate limit shared through Redis | | | {whole(R)} | {ratio(R, D)} | {ratio(R, N)} "
        f"| ≥ 0.8× without ({ratio(R, K)}×) | {ok(num(R) >= 0.8 * num(K))} |",
        f"| max req/s, chat POST, three replicas (least_requests) | | | {whole(RR)} | {ratio(RR, D)} | {ratio(RR, N)} | | |",
        f"| paired req/s per core ÷ the bare-Pingora floor (unpatched), API key | | | {PF}× | | "
        f"| ≥ 1.0× | {ok(num(PF) >= 1.0)} |",
        f"| … the floor with vendor/patches ÷ without (the engine patches' gain) | | | {PE}× | | | | |",
        f"| instructions per request (callgrind): floor {whole(IRF)}, Portcullis | | | {whole(IRK)} | | "
        f"| {ratio(IRK, IRF)}× the floor | |",
        f"| paired req/s ÷ one replica, three replicas | | | {PR}× | | | within 5% | {ok(num(PR) >= 0.95)} |",
        f"| paired req/s ÷ without, Redis rate limit | | | {PD}× | | | ≥ 0.8× | {ok(num(PD) >= 0.8)} |",
        f"| paired req/s ÷ without, model policy | | | {PP}× | | | ≥ 0.9× | {ok(num(PP) >= 0.9)} |",
        *metering_rows(raw, f),
        *budget_rows(raw, f),
        f"| p50 at {frate} req/s, dead replica first, one failover each (ms) | | | {ms(F1)} | | "
        f"| added ≤ 1 ms ({ms(FADD)} over {ms(F0)}) | {ok(num(FADD) <= 1000)} |",
        f"| proxy CPU per request, API key (µs) | {cpu['direct']} | {cpu['nginx']} | {cpu['key']} "
        f"| {ratio(cpu['key'], cpu['direct'])} | {ratio(cpu['key'], cpu['nginx'])} | | |",
        f"| proxy CPU per request, JWT (µs) | | | {cpu['jwt']} | {ratio(cpu['jwt'], cpu['direct'])} "
        f"| {ratio(cpu['jwt'], cpu['nginx'])} | | |",
        f"| p50 at {rate} req/s, API key (ms) | {ms(p50['direct'])} | {ms(p50['nginx'])} | {ms(p50['key'])} "
        f"| {ratio(p50['key'], p50['direct'])} | {ratio(p50['key'], p50['nginx'])} | | |",
        f"| p99 at {rate} req/s, API key (ms) | {ms(p99['direct'])} | {ms(p99['nginx'])} | {ms(p99['key'])} "
        f"| {ratio(p99['key'], p99['direct'])} | {ratio(p99['key'], p99['nginx'])} | | |",
        f"| p50 / p99 at {rate} req/s, JWT (ms) | | | {ms(p50['jwt'])} / {ms(p99['jwt'])} | | | | |",
        f"| p50 / p99 at {rate} req/s, model policy (ms) | | | {ms(p50['policy'])} / {ms(p99['policy'])} | | | | |",
        f"| p50 / p99 at {rate} req/s, Redis rate limit (ms) | | | {ms(p50['redis'])} / {ms(p99['redis'])} | | | | |",
        f"| proxy CPU per request, Redis rate limit (µs) | | | {cpu['redis']} | | "
        f"| ({ratio(cpu['redis'], cpu['key'])}× without) | |",
        f"| 2 MB vision body p50, policy off / on (ms) | | | {ms(V0)} / {ms(V1)} | | "
        f"| added ≤ 2 ms ({ms(VADD)}) | {ok(num(VADD) <= 2000)} |",
        f"| SSE response head p50 (ms) | {ms(sse['direct'])} | {ms(sse['nginx'])} | {ms(SH)} "
        f"| {ratio(SH, sse['direct'])} | {ratio(SH, sse['nginx'])} | ≤ 0.2 ms | {ok(num(SH) <= 200)} |",
        f"| memory per held SSE stream (KB) | | | {per_stream} | | | ≤ 30 KB | {ok(num(per_stream) <= 30)} |",
        f"| gateway peak RSS idle (MB) | | | {mb(IH)} | | | ≤ 30 MB | {ok(num(IH) <= 30 * 1024)} |",
    ]
    if SO.isdigit() and int(SO) >= 10000:
        lines.append(
            f"| gateway peak RSS, 10,000 open SSE streams (MB) | | | {mb(SR)} | | "
            f"| ≤ 150 MB | {ok(num(SR) <= 150 * 1024)} |"
        )
    else:
        lines.append(f"| gateway peak RSS, {SO} open SSE streams (MB) | | | {mb(SR)} | | | | |")
        lines.append(
            f"| … scaled to 10,000 streams (MB) | | | {mb(s10k)} | | | ≤ 150 MB | {ok(num(s10k) <= 150 * 1024)} |"
        )

    requests_failed_over = "%.0f" % (frate * (f["rate_seconds"] + 1) * f["failover_rounds"])
    lines += [
        "",
        "Ratios are Portcullis ÷ the column: above 1 is better for req/s, worse for CPU and latency.",
        "",
        f"Method: max req/s is wrk 4.1 (`-t1 -c{f['conns']}`, {f['seconds_per_run']} s runs, after a warm-up), POST of a",
        f"{f['chat_body_bytes']}-byte chat body answered by a ~300-byte JSON; every response checked to be 200. Proxy CPU",
        "is the proxy process's user+system time over the run divided by its requests (direct: the",
        "upstream's). p50/p99 come from `loadgen rate` (benches/load/loadgen.rs): 16 kept-alive connections",
        f"on an open-loop schedule totalling {rate} req/s for {f['rate_seconds']} s after 1 s of warm-up, each latency from",
        "the request's write to the response's last byte. SSE head: sequential streaming requests on one",
        f"kept-alive connection, time from the write to the complete response head, {f['sse_count']} per round.",
        "RSS: VmHWM from /proc of a fresh gateway 1 s after start (idle), and with all streams open",
        f"(each held by the upstream, one event every 5 s), {f['streams']} requested per round.",
        "Model policy: service `policy` (api = \"openai\", a default and an alias; the bench body names",
        "the alias, so every request is validated and rewritten and its usage read) on the same upstream",
        "as `infer`. Redis rate limit: service `limited` (rate_limit_per_minute = 100000000, nothing",
        f"refused) with [rate_limits] redis, a redis-server {f['redis_version']} on the client core; it answered",
        f"{f['evalsha_calls']} EVALSHA calls, and the gateway fell back to per-process limits "
        f"{f['redis_fallbacks']} time(s).",
        "Paired: the gateway and a twin (same config) on the same core, two `wrk -t1 -c32` at once for",
        f"{f['seconds_per_run']} s, one on `infer` of one process, one on the feature's service of the other, then the",
        "reverse; each process's CPU time per request, their ratio as req/s per core (geometric mean of the",
        f"two ways round), median of {f['pair_rounds']} rounds (sequential rounds drift ±15% here).",
        "Floor: benches/floor/src/main.rs, a bare Pingora `ProxyHttp` (static bearer compare, prefix strip,",
        "Set-Cookie dropped, one worker thread) built outside the workspace on crates.io's Pingora, paired",
        "with the gateway's `infer` on the same core; the same floor built in the workspace, with",
        "vendor/patches, paired with it gives the patches' gain. Instructions: benches/load/callgrind.py,",
        f"{f['cg_requests']} sequential chat POSTs on one connection after {f['cg_warmup']}, each process under",
        "valgrind --tool=callgrind (valgrind hides SHA-NI, so the API key's SHA-256 counts as the software",
        "version, ~3,500 of the gateway's instructions). Our hooks (inclusive, per request):",
        f"{hooks}. Memory per stream: (peak RSS with the streams − idle) ÷ streams.",
        "Replicas: service `replicas` lists the fast upstream on 127.0.0.1, .2 and .3 (one process).",
        "Failover: service `failover` lists a port where nothing listens before the live upstream;",
        f"with one stream held on the live one, least_requests tries the dead one first: {f['failovers']} failed",
        f"connects counted for {requests_failed_over} requests (4 connections, {frate} req/s).",
        *metering_method(f),
        *budget_method(f),
        f"Vision: `loadgen rate` at {f['vision_rate']} req/s on 4 connections, a {f['vision_bytes']}-byte chat body.",
        f"Gateway: `threads = 1`, access log {f['access_log']}, RUST_LOG=warn; nginx {f['nginx_version']}:",
        "`worker_processes 1`, upstream keepalive 128, access_log off, proxy_buffering off.",
    ]
    if f["fd_limit"] < 20200:
        lines.append(f"Open-file hard limit here: {f['fd_limit']} (two sockets per proxied stream).")
    lines.append(
        f"Gateway RSS after the load rounds: {mb(f['loaded_rss'])} MB (peak {mb(f['loaded_hwm'])} MB). "
        f"Whole run: {f['elapsed']} s."
    )
    return "\n".join(lines) + "\n"
