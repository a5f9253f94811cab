"""The configs the load benchmark writes: the gateway's (one service per target) and nginx's (a
plain reverse proxy with a static bearer check and the gateway's header rewriting)."""


def gateway(w, gw_port, metrics_port, up_port, dead_port, redis_port, issuer, access_log_off):
    """Services: infer (key, jwt), policy (model policy), metered (api = "openai" alone: metering
    and nothing else over infer), limited (Redis rate limit), replicas
    (three hosts of one upstream) and failover (a dead replica listed first); w is the work
    directory."""
    up = f"http://127.0.0.1:{up_port}"
    off = '[access_log]\ndestination = "off"\n' if access_log_off else ""
    return f"""[server]
listen = ["127.0.0.1:{gw_port}"]
threads = 1
grace_period_seconds = 1
graceful_shutdown_timeout_seconds = 1
upgrade_sock = "{w}/upgrade.sock"
pid_file = "{w}/portcullis.pid"
# The footprint stage holds STREAMS streams, all from 127.0.0.1.
max_connections = 1000000
max_connections_per_client = 1000000
{off}[auth.api_keys]
database = "sqlite://{w}/keys.db"
[auth.jwt]
issuer = "{issuer}"
audience = "portcullis"
algorithms = ["RS256"]
[metrics]
listen = "127.0.0.1:{metrics_port}"
[services.infer]
upstream = "{up}"
scope = "infer"
[services.policy]
upstream = "{up}"
scope = "infer"
api = "openai"
[services.policy.models]
default = "bench-default"
aliases = {{ bench = "bench-1" }}
[services.metered]
upstream = "{up}"
scope = "infer"
api = "openai"
[services.limited]
upstream = "{up}"
scope = "infer"
rate_limit_per_minute = 100000000
[rate_limits]
redis = "redis://127.0.0.1:{redis_port}"
[services.replicas]
upstream = ["{up}", "http://127.0.0.2:{up_port}", "http://127.0.0.3:{up_port}"]
scope = "infer"
[services.failover]
upstream = ["http://127.0.0.1:{dead_port}", "{up}"]
scope = "infer"
# Never ejected: every request pays the failed connect.
eject_after_connect_failures = 4000000000
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
