"""The real agent CLIs through the dialect bridge (`make test-clients`, optional: it downloads
the CLIs from npm). Claude Code (`claude -p`, Anthropic Messages) and Codex CLI (`codex exec`,
OpenAI Responses) each run one non-interactive turn against a gateway whose services translate
their dialect to the demo model's chat completions (`messages = "chat"`, `responses = "chat"`),
as docs/agents.md configures them. A check passes when the CLI exits 0, prints the demo
model's answer (`Echo: …`) and the gateway's access log shows its calls translated and
answered 200.

    python3 tests/clients/run.py --clients DIR [--bin target/debug/portcullis]
        [--upstream target/debug/fake-upstream] [--config-bin target/debug/gateway-config]

DIR holds node_modules/.bin/{claude,codex} (scripts/client-tests.sh installs them there).
"""

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
import urllib.request

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import gateway_config  # noqa: E402
from harness import ROOT, Child, Results, expect, free_port, tail  # noqa: E402

CLI_TIMEOUT = 180


def gateway_description(tmp, port, upstream_port):
    up = f"http://127.0.0.1:{upstream_port}/chatx"
    return {
        "comment": "written by tests/clients/run.py", "dir": tmp, "port": port,
        "api_keys": {"database": f"sqlite://{tmp}/keys.db"},
        "access_log": {"destination": f"{tmp}/access.log"},
        "services": [
            {"name": "claude", "upstream": up, "api": "anthropic", "translate": {"messages": "chat"}},
            {"name": "codex", "upstream": up, "api": "openai", "translate": {"responses": "chat"}},
        ],
    }


def wait_healthy(url, child):
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        try:
            with urllib.request.urlopen(url + "/healthz", timeout=2) as r:
                if r.status == 200:
                    return
        except OSError:
            pass
        if child.proc.poll() is not None:
            break
        time.sleep(0.1)
    raise RuntimeError(f"gateway not healthy; log:\n{tail(child.log_path)}")


def translated_calls(log_path, pair):
    """The access log's lines of calls translated by `pair`, as (status, path)."""
    with open(log_path) as f:
        lines = [json.loads(line) for line in f if line.strip()]
    return [(line.get("status"), line.get("path")) for line in lines if line.get("translated") == pair]


def run_cli(argv, env, cwd):
    done = subprocess.run(argv, env=env, cwd=cwd, capture_output=True, text=True, timeout=CLI_TIMEOUT,
                          stdin=subprocess.DEVNULL)
    return done.returncode, done.stdout + done.stderr


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--clients", required=True)
    ap.add_argument("--bin", default=os.path.join(ROOT, "target", "debug", "portcullis"))
    ap.add_argument("--upstream", default=os.path.join(ROOT, "target", "debug", "fake-upstream"))
    ap.add_argument("--config-bin", default=gateway_config.BINARY)
    args = ap.parse_args()
    bins = os.path.join(os.path.abspath(args.clients), "node_modules", ".bin")
    res = Results()
    with tempfile.TemporaryDirectory(prefix="portcullis-clients-") as tmp:
        upstream = Child("upstream", [args.upstream, "--port", "0", "--token-delay-ms", "2"],
                         os.path.join(tmp, "upstream.log"), wait_listening=True)
        port = free_port()
        config = gateway_config.write(os.path.join(tmp, "portcullis.toml"),
                                      gateway_description(tmp, port, upstream.port), args.config_bin)
        gateway = Child("gateway", [args.bin, "serve", "--config", config], os.path.join(tmp, "gateway.log"),
                        wait_listening=False)
        try:
            url = f"http://127.0.0.1:{port}"
            wait_healthy(url, gateway)
            key = subprocess.run([args.bin, "keys", "create", "--config", config, "--name", "clients",
                                  "--scopes", "claude,codex"], capture_output=True, text=True,
                                 check=True).stdout.strip().splitlines()[-1]
            home = os.path.join(tmp, "home")
            work = os.path.join(home, "project")
            os.makedirs(work)
            base_env = {"PATH": os.environ["PATH"], "HOME": home, "DISABLE_TELEMETRY": "1",
                        "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1"}
            log = os.path.join(tmp, "access.log")

            def claude_code():
                env = {**base_env, "ANTHROPIC_BASE_URL": f"{url}/v1/claude", "ANTHROPIC_AUTH_TOKEN": key}
                code, out = run_cli([os.path.join(bins, "claude"), "-p", "say hello"], env, work)
                expect(code == 0, f"claude exited {code}: {out[-2000:]}")
                expect("Echo:" in out, f"the demo model's answer printed: {out[-2000:]}")
                calls = translated_calls(log, "messages>chat")
                expect(calls and all(s == 200 for s, _ in calls), f"translated calls answered 200: {calls}")
                return f"{len(calls)} translated calls"

            def codex():
                codex_home = os.path.join(home, ".codex")
                os.makedirs(codex_home, exist_ok=True)
                with open(os.path.join(codex_home, "config.toml"), "w") as f:
                    # web_search is a tool only OpenAI runs: the bridge refuses it (docs/agents.md).
                    f.write('model = "alpha3.6-vl"\nmodel_provider = "portcullis"\nweb_search = "disabled"\n'
                            '[model_providers.portcullis]\nname = "Portcullis"\n'
                            f'base_url = "{url}/v1/codex/v1"\nenv_key = "PORTCULLIS_KEY"\n'
                            'wire_api = "responses"\n')
                env = {**base_env, "CODEX_HOME": codex_home, "PORTCULLIS_KEY": key}
                argv = [os.path.join(bins, "codex"), "exec", "--skip-git-repo-check", "say hello"]
                code, out = run_cli(argv, env, work)
                expect(code == 0, f"codex exited {code}: {out[-2000:]}")
                expect("Echo:" in out, f"the demo model's answer printed: {out[-2000:]}")
                calls = translated_calls(log, "responses>chat")
                expect(calls and all(s == 200 for s, _ in calls), f"translated calls answered 200: {calls}")
                return f"{len(calls)} translated calls"

            res.check("Claude Code (claude -p) completes a turn through messages = \"chat\"", claude_code)
            res.check("Codex CLI (codex exec) completes a turn through responses = \"chat\"", codex)
        finally:
            gateway.stop()
            upstream.stop()
    print(f"{res.passed} passed, {res.failed} failed")
    return 1 if res.failed else 0


if __name__ == "__main__":
    sys.exit(main())
