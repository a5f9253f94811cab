#!/usr/bin/env python3
"""Key-management API conformance for Portcullis.

1. src/admin/openapi.json is a valid OpenAPI 3.1 document (openapi-spec-validator), its regular
   expressions compile, its examples match their schemas and its links name real operations.
2. Starts, on 127.0.0.1 and free ports: the fake upstream's demo model
   (target/debug/fake-upstream, testkit/src/upstream/model.rs), a real OpenID Provider
   (tests/sdk/idp.mjs) and the real gateway with an [admin] listener, then checks by hand that
   the served document is that file, that every 401 of the admin listener is identical to the
   data plane's (status, WWW-Authenticate, content type, body; on the wire, the header lines in
   order), that an API key is refused with 403, one create / list / revoke round trip that the
   data plane honours, what one owner may do to another's keys, and that concurrent creates
   cannot pass max_keys_per_owner.
3. Runs schemathesis (every built-in check, see schemathesis.toml) against the live
   /openapi.json: once with a client_credentials token (scopes `infer embed`, not an admin),
   once with an admin's token from the provider's login flow (`admin`, console client) when
   the provider offers one.

Run through scripts/admin-api-tests.sh, which installs the pinned packages; by hand:
    tests/admin_api/.venv/bin/python tests/admin_api/run.py [--bin target/debug/portcullis]
        [--upstream target/debug/fake-upstream]
Prints one line per check and, last, `N passed, N failed`; exits 0 only when all passed.
Every child process is stopped, whatever happens.
"""
import argparse
import base64
import hashlib
import html
import json
import os
import re
import secrets
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.parse

import jsonschema
import openapi_spec_validator
import requests

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from harness import (  # noqa: E402  (tests/harness.py)
    CheckFailed, Child, Results, expect, expect_eq, finish, free_port, tail)

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
HERE = os.path.join(ROOT, "tests", "admin_api")
DOC_PATH = os.path.join(ROOT, "src", "admin", "openapi.json")
IDP = os.path.join(ROOT, "tests", "sdk", "idp.mjs")
AUDIENCE = "urn:portcullis:test"
OTHER_AUDIENCE = "urn:portcullis:other"            # idp.mjs's second resource server: not the gateway
ADMIN_SCOPE = "portcullis:admin"
CC_CLIENT = ("svc-cc", "svc-cc-test-secret")      # client_credentials, scopes `infer embed`, sub = client id
CONSOLE_CLIENT = "portcullis-console"              # public client of idp.mjs (PKCE); login `admin` may get ADMIN_SCOPE
REDIRECT_URI = "http://127.0.0.1/callback"
MAX_KEYS_PER_OWNER = 25   # low, so the fuzzer's admin run reaches 409 conflict
START_TIMEOUT = 30
HTTP_TIMEOUT = 20
SCHEMATHESIS_TIMEOUT = 300


# ---- tokens -----------------------------------------------------------------------------------

def jwt_claims(token):
    p = token.split(".")[1]
    return json.loads(base64.urlsafe_b64decode(p + "=" * (-len(p) % 4)))


# ---- the OpenAPI document -----------------------------------------------------------------------

def load_doc():
    with open(DOC_PATH, "rb") as f:
        raw = f.read()
    return raw, json.loads(raw)


def validator_for(doc, ref):
    """A JSON Schema 2020-12 validator (OpenAPI 3.1's dialect) for `ref` inside `doc`."""
    schema = {"$ref": ref, "components": doc["components"]}
    return jsonschema.Draft202012Validator(schema, format_checker=jsonschema.Draft202012Validator.FORMAT_CHECKER)


def validate_against(doc, ref, value, what):
    errors = sorted(validator_for(doc, ref).iter_errors(value), key=lambda e: list(e.absolute_path))
    expect(not errors, f"{what} does not match {ref}: " + "; ".join(
        f"{'/'.join(map(str, e.absolute_path)) or '(root)'}: {e.message}" for e in errors[:5]))


def walk(node, path=()):
    yield path, node
    if isinstance(node, dict):
        for k, v in node.items():
            yield from walk(v, path + (k,))
    elif isinstance(node, list):
        for i, v in enumerate(node):
            yield from walk(v, path + (i,))


def leaves(doc):
    """{"a/b/0": value} for every scalar in a JSON document."""
    return {"/".join(map(str, p)): v for p, v in walk(doc) if not isinstance(v, (dict, list))}


