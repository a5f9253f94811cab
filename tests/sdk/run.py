#!/usr/bin/env python3
"""SDK conformance and real-identity-provider tests for Portcullis.

Starts, on 127.0.0.1 and free ports: the fake upstream's demo model (target/debug/fake-upstream,
testkit/src/upstream/model.rs), a real OpenID Provider (tests/sdk/idp.mjs, npm oidc-provider
9.x) and the real gateway binary in front of the upstream, with API keys made by the real CLI.
Then it drives the gateway with the official `openai` Python SDK, the official `openai` Node SDK
(tests/sdk/node.test.mjs), the agent APIs (OpenAI Responses, Anthropic Messages) through the
official openai and anthropic SDKs of both languages (tests/sdk/agents.py, agents.test.mjs), the
dialect bridge through the same SDKs (tests/sdk/bridge.py, bridge.test.mjs) and tokens from the
provider, printing one line per check and, last,
exactly `N passed, N failed`. The gateway enforces budgets ([budgets]); the budget checks
(tests/sdk/budgets.py and the Node file's) make budgeted keys of their own.

This file starts the servers, writes the gateway's config (tests/gateway_config.py) and runs the
suites in order. The checks live beside it: sdk_checks.py (the Python SDK with one credential),
provider.py (the provider, and the gateway against its tokens), metering.py, budgets.py,
agents.py, bridge.py; plain_http.py is the HTTP without an SDK they share.

Run through scripts/sdk-tests.sh, which installs the SDKs; by hand:
    .venv/bin/python tests/sdk/run.py [--bin target/debug/portcullis]
        [--upstream target/debug/fake-upstream] [--config-bin target/debug/gateway-config] [--keep]
Exits 0 only when every check passed. Child processes are always stopped.
"""
import argparse
import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import time

import anthropic
import openai

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from harness import Child, Results, finish, free_port, tail  # noqa: E402  (tests/harness.py)
import gateway_config  # noqa: E402  (tests/gateway_config.py)
from plain_http import HTTP_TIMEOUT, http_call  # noqa: E402
from sdk_checks import (  # noqa: E402
    CHATX_ALIASES, CHATX_DEFAULT, EMB_MODEL, SERVICES, connection_reuse_checks, expect_unauthorized, run_sdk_suite)
from provider import AUDIENCE, Idp, idp_checks, rotation_check  # noqa: E402
from budgets import BUDGETS, PRICES, budget_checks, wait_for_a_whole_day  # noqa: E402
from agents import agent_checks, agents_service  # noqa: E402
from bridge import bridge_checks, bridge_services  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SDK_DIR = os.path.join(ROOT, "tests", "sdk")
START_TIMEOUT = 30      # seconds for any child to say it is ready


class RunTimeout(BaseException):
    """The whole-run limit: a BaseException, so no check can swallow it."""


# ---- the gateway --------------------------------------------------------------------------------

def config(tmp, port, metrics_port, upstream_port, gone_port, issuer, key_store=None):
    """The gateway's config (tests/gateway_config.py): the four SERVICES, `gone` (on `gone_port`,
    where nothing listens), the agent checks' `claude`, the bridge checks' `bridge`, `bridge_codex`
    and `bridge_gpt`, API keys (SQLite in `tmp` unless `key_store`), the provider's JWTs and
    budgets."""
    # All four speak the OpenAI API (bodies validated, usage counted); chatx has a model policy.
    services = [{"name": s, "upstream": f"http://127.0.0.1:{upstream_port}/{s}", "api": "openai",
                 "read_timeout_seconds": 30} for s in SERVICES]
    services[SERVICES.index("chatx")]["models"] = {"default": CHATX_DEFAULT, "aliases": CHATX_ALIASES}
    # Nothing listens here: every request to `gone` is a 502 the gateway writes itself.
    services.append({"name": "gone", "upstream": f"http://127.0.0.1:{gone_port}", "scope": "infer"})
    services.append(agents_service(upstream_port))
    services.extend(bridge_services(upstream_port))
    return {
        "comment": "written by tests/sdk/run.py", "dir": tmp, "port": port, "metrics_port": metrics_port,
        "server": {"threads": 2, "grace_period_seconds": 1, "graceful_shutdown_timeout_seconds": 1},
        "api_keys": {"database": key_store or f"sqlite://{tmp}/keys.db"},
        "jwt": {"issuer": issuer, "audience": AUDIENCE},
        "budgets": BUDGETS,
        "pricing": {"file": write_prices(tmp), "currency": "USD"},
        "services": services,
    }


def write_prices(tmp):
    """The price table of the budget checks (tests/sdk/budgets.py: PRICES); its path."""
    path = os.path.join(tmp, "prices.toml")
    with open(path, "w") as f:
        f.write(PRICES)
    return path


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


# ---- the suites ----------------------------------------------------------------------------------

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
    try:
        checks = bridge_checks(gw)
    except Exception as e:  # no key: report it, run the rest
        res.record("[py bridge] a key for the bridge checks", False, f"{type(e).__name__}: {e}")
        return
    for name, fn in checks:
        res.check(f"[py bridge] {name}", fn)


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
                    help="agents: the agent API and bridge checks alone (Python and Node)")
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
        run_node_suite(res, gw, "bridge", key_all, tmp, budgets=True, file="bridge.test.mjs")
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
