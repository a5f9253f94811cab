"""The configs the load benchmark writes: the gateway's, each a description written as TOML by
the test kit's typed config builder (tests/gateway_config.py; the run's gateway with one service
per target, callgrind.py's and the routing stage's), and nginx's (a plain reverse proxy with a
static bearer check and the gateway's header rewriting). `writer` is the test kit's
gateway-config binary (binaries.Tools.config_writer)."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "tests"))
import gateway_config  # noqa: E402  (tests/gateway_config.py)


def gateway(writer, w, gw_port, metrics_port, up_port, dead_port, redis_port, issuer, access_log_off,
            name=None, budgets=False):
    """Services: infer (key, jwt), policy (model policy), metered (api = "openai" alone: metering
    and nothing else over infer), limited (Redis rate limit), replicas
    (three hosts of one upstream) and failover (a dead replica listed first); w is the work
    directory. `name`: a second gateway on the same config, with an upgrade socket and pid file
    of its own (<name>-upgrade.sock, <name>.pid); `budgets`: with [budgets] (its defaults)."""
    up = f"http://127.0.0.1:{up_port}"
    server = {"threads": 1, "grace_period_seconds": 1, "graceful_shutdown_timeout_seconds": 1,
              # The footprint stage holds STREAMS streams, all from 127.0.0.1.
              "max_connections": 1_000_000, "max_connections_per_client": 1_000_000}
    if name:
        server.update(upgrade_sock=f"{w}/{name}-upgrade.sock", pid_file=f"{w}/{name}.pid")
    description = {
        "dir": str(w), "port": gw_port, "metrics_port": metrics_port, "server": server,
        "jwt": {"issuer": issuer, "audience": "portcullis", "algorithms": ["RS256"]},
        "rate_limits": {"redis": f"redis://127.0.0.1:{redis_port}"},
        "services": [
            {"name": "infer", "upstream": up},
            {"name": "policy", "upstream": up, "scope": "infer", "api": "openai",
             "models": {"default": "bench-default", "aliases": {"bench": "bench-1"}}},
            {"name": "metered", "upstream": up, "scope": "infer", "api": "openai"},
            {"name": "limited", "upstream": up, "scope": "infer", "rate_limit_per_minute": 100_000_000},
            {"name": "replicas", "upstream": [up, f"http://127.0.0.2:{up_port}", f"http://127.0.0.3:{up_port}"],
             "scope": "infer"},
            # Never ejected: every request pays the failed connect.
            {"name": "failover", "upstream": [f"http://127.0.0.1:{dead_port}", up], "scope": "infer",
             "eject_after_connect_failures": 4_000_000_000},
        ],
    }
    if access_log_off:
        description["access_log"] = {"destination": "off"}
    if budgets:
        description["budgets"] = {}
    return gateway_config.render(description, writer)


def callgrind(writer, w, gw_port, metrics_port, up_port, metered=False, redis_port=None, bridge=False,
              access_log="off"):
    """callgrind.py's gateway: `infer` alone, access log off; `metered`: and the service `metered`
    (api = "openai"); `redis_port`: with [budgets] and [rate_limits] on that Redis; `bridge`: and
    the translated services `bridge_messages` (messages = "chat") and `bridge_responses`
    (responses = "chat") on the same upstream; `access_log` "file": the access log to
    <w>/access.log."""
    up = f"http://127.0.0.1:{up_port}"
    services = [{"name": "infer", "upstream": up}]
    if metered:
        services.append({"name": "metered", "upstream": up, "scope": "infer", "api": "openai"})
    if bridge:
        services += [
            {"name": "bridge_messages", "upstream": up, "scope": "infer", "api": "anthropic",
             "translate": {"messages": "chat"}},
            {"name": "bridge_responses", "upstream": up, "scope": "infer", "api": "openai",
             "translate": {"responses": "chat"}},
        ]
    description = {"dir": str(w), "port": gw_port, "metrics_port": metrics_port, "server": {"threads": 1},
                   "access_log": {"destination": "off"}, "services": services}
    if access_log == "file":
        description["access_log"] = {"destination": str(w / "access.log")}
    if redis_port:
        description.update(budgets={}, rate_limits={"redis": f"redis://127.0.0.1:{redis_port}"})
    return gateway_config.render(description, writer)


def routing(writer, w, gw_port, metrics_port, replica_ports, policy):
    """The routing stage's gateway: `infer` (api = "openai") over the replicas, balanced by
    `policy`, access log off."""
    return gateway_config.render({
        "dir": str(w), "port": gw_port, "metrics_port": metrics_port,
        "server": {"threads": 1, "grace_period_seconds": 1, "graceful_shutdown_timeout_seconds": 1},
        "access_log": {"destination": "off"},
        "services": [{"name": "infer", "upstream": [f"http://127.0.0.1:{p}" for p in replica_ports],
                      "api": "openai", "balance": policy}],
    }, writer)


def scaling(writer, w, gw_port, metrics_port, up_port, threads, access_log, governed=False):
    """The scaling stage's gateway (stages_scaling.py): `threads` worker threads, `infer` on the
    upstream, access log `access_log` ("off" or a file's path); `governed`: and the service
    `governed` (api = "openai" with a model policy, as the run's `policy`) with [budgets]
    counted per process (no [rate_limits] redis). w holds the key store every variant shares."""
    up = f"http://127.0.0.1:{up_port}"
    services = [{"name": "infer", "upstream": up}]
    description = {
        "dir": str(w), "port": gw_port, "metrics_port": metrics_port,
        "server": {"threads": threads, "grace_period_seconds": 1, "graceful_shutdown_timeout_seconds": 1,
                   # SCALING_CONNECTIONS connections, all from 127.0.0.1.
                   "max_connections": 1_000_000, "max_connections_per_client": 1_000_000},
        "access_log": {"destination": access_log},
        "services": services,
    }
    if governed:
        services.append({"name": "governed", "upstream": up, "scope": "infer", "api": "openai",
                         "models": {"default": "bench-default", "aliases": {"bench": "bench-1"}}})
        description["budgets"] = {}
    return gateway_config.render(description, writer)


def nginx_upstream(d, fd_limit, port, workers, body):
    """nginx as the scaling stage's upstream: `workers` processes answering every request with
    `body` as JSON (the fast upstream's chat completion), so the upstream keeps up with proxies
    of several threads."""
    return f"""worker_processes {workers};
daemon off;
pid {d}/nginx.pid;
error_log {d}/error.log warn;
worker_rlimit_nofile {fd_limit};
events {{ worker_connections 16384; }}
http {{
    access_log off;
    client_body_temp_path {d}/tmp/body;
    proxy_temp_path {d}/tmp/proxy;
    fastcgi_temp_path {d}/tmp/fastcgi;
    uwsgi_temp_path {d}/tmp/uwsgi;
    scgi_temp_path {d}/tmp/scgi;
    keepalive_requests 1000000;
    server {{
        listen 127.0.0.1:{port} reuseport;
        location / {{
            default_type application/json;
            return 200 '{body}';
        }}
    }}
}}
"""


def nginx(d, fd_limit, up_port, port, key):
    return f"""worker_processes 1;
daemon off;
pid {d}/nginx.pid;
error_log {d}/error.log warn;
worker_rlimit_nofile {fd_limit};
events {{ worker_connections 16384; }}
http {{
    access_log off;
    client_body_temp_path {d}/tmp/body;
    proxy_temp_path {d}/tmp/proxy;
    fastcgi_temp_path {d}/tmp/fastcgi;
    uwsgi_temp_path {d}/tmp/uwsgi;
    scgi_temp_path {d}/tmp/scgi;
    keepalive_requests 1000000;
    map_hash_bucket_size 128;  # the key is longer than the default bucket
    upstream fast {{
        server 127.0.0.1:{up_port};
        keepalive 128;
        keepalive_requests 1000000;
    }}
    map $http_authorization $ok {{
        "Bearer {key}" 1;
        default 0;
    }}
    server {{
        listen 127.0.0.1:{port};
        location /v1/infer/ {{
            if ($ok = 0) {{ return 401; }}
            proxy_pass http://fast/;
            proxy_http_version 1.1;
            # What the gateway does too: no client credential upstream, forwarding headers,
            # a request id both ways, no upstream cookies, and no response buffering (SSE).
            proxy_set_header Connection "";
            proxy_set_header Authorization "";
            proxy_set_header Cookie "";
            proxy_set_header X-Forwarded-For $remote_addr;
            proxy_set_header X-Forwarded-Proto http;
            proxy_set_header X-Request-Id $request_id;
            proxy_hide_header Set-Cookie;
            add_header X-Request-Id $request_id always;
            proxy_buffering off;
        }}
    }}
}}
"""