def doc_checks(res):
    raw, doc = load_doc()

    def spec_valid():
        openapi_spec_validator.validate(doc)
        expect_eq(doc.get("openapi"), "3.1.0", "openapi version")
        return f"openapi-spec-validator {openapi_spec_validator.__version__}"
    res.check("[doc] src/admin/openapi.json is a valid OpenAPI 3.1 document (openapi-spec-validator)", spec_valid)

    def operations():
        ops = sorted(f"{m.upper()} {p}" for p, item in doc["paths"].items() for m in item
                     if m in ("get", "put", "post", "delete", "patch", "head", "options", "trace"))
        expect_eq(ops, ["DELETE /v1/keys/{id}", "GET /openapi.json", "GET /v1/keys", "POST /v1/keys"], "operations")
        for p, item in doc["paths"].items():
            for m, op in item.items():
                secured = op.get("security") == [{"bearer": []}]
                expect(secured == p.startswith("/v1/keys"), f"{m} {p}: security {op.get('security')}")
                if p.startswith("/v1/keys"):
                    expect("401" in op["responses"] and "403" in op["responses"], f"{m} {p}: 401/403 undocumented")
        return ", ".join(ops)
    res.check("[doc] exactly the four operations, bearer security on /v1/keys only", operations)

    def patterns():
        n = 0
        for path, node in walk(doc):
            if path and path[-1] == "pattern" and isinstance(node, str):
                re.compile(node)  # Python's re reads these ECMA-262 patterns alike (\xHH, classes)
                n += 1
        # The patterns say what the listener accepts: spot-check them.
        schemas = doc["components"]["schemas"]
        scope = re.compile(schemas["Scope"]["pattern"])
        expect(all(scope.search(s) for s in ("infer", "portcullis:admin", "a!#[]~")), "scope pattern refuses a scope")
        expect(not any(scope.search(s) for s in ("a b", 'a"', "a\\b", "é", "")), "scope pattern accepts a non-scope")
        name = re.compile(schemas["KeyName"]["pattern"])
        expect(all(name.search(s) for s in ("ci-bot", " ci bot ✓ ", "x", "\u00a0x")), "name pattern refuses a name")
        expect(not any(name.search(s) for s in ("", " ", "\u3000\u00a0\t", "a\nb", "a\x85b", "a\x7f")),
               "name pattern accepts a blank name or a control character")
        exp = re.compile(schemas["NewKey"]["properties"]["expires_in"]["pattern"])
        expect(all(exp.search(s) for s in ("30s", "15m", "12h", "90d", "999999d", "99999999999s")),
               "expires_in refuses a lifetime")
        expect(not any(exp.search(s) for s in ("0s", "d", "10", "5w", "-5m", "1000000d", " 1d", "007d")),
               "expires_in accepts a bad lifetime")
        return f"{n} patterns"
    res.check("[doc] every pattern compiles and says what the listener accepts", patterns)

    def examples():
        n = 0
        for p, item in doc["paths"].items():
            for m, op in item.items():
                body = op.get("requestBody", {}).get("content", {}).get("application/json")
                for ex in (body or {}).get("examples", {}).values():
                    validate_against(doc, body["schema"]["$ref"], ex["value"], f"{m} {p} example")
                    n += 1
        return f"{n} example(s)"
    res.check("[doc] the request examples match their schemas", examples)

    def links():
        op_ids = {op["operationId"]: op for item in doc["paths"].values() for op in item.values()}
        n = 0
        for _, node in walk(doc):
            if isinstance(node, dict) and "operationId" in node and "parameters" in node and isinstance(node["parameters"], dict):
                target = op_ids.get(node["operationId"])
                expect(target is not None, f"link to unknown operation {node['operationId']}")
                names = {p["name"] for p in target.get("parameters", [])}
                expect(set(node["parameters"]) <= names, f"link parameters {set(node['parameters'])} not in {names}")
                n += 1
        return f"{n} links"
    res.check("[doc] links name existing operations and parameters", links)
    return raw, doc


# ---- the identity provider ----------------------------------------------------------------------

