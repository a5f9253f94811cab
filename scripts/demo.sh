#!/usr/bin/env bash
# `make run`: the demo upstream, a fresh demo API key, and the gateway in front, in the foreground.
set -euo pipefail
cd "$(dirname "$0")/.."
BIN=${BIN:-target/debug/portcullis}
CONF=conf/demo.toml

python3 demo/upstream.py --port 8000 >/dev/null &
UPSTREAM=$!
trap 'kill $UPSTREAM 2>/dev/null || true' EXIT

KEY=$("$BIN" keys create --config "$CONF" --name "demo $(date +%FT%T)" --scopes infer,chatx,chaty,embed | tail -n 1)

cat <<MSG

  Portcullis demo: gateway on http://127.0.0.1:8080, demo upstream on 127.0.0.1:8000.
  A fresh API key with scopes infer,chatx,chaty,embed was created in data/demo-keys.db:

    export KEY=$KEY

  Try:
    curl -s http://127.0.0.1:8080/healthz
    curl -s http://127.0.0.1:8080/v1/infer/v1/models                                   # 401: no token
    curl -s -H "Authorization: Bearer \$KEY" http://127.0.0.1:8080/v1/infer/v1/models
    # chatx has a default model and aliases (conf/demo.toml); the upstream echoes what it got:
    curl -s -H "Authorization: Bearer \$KEY" http://127.0.0.1:8080/v1/chatx/v1/chat/completions \\
         -d '{"messages":[{"role":"user","content":"hello"}]}'                          # model x-large-2
    curl -s -H "Authorization: Bearer \$KEY" http://127.0.0.1:8080/v1/chatx/v1/chat/completions \\
         -d '{"model":"small","messages":[{"role":"user","content":"hello"}]}'          # model x-small-1
    curl -s -H "Authorization: Bearer \$KEY" http://127.0.0.1:8080/v1/chatx/v1/chat/completions \\
         -d '{"messages":[{"content":"no role"}]}'                                     # 400 naming the field
    curl -sN -H "Authorization: Bearer \$KEY" http://127.0.0.1:8080/v1/infer/v1/chat/completions \\
         -d '{"model":"alpha3.6-vl","stream":true,"messages":[{"role":"user","content":"stream me"}]}'
    curl -s -H "Authorization: Bearer \$KEY" http://127.0.0.1:8080/v1/embed/v1/embeddings \\
         -d '{"model":"emb-m3","input":["a","b"]}' | head -c 200; echo
    curl -s http://127.0.0.1:9100/metrics | grep ^portcullis_                           # portcullis_tokens_total too
    target/debug/portcullis keys list --config $CONF

  Ctrl-C stops both.

MSG
"$BIN" serve --config "$CONF"
