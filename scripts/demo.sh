#!/usr/bin/env bash
# `make run`: the demo upstream (the fake upstream's demo model, target/debug/fake-upstream), a
# local OpenID provider, a fresh demo API key, and the gateway in front with its key console, in
# the foreground. `make run` builds both binaries first; run alone, this builds them when missing.
#
# The gateway's config is conf/demo.toml plus, written to data/demo-console.toml, an [auth.jwt]
# section trusting the local provider (tests/sdk/idp.mjs: oidc-provider on 127.0.0.1:$IDP_PORT)
# and an [admin] section serving the key API and the console on 127.0.0.1:9200. Without Node.js
# the demo runs as before, on conf/demo.toml alone (no provider, no console).
set -euo pipefail
cd "$(dirname "$0")/.."
BIN=${BIN:-target/debug/portcullis}
UPSTREAM=${UPSTREAM:-target/debug/fake-upstream}
BASE_CONF=conf/demo.toml
IDP_PORT=${IDP_PORT:-9400}
ADMIN=127.0.0.1:9200
AUDIENCE=urn:portcullis:demo
ISSUER=http://127.0.0.1:$IDP_PORT
SDK=tests/sdk

NAME=demo
. scripts/lib.sh

pids=()
cleanup() { for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done; }
trap cleanup EXIT

gateway_binary "$BIN"
gateway_binary "$UPSTREAM"
"$UPSTREAM" --port 8000 >/dev/null &
pids+=($!)

# ---- the local OpenID provider and the console config (needs Node.js) ----
CONF=$BASE_CONF
CONSOLE=0
if command -v node >/dev/null 2>&1 && command -v npm >/dev/null 2>&1; then
    npm_ci "$SDK" # the local OpenID provider, once
    mkdir -p data
    IDP_LOG=data/demo-idp.log
    node "$SDK/idp.mjs" --port "$IDP_PORT" --audience "$AUDIENCE" \
        --console-redirect "http://$ADMIN/console/,http://localhost:${ADMIN#*:}/console/" >"$IDP_LOG" 2>&1 &
    IDP=$!
    pids+=("$IDP")
    for _ in $(seq 100); do
        grep -q '^LISTENING' "$IDP_LOG" 2>/dev/null && break
        kill -0 "$IDP" 2>/dev/null || die "the OpenID provider did not start (port $IDP_PORT busy? IDP_PORT= changes it):
$(tail -5 "$IDP_LOG")"
        sleep 0.1
    done
    grep -q '^LISTENING' "$IDP_LOG" || die "the OpenID provider did not start within 10 s: $(tail -5 "$IDP_LOG")"

    # conf/demo.toml plus what the console needs (sections it already has are left as they are).
    CONF=data/demo-console.toml
    {
        echo "# Written by scripts/demo.sh at every \`make run\`: conf/demo.toml plus the console. Edit conf/demo.toml."
        cat "$BASE_CONF"
        if ! grep -q '^\[auth\.jwt\]' "$BASE_CONF"; then
            printf '\n# The local OpenID provider (tests/sdk/idp.mjs) started by scripts/demo.sh.\n'
            printf '[auth.jwt]\nissuer = "%s"\naudience = "%s"\n' "$ISSUER" "$AUDIENCE"
        fi
        if ! grep -q '^\[admin\]' "$BASE_CONF"; then
            printf '\n# The key API and the key console, same origin (no CORS needed). The console offers\n'
            printf '# administrator sign-in, and only the login "admin" may use the admin scope.\n'
            printf '[admin]\nlisten = "%s"\nconsole = true\nallowed_origins = []\n' "$ADMIN"
            printf 'console_admin_sign_in = true\nadmin_subjects = ["admin"]\n'
        fi
    } >"$CONF"
    CONSOLE=1
else
    say "Node.js not found: running without the OpenID provider and the key console"
fi

KEY=$("$BIN" keys create --config "$CONF" --name "demo $(date +%FT%T)" --scopes infer,chatx,chaty,embed,claude,codex | tail -n 1)

if [ "$CONSOLE" = 1 ]; then
    cat <<MSG

  Key console: http://$ADMIN/console/
    1. Open it and press "Sign in". The local OpenID provider ($ISSUER) asks for a login:
       any name works and becomes your identity (password: anything). Log in as "admin" and tick
       "Request administrator access" to see and revoke everyone's keys.
    2. Press "Continue" on the consent page; you are back in the console.
    3. Create a key (name, scopes, expiry): the full key is shown once, with a curl command.
    4. Revoke it in the list: the gateway refuses it within seconds.
  The key API itself: http://$ADMIN/v1/keys (a login token as Bearer), described at http://$ADMIN/openapi.json
MSG
fi

cat <<MSG

  Portcullis demo: gateway on http://127.0.0.1:8080, demo upstream on 127.0.0.1:8000.
  A fresh API key with scopes infer,chatx,chaty,embed,claude,codex was created in data/demo-keys.db:

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
    # Agent APIs (docs/agents.md): OpenAI Responses on chatx (Codex CLI), Anthropic Messages on
    # claude (Claude Code: Bearer auth, as ANTHROPIC_AUTH_TOKEN sends it); add "stream":true to stream.
    curl -s -H "Authorization: Bearer \$KEY" http://127.0.0.1:8080/v1/chatx/v1/responses \\
         -d '{"input":"hello"}'                                                         # model x-large-2
    curl -s -H "Authorization: Bearer \$KEY" -H "anthropic-version: 2023-06-01" \\
         http://127.0.0.1:8080/v1/claude/v1/messages \\
         -d '{"model":"claude-sonnet-4-5","max_tokens":64,"messages":[{"role":"user","content":"hello"}]}'
    # The bridge: the same Messages call, answered by the chat endpoint through translation.
    # Claude Code on it: ANTHROPIC_BASE_URL=http://127.0.0.1:8080/v1/bridge ANTHROPIC_AUTH_TOKEN=\$KEY claude
    curl -s -H "Authorization: Bearer \$KEY" http://127.0.0.1:8080/v1/bridge/v1/messages \\
         -d '{"model":"claude-sonnet-4-5","max_tokens":64,"messages":[{"role":"user","content":"hello"}]}'
    # Codex on the chat endpoint, through the bridge: a Responses call answered by chat completions.
    curl -s -H "Authorization: Bearer \$KEY" http://127.0.0.1:8080/v1/codex/v1/responses \\
         -d '{"input":"hello","store":false}'
    # Codex CLI on it: in \$CODEX_HOME/config.toml
    #   model_provider = "portcullis"
    #   web_search = "disabled"          # a tool only OpenAI runs: the bridge refuses it
    #   [model_providers.portcullis]
    #   name = "Portcullis demo"
    #   base_url = "http://127.0.0.1:8080/v1/codex/v1"
    #   env_key = "KEY"
    #   wire_api = "responses"
    # then: codex exec "say hello"
    curl -s -H "Authorization: Bearer \$KEY" http://127.0.0.1:8080/v1/embed/v1/embeddings \\
         -d '{"model":"emb-m3","input":["a","b"]}' | head -c 200; echo
    curl -s http://127.0.0.1:9100/metrics | grep ^portcullis_                           # portcullis_tokens_total too
    target/debug/portcullis keys list --config $CONF

  Ctrl-C stops them all.

MSG
"$BIN" serve --config "$CONF"