class Idp:
    def __init__(self, tmp):
        with open(IDP, encoding="utf-8") as f:
            self.has_admin_login = "console-redirect" in f.read()
        argv = ["node", IDP, "--port", "0", "--audience", AUDIENCE, "--other-audience", OTHER_AUDIENCE]
        if self.has_admin_login:
            argv += ["--console-client-id", CONSOLE_CLIENT, "--console-redirect", REDIRECT_URI]
        self.child = Child("idp", argv, os.path.join(tmp, "idp.log"), wait_listening=True)
        self.issuer = f"http://127.0.0.1:{self.child.port}"

    def client_credentials(self, scope, resource=AUDIENCE):
        r = requests.post(f"{self.issuer}/token", auth=CC_CLIENT, timeout=HTTP_TIMEOUT,
                          data={"grant_type": "client_credentials", "scope": scope, "resource": resource})
        expect(r.status_code == 200, f"client_credentials token request: {r.status_code} {r.text[:300]!r}")
        return r.json()["access_token"]

    def admin_login(self):
        """The console client's authorization-code flow with PKCE, logged in as `admin`, driven
        headless through oidc-provider's devInteractions pages. Returns the access token."""
        s = requests.Session()
        verifier = secrets.token_urlsafe(48)
        challenge = base64.urlsafe_b64encode(hashlib.sha256(verifier.encode()).digest()).rstrip(b"=").decode()
        state = secrets.token_urlsafe(16)
        url = f"{self.issuer}/auth?" + urllib.parse.urlencode({
            "client_id": CONSOLE_CLIENT, "response_type": "code", "redirect_uri": REDIRECT_URI,
            "scope": f"openid infer embed {ADMIN_SCOPE}", "resource": AUDIENCE, "state": state,
            "nonce": secrets.token_urlsafe(16), "code_challenge": challenge, "code_challenge_method": "S256"})
        method, form, code = "GET", None, None
        for _ in range(12):
            r = s.request(method, url, data=form, allow_redirects=False, timeout=HTTP_TIMEOUT)
            method, form = "GET", None
            if r.status_code in (301, 302, 303, 307):
                nxt = urllib.parse.urljoin(url, r.headers["Location"])
                if nxt.startswith(REDIRECT_URI):
                    q = urllib.parse.parse_qs(urllib.parse.urlsplit(nxt).query)
                    expect("error" not in q, f"authorization error: {q}")
                    expect_eq(q.get("state"), [state], "state")
                    code = q["code"][0]
                    break
                url = nxt
                continue
            action = re.search(r'<form[^>]*action="([^"]+)"[^>]*method="post"', r.text)
            prompt = re.search(r'name="prompt" value="(\w+)"', r.text)
            expect(r.status_code == 200 and action and prompt, f"unexpected login page: {r.status_code} {r.text[:300]!r}")
            url, method = urllib.parse.urljoin(url, html.unescape(action.group(1))), "POST"
            form = {"prompt": prompt.group(1)}
            if prompt.group(1) == "login":
                form.update(login="admin", password="any")
        expect(code, "no authorization code")
        r = requests.post(f"{self.issuer}/token", timeout=HTTP_TIMEOUT, data={
            "grant_type": "authorization_code", "code": code, "redirect_uri": REDIRECT_URI,
            "code_verifier": verifier, "client_id": CONSOLE_CLIENT, "resource": AUDIENCE})
        expect(r.status_code == 200, f"code exchange: {r.status_code} {r.text[:300]!r}")
        return r.json()["access_token"]


# ---- the gateway --------------------------------------------------------------------------------

class Gateway:
    def __init__(self, binary, tmp, upstream_port, issuer):
        self.binary = binary
        self.port, self.admin_port, self.metrics_port = free_port(), free_port(), free_port()
        self.config = os.path.join(tmp, "portcullis.toml")
        with open(self.config, "w") as f:
            f.write(f"""# written by tests/admin_api/run.py
[server]
listen = ["127.0.0.1:{self.port}"]
threads = 2
grace_period_seconds = 1
graceful_shutdown_timeout_seconds = 1
upgrade_sock = "{tmp}/upgrade.sock"
pid_file = "{tmp}/portcullis.pid"

[metrics]
listen = "127.0.0.1:{self.metrics_port}"

[auth.api_keys]
database = "sqlite://{tmp}/keys.db"
cache_ttl_seconds = 1
negative_cache_ttl_seconds = 1

[auth.jwt]
issuer = "{issuer}"
audience = "{AUDIENCE}"

[services.infer]
upstream = "http://127.0.0.1:{upstream_port}/infer"
scope = "infer"

[services.embed]
upstream = "http://127.0.0.1:{upstream_port}/embed"
scope = "embed"

[admin]
listen = "127.0.0.1:{self.admin_port}"
admin_scope = "{ADMIN_SCOPE}"
max_keys_per_owner = {MAX_KEYS_PER_OWNER}
""")
        self.url = f"http://127.0.0.1:{self.port}"
        self.admin = f"http://127.0.0.1:{self.admin_port}"
        self.metrics_url = f"http://127.0.0.1:{self.metrics_port}/metrics"
        self.child = Child("gateway", [binary, "serve", "--config", self.config],
                           os.path.join(tmp, "gateway.log"), wait_listening=False,
                           env={**os.environ, "RUST_LOG": os.environ.get("RUST_LOG", "info")})
        deadline = time.monotonic() + START_TIMEOUT
        for url in (self.url + "/healthz", self.admin + "/openapi.json"):
            while True:
                try:
                    if requests.get(url, timeout=2).status_code == 200:
                        break
                except requests.RequestException:
                    pass
                if self.child.proc.poll() is not None or time.monotonic() > deadline:
                    code = self.child.proc.poll()
                    self.child.stop()
                    raise RuntimeError(f"gateway: {url} not answering 200 within {START_TIMEOUT}s "
                                       f"(exit code {code}); log:\n{tail(self.child.log_path)}")
                time.sleep(0.05)

    def cli_key(self, name, scopes):
        out = subprocess.run([self.binary, "keys", "create", "--config", self.config, "--name", name,
                              "--scopes", scopes], capture_output=True, text=True, timeout=30, cwd=ROOT)
        expect(out.returncode == 0, f"keys create failed ({out.returncode}): {out.stderr}")
        return out.stdout.strip().splitlines()[-1]

    def metric(self, name, labels):
        body = requests.get(self.metrics_url, timeout=HTTP_TIMEOUT).text
        for line in body.splitlines():
            m = re.fullmatch(rf"{name}\{{([^}}]*)\}}\s+(\S+)", line)
            if m and dict(re.findall(r'(\w+)="([^"]*)"', m.group(1))) == labels:
                return float(m.group(2))
        return 0.0


def bearer(token):
    return {"Authorization": f"Bearer {token}"} if token is not None else {}


# ---- hand-written checks against the live listener ----------------------------------------------

def served_document(res, gw, raw, doc):
    def served():
        r = requests.get(gw.admin + "/openapi.json", timeout=HTTP_TIMEOUT)
        expect_eq(r.status_code, 200, "status")
        expect(r.headers.get("content-type", "").split(";")[0].strip() == "application/json",
               f"content-type {r.headers.get('content-type')!r}")
        served = r.json()
        if served != doc:
            a, b = leaves(served), leaves(doc)
            differ = sorted(k for k in a.keys() | b.keys() if a.get(k, a) != b.get(k, b))
            raise CheckFailed("the served document is not src/admin/openapi.json (a binary built before the "
                              f"last edit?); {len(differ)} values differ, e.g. at {differ[:6]}")
        return "byte-identical" if r.content == raw else "same JSON"
    res.check("[live] GET /openapi.json without a token serves src/admin/openapi.json as application/json", served)


def unauthorized_parity(res, gw, idp):
    """Every 401 of the admin listener equals the data plane's for the same credential."""
    garbage_jwt = ".".join(base64.urlsafe_b64encode(json.dumps(x).encode()).rstrip(b"=").decode()
                           for x in ({"alg": "RS256", "typ": "at+jwt", "kid": "nope"}, {"sub": "x"}, "sig"))
    credentials = {
        "no Authorization": {},
        "Basic scheme": {"Authorization": "Basic " + base64.b64encode(b"a:b").decode()},
        "Bearer without token": {"Authorization": "Bearer"},
        "malformed bearer token": {"Authorization": "Bearer not-a-token"},
        "JWT with an unknown kid": {"Authorization": f"Bearer {garbage_jwt}"},
        "well-signed JWT for another audience":
            {"Authorization": f"Bearer {idp.client_credentials('infer embed', OTHER_AUDIENCE)}"},
    }
    admin_requests = [("GET", "/v1/keys", None), ("POST", "/v1/keys", {"name": "x", "scopes": ["infer"]}),
                      ("DELETE", "/v1/keys/0123456789abcdef", None)]

    def view(r):
        return (r.status_code, r.headers.get("WWW-Authenticate"),
                r.headers.get("content-type", "").split(";")[0].strip(), r.content)

    for label, headers in credentials.items():
        def parity(headers=headers):
            data = requests.get(gw.url + "/v1/infer/x", headers=headers, timeout=HTTP_TIMEOUT)
            want = view(data)
            expect_eq(want, (401, "Bearer", "application/json", b'{"error":"unauthorized"}'),
                      "data plane 401 (status, WWW-Authenticate, content type, body)")
            other = []
            for method, path, body in admin_requests:
                r = requests.request(method, gw.admin + path, headers=headers, json=body, timeout=HTTP_TIMEOUT)
                expect_eq(view(r), want, f"admin {method} {path} vs data plane GET /v1/infer/x")
                extra = sorted({h.lower() for h in r.headers} ^ {h.lower() for h in data.headers})
                if extra:
                    other.append(f"{method}: {extra}")
            return "header names differing besides: " + "; ".join(other) if other else "same header names"
        res.check(f"[live] 401 for {label}: admin listener == data plane (status, WWW-Authenticate, body)", parity)


def raw_response(port, request):
    """The bytes of one HTTP/1.1 exchange: (status line, [(name, value)] as sent, body)."""
    with socket.create_connection(("127.0.0.1", port), timeout=HTTP_TIMEOUT) as s:
        s.sendall(request)
        data = b""
        while b"\r\n\r\n" not in data:
            chunk = s.recv(4096)
            expect(chunk, f"connection closed after {data!r}")
            data += chunk
        head, body = data.split(b"\r\n\r\n", 1)
        lines = head.decode("latin-1").split("\r\n")
        headers = [tuple(x.strip() for x in line.split(":", 1)) for line in lines[1:]]
        length = int(next((v for n, v in headers if n.lower() == "content-length"), "0"))
        while len(body) < length:
            chunk = s.recv(4096)
            expect(chunk, "connection closed inside the body")
            body += chunk
    return lines[0], headers, body


def unauthorized_on_the_wire(res, gw):
    """The 401 as bytes: the same header lines in the same order (Date, X-Request-Id and
    Connection aside), the same body. Header-name case is reported, not failed: HTTP names are
    case-insensitive."""
    def wire():
        data = raw_response(gw.port, b"GET /v1/infer/x HTTP/1.1\r\nHost: gw\r\n\r\n")
        admin = raw_response(gw.admin_port, b"GET /v1/keys HTTP/1.1\r\nHost: gw\r\n\r\n")
        skip = {"date", "x-request-id", "connection"}

        def lines(r):
            return [(n.lower(), v) for n, v in r[1] if n.lower() not in skip]
        expect_eq((admin[0], lines(admin), admin[2]), (data[0], lines(data), data[2]),
                  "admin 401 vs data plane 401 (status line, header lines, body)")
        names = lambda r: [n for n, _ in r[1] if n.lower() not in skip]  # noqa: E731
        notes = []
        if names(admin) != names(data):
            notes.append(f"header-name case differs: admin {names(admin)} vs data plane {names(data)}")
        conn = [dict((n.lower(), v) for n, v in r[1]).get("connection") for r in (admin, data)]
        if conn[0] != conn[1]:
            notes.append(f"Connection: admin {conn[0]!r}, data plane {conn[1]!r}")
        return "; ".join(notes) or "identical bytes but Date and X-Request-Id"
    res.check("[live] 401 on the wire: admin listener == data plane (status line, headers in order, body)", wire)


def api_key_refused(res, gw):
    def refused():
        key = gw.cli_key("cli-key", "infer")
        seen = []
        for method, path, body in (("GET", "/v1/keys", None), ("POST", "/v1/keys", {"name": "x", "scopes": ["infer"]}),
                                   ("DELETE", f"/v1/keys/{key[3:19]}", None)):
            r = requests.request(method, gw.admin + path, headers=bearer(key), json=body, timeout=HTTP_TIMEOUT)
            expect_eq(r.status_code, 403, f"{method} {path} with an API key: status ({r.text[:200]!r})")
            expect_eq(r.json().get("error"), "forbidden", f"{method} {path}: error")
            seen.append(f"{method} 403")
        # The key itself is fine: the data plane takes it (the demo upstream answers).
        r = requests.get(gw.url + "/v1/infer/v1/models", headers=bearer(key), timeout=HTTP_TIMEOUT)
        expect_eq(r.status_code, 200, "the same key on the data plane")
        return ", ".join(seen)
    res.check("[live] a valid API key is refused on the admin API with 403 forbidden", refused)


def round_trip(res, gw, doc, token):
    sub = jwt_claims(token)["sub"]
    state = {}

    def create():
        before = gw.metric("portcullis_key_events_total", {"event": "created"})
        r = requests.post(gw.admin + "/v1/keys", headers=bearer(token), timeout=HTTP_TIMEOUT,
                          json={"name": "round trip ✓", "scopes": ["infer"], "expires_in": "1h"})
        expect_eq(r.status_code, 201, f"status ({r.text[:300]!r})")
        expect(r.headers.get("content-type", "").startswith("application/json"), "content type")
        k = r.json()
        validate_against(doc, "#/components/schemas/Key", k, "201 body")
        expect_eq((k["name"], k["scopes"], k["owner"]), ("round trip ✓", ["infer"], sub), "name, scopes, owner")
        expect_eq(k["key"][3:19], k["id"], "id inside the key")
        state["key"] = k
        after = gw.metric("portcullis_key_events_total", {"event": "created"})
        expect_eq(after - before, 1.0, "portcullis_key_events_total{event=\"created\"} increase")
        r = requests.get(gw.url + "/v1/infer/v1/models", headers=bearer(k["key"]), timeout=HTTP_TIMEOUT)
        expect_eq(r.status_code, 200, "the new key on the data plane")
        return f"id {k['id']}, owner {sub!r}, accepted by the data plane"
    if not res.check("[live] POST /v1/keys (client_credentials JWT, scopes ⊆ its own) → 201, key works", create):
        return
    key = state["key"]

    def listed():
        r = requests.get(gw.admin + "/v1/keys", headers=bearer(token), timeout=HTTP_TIMEOUT)
        expect_eq(r.status_code, 200, "status")
        validate_against(doc, "#/components/schemas/KeyList", r.json(), "200 body")
        mine = [k for k in r.json()["keys"] if k["id"] == key["id"]]
        expect(len(mine) == 1, f"the new key is not listed once: {r.json()}")
        expect(key["key"].split(".")[1] not in r.text, "the secret appears in the list")
        expect_eq({k["owner"] for k in r.json()["keys"]}, {sub}, "owners a non-admin sees")
        expect_eq(mine[0]["revoked"], None, "revoked")
        r2 = requests.get(gw.admin + "/v1/keys", params={"owner": sub}, headers=bearer(token), timeout=HTTP_TIMEOUT)
        expect_eq((r2.status_code, r2.json()), (200, r.json()), "?owner=<own sub>")
        return f"{len(r.json()['keys'])} key(s)"
    res.check("[live] GET /v1/keys lists the caller's keys, never a secret", listed)

    def refused():
        r = requests.post(gw.admin + "/v1/keys", headers=bearer(token), timeout=HTTP_TIMEOUT,
                          json={"name": "escalate", "scopes": ["infer", "chatx"]})
        expect_eq((r.status_code, r.json().get("error")), (403, "forbidden"), "scope beyond the caller's")
        r = requests.get(gw.admin + "/v1/keys", params={"owner": "someone-else"}, headers=bearer(token),
                         timeout=HTTP_TIMEOUT)
        expect_eq((r.status_code, r.json().get("error")), (403, "forbidden"), "?owner=someone-else as a non-admin")
        r = requests.post(gw.admin + "/v1/keys", headers=bearer(token), timeout=HTTP_TIMEOUT,
                          json={"name": "x" * 20000, "scopes": ["infer"]})
        expect_eq((r.status_code, r.json().get("error")), (413, "payload_too_large"), "a 20 kB body")
        r = requests.post(gw.admin + "/v1/keys", headers=bearer(token), timeout=HTTP_TIMEOUT,
                          json={"name": "x", "scopes": ["infer"], "colour": "red"})
        expect_eq((r.status_code, r.json().get("error")), (400, "bad_request"), "an unknown field")
    res.check("[live] scope escalation and another owner's list → 403; 20 kB body → 413; unknown field → 400",
              refused)

    def revoke():
        before = gw.metric("portcullis_key_events_total", {"event": "revoked"})
        for attempt in ("first", "again (idempotent)"):
            r = requests.delete(gw.admin + f"/v1/keys/{key['id']}", headers=bearer(token), timeout=HTTP_TIMEOUT)
            expect_eq((r.status_code, r.content), (204, b""), f"DELETE {attempt}")
        expect(gw.metric("portcullis_key_events_total", {"event": "revoked"}) > before,
               "portcullis_key_events_total{event=\"revoked\"} did not move")
        r = requests.get(gw.admin + "/v1/keys", headers=bearer(token), timeout=HTTP_TIMEOUT)
        mine = [k for k in r.json()["keys"] if k["id"] == key["id"]]
        expect(mine and mine[0]["revoked"], f"revoked not set in the list: {mine}")
        deadline = time.monotonic() + 5  # cache_ttl_seconds = 1
        while True:
            r = requests.get(gw.url + "/v1/infer/v1/models", headers=bearer(key["key"]), timeout=HTTP_TIMEOUT)
            if r.status_code == 401:
                break
            expect(time.monotonic() < deadline, f"revoked key still gets {r.status_code} on the data plane")
            time.sleep(0.2)
        r = requests.delete(gw.admin + "/v1/keys/ffffffffffffffff", headers=bearer(token), timeout=HTTP_TIMEOUT)
        expect_eq((r.status_code, r.json()), (404, {"error": "not_found"}), "DELETE of an unknown id")
        return "refused by the data plane after revocation"
    res.check("[live] DELETE /v1/keys/{id} → 204 twice; the data plane refuses the key; unknown id → 404", revoke)


def owners_apart(res, gw, doc, cc, admin):
    """What one identity may do to another's keys: what a single-token fuzzer cannot see."""
    cc_sub = jwt_claims(cc)["sub"]

    def apart():
        r = requests.post(gw.admin + "/v1/keys", headers=bearer(admin), timeout=HTTP_TIMEOUT,
                          json={"name": "admin's", "scopes": ["chatx", "chaty"]})
        expect_eq(r.status_code, 201, f"admin creating a key with scopes beyond its own token's ({r.text[:200]!r})")
        theirs = r.json()
        expect_eq(theirs["owner"], jwt_claims(admin)["sub"], "owner")
        r = requests.delete(gw.admin + f"/v1/keys/{theirs['id']}", headers=bearer(cc), timeout=HTTP_TIMEOUT)
        expect_eq((r.status_code, r.json().get("error")), (404, "not_found"), "a non-admin revoking another's key")
        r = requests.get(gw.admin + "/v1/keys", headers=bearer(cc), timeout=HTTP_TIMEOUT)
        expect(all(k["id"] != theirs["id"] for k in r.json()["keys"]), "a non-admin sees another's key")
        r = requests.get(gw.admin + "/v1/keys", headers=bearer(admin), timeout=HTTP_TIMEOUT)
        validate_against(doc, "#/components/schemas/KeyList", r.json(), "admin's list")
        everyone = r.json()["keys"]
        row = [k for k in everyone if k["id"] == theirs["id"]]
        expect(row and row[0]["revoked"] is None, f"the key was revoked by someone else: {row}")
        owners = {k["owner"] for k in everyone}
        expect({cc_sub, theirs["owner"]} <= owners, f"admin's list lacks an owner: {owners}")
        r = requests.get(gw.admin + "/v1/keys", params={"owner": cc_sub}, headers=bearer(admin), timeout=HTTP_TIMEOUT)
        expect_eq((r.status_code, {k["owner"] for k in r.json()["keys"]}), (200, {cc_sub}), "admin's ?owner=<cc>")
        victim = r.json()["keys"][0]["id"]
        r = requests.delete(gw.admin + f"/v1/keys/{victim}", headers=bearer(admin), timeout=HTTP_TIMEOUT)
        expect_eq(r.status_code, 204, "admin revoking another owner's key")
        requests.delete(gw.admin + f"/v1/keys/{theirs['id']}", headers=bearer(admin), timeout=HTTP_TIMEOUT)
        return f"{len(everyone)} keys of {len(owners)} owners"
    res.check("[live] owners apart: a non-admin cannot see or revoke another's key; an admin sees and revokes all",
              apart)

    def capped():
        # Start from none active, then race cap + 10 creates: exactly `cap` may win.
        r = requests.get(gw.admin + "/v1/keys", headers=bearer(cc), timeout=HTTP_TIMEOUT)
        for k in r.json()["keys"]:
            if k["revoked"] is None:
                requests.delete(gw.admin + f"/v1/keys/{k['id']}", headers=bearer(cc), timeout=HTTP_TIMEOUT)
        statuses, made = [], []

        def create(i):
            r = requests.post(gw.admin + "/v1/keys", headers=bearer(cc), timeout=HTTP_TIMEOUT,
                              json={"name": f"race {i}", "scopes": ["infer"]})
            statuses.append(r.status_code)
            if r.status_code == 201:
                made.append(r.json()["id"])
            elif r.status_code == 409:
                validate_against(doc, "#/components/schemas/Error", r.json(), "409 body")
        threads = [threading.Thread(target=create, args=(i,)) for i in range(MAX_KEYS_PER_OWNER + 10)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        for key_id in made:
            requests.delete(gw.admin + f"/v1/keys/{key_id}", headers=bearer(cc), timeout=HTTP_TIMEOUT)
        counts = {s: statuses.count(s) for s in sorted(set(statuses))}
        expect_eq(counts, {201: MAX_KEYS_PER_OWNER, 409: 10}, "statuses of the concurrent creates")
        return f"{counts}"
    res.check(f"[live] {MAX_KEYS_PER_OWNER + 10} concurrent creates with max_keys_per_owner = {MAX_KEYS_PER_OWNER}: "
              f"{MAX_KEYS_PER_OWNER} × 201, 10 × 409", capped)


# ---- schemathesis -------------------------------------------------------------------------------

def schemathesis(res, gw, token, label, tmp, max_examples, seed, doc_file=False):
    slug = re.sub(r"[^a-z0-9]+", "-", label.lower()).strip("-")

    def run():
        exe = os.path.join(os.path.dirname(sys.executable), "schemathesis")
        # The served document (the one a client sees); --doc-file: the working tree's, against
        # the live listener, to try an edit of the document without rebuilding the binary.
        location = [DOC_PATH, "--url", gw.admin] if doc_file else [gw.admin + "/openapi.json"]
        argv = [exe, "--config-file", os.path.join(HERE, "schemathesis.toml"), "run",
                *location, "--header", f"Authorization: Bearer {token}",
                "--checks", "all", "--max-examples", str(max_examples), "--seed", str(seed),
                "--no-color", "--report", "junit",
                "--report-junit-path", os.path.join(tmp, f"schemathesis-{slug}.xml")]
        shown = [a if not a.startswith("Authorization:") else "Authorization: Bearer <token>" for a in argv]
        print(f"      $ {' '.join(shown[1:])}", flush=True)
        t0 = time.monotonic()
        try:
            out = subprocess.run(argv, cwd=tmp, stdin=subprocess.DEVNULL, timeout=SCHEMATHESIS_TIMEOUT,
                                 capture_output=True, text=True)
        except subprocess.TimeoutExpired:
            raise CheckFailed(f"schemathesis did not finish within {SCHEMATHESIS_TIMEOUT}s")
        text = out.stdout + out.stderr
        with open(os.path.join(tmp, f"schemathesis-{slug}.log"), "w") as f:
            f.write(text)
        print("\n".join("      | " + line for line in text.rstrip().splitlines()), flush=True)
        expect(out.returncode == 0, f"schemathesis exited {out.returncode} (seed {seed})")
        summary = [line.strip() for line in text.splitlines() if re.search(r"\b(passed|failed|errors?)\b", line)]
        return f"{time.monotonic() - t0:.0f} s, seed {seed}" + (f"; {summary[-1]}" if summary else "")
    res.check(f"[schemathesis] {label}: no 5xx, every response documented and schema-conformant", run)


# ---- main ---------------------------------------------------------------------------------------

def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--bin", default=os.path.join(ROOT, "target", "debug", "portcullis"))
    ap.add_argument("--upstream", default=os.path.join(ROOT, "target", "debug", "fake-upstream"),
                    help="the fake upstream binary (package testkit)")
    ap.add_argument("--doc-only", action="store_true", help="only validate src/admin/openapi.json")
    ap.add_argument("--max-examples", type=int, default=int(os.environ.get("ADMIN_API_MAX_EXAMPLES", "100")),
                    help="schemathesis test cases per operation and phase (default 100)")
    ap.add_argument("--seed", type=int, default=int(os.environ.get("ADMIN_API_SEED", "0")) or None,
                    help="schemathesis seed (default: random, printed)")
    ap.add_argument("--doc-file", action="store_true",
                    help="fuzz with the working tree's src/admin/openapi.json, not the served one")
    ap.add_argument("--keep", action="store_true", help="keep the temp dir with the logs")
    ap.add_argument("--timeout", type=int, default=600, help="whole-run limit in seconds")
    args = ap.parse_args()

    def on_signal(signum, frame):
        raise SystemExit(f"stopped by signal {signum}")
    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    signal.signal(signal.SIGALRM, lambda *_: on_signal(signal.SIGALRM, None))
    signal.alarm(args.timeout)

    started = time.monotonic()
    res = Results()
    seed = args.seed or secrets.randbelow(2**31 - 1) + 1
    import schemathesis as st  # only for its version
    print(f"schemathesis {st.__version__}, openapi-spec-validator {openapi_spec_validator.__version__}, "
          f"requests {requests.__version__}; seed {seed}",
          flush=True)
    raw, doc = doc_checks(res)
    tmp = None
    if not args.doc_only:
        tmp = tempfile.mkdtemp(prefix="portcullis-admin-api-")
        print(f"logs in {tmp}", flush=True)
        try:
            upstream = Child("upstream", [args.upstream, "--port", "0"],
                             os.path.join(tmp, "upstream.log"), wait_listening=True)
            idp = Idp(tmp)
            gw = Gateway(args.bin, tmp, upstream.port, idp.issuer)
            print(f"upstream :{upstream.port}, provider {idp.issuer}, gateway {gw.url}, admin {gw.admin}", flush=True)
            cc = idp.client_credentials("infer embed")
            served_document(res, gw, raw, doc)
            unauthorized_parity(res, gw, idp)
            unauthorized_on_the_wire(res, gw)
            api_key_refused(res, gw)
            round_trip(res, gw, doc, cc)
            schemathesis(res, gw, cc, "client_credentials token (infer embed, not admin)", tmp,
                         args.max_examples, seed, args.doc_file)
            if idp.has_admin_login:
                admin = {}

                def login():
                    admin["token"] = idp.admin_login()
                    scopes = jwt_claims(admin["token"]).get("scope", "").split()
                    expect(ADMIN_SCOPE in scopes, f"the admin login's token lacks {ADMIN_SCOPE}: {scopes}")
                    return f"sub {jwt_claims(admin['token'])['sub']!r}"
                if res.check(f"[idp] login `admin` gets a token with {ADMIN_SCOPE}", login):
                    owners_apart(res, gw, doc, cc, admin["token"])  # before the fuzzer fills admin's quota
                    schemathesis(res, gw, admin["token"], f"admin token ({ADMIN_SCOPE})", tmp,
                                 args.max_examples, seed, args.doc_file)
            else:
                res.skip("[schemathesis] admin token", "tests/sdk/idp.mjs has no admin login (--console-redirect)")
            res.check("[live] the gateway kept running through the fuzzing",
                      lambda: expect(gw.child.proc.poll() is None, f"it exited with {gw.child.proc.poll()}"))
        except BaseException as e:  # setup failure, timeout or signal: count it, then clean up
            res.failed += 1
            print(f"FAIL  run aborted: {type(e).__name__}: {e}", flush=True)
        finally:
            code = finish(res, tmp, args.keep, started)
    return code


if __name__ == "__main__":
    sys.exit(main())
