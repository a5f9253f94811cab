"""Hand-written checks against a live admin listener: what a single-token fuzzer cannot see
(the 401 against the data plane's, byte for byte; API keys refused; owners apart; the key
limit under concurrent creates; the list in pages; budgets of keys and owners; the 429 over
requests_per_minute). Used by
tests/admin_api/run.py, which starts the listener."""
import base64
import json
import re
import socket
import threading
import time

import requests

from doc import leaves, validate_against
from harness import CheckFailed, expect, expect_eq  # tests/harness.py, on the path run.py sets

OTHER_AUDIENCE = "urn:portcullis:other"            # idp.mjs's second resource server: not the gateway
MAX_KEYS_PER_OWNER = 25   # low, so the fuzzer's admin run reaches 409 conflict
LIMITED_REQUESTS_PER_MINUTE = 3        # the rate-limited gateway's: mostly 429s
HTTP_TIMEOUT = 20


def jwt_claims(token):
    p = token.split(".")[1]
    return json.loads(base64.urlsafe_b64decode(p + "=" * (-len(p) % 4)))



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


def pages(res, gw, doc, token):
    """The list in pages: each page a KeyList of at most `limit`, every key once, and a
    malformed `limit` or `cursor` refused with the documented 400."""
    def walk():
        made = []
        for i in range(5):
            r = requests.post(gw.admin + "/v1/keys", headers=bearer(token), timeout=HTTP_TIMEOUT,
                              json={"name": f"page {i}", "scopes": ["infer"]})
            expect_eq(r.status_code, 201, f"create {i} ({r.text[:200]!r})")
            made.append(r.json()["id"])
        seen, cursor, n = [], None, 0
        while True:
            params = {"limit": 2, **({"cursor": cursor} if cursor else {})}
            r = requests.get(gw.admin + "/v1/keys", params=params, headers=bearer(token), timeout=HTTP_TIMEOUT)
            expect_eq(r.status_code, 200, f"page {n + 1}")
            validate_against(doc, "#/components/schemas/KeyList", r.json(), f"page {n + 1}")
            expect(len(r.json()["keys"]) <= 2, f"page {n + 1} holds {len(r.json()['keys'])} keys")
            seen += [k["id"] for k in r.json()["keys"]]
            n += 1
            cursor = r.json()["next"]
            if cursor is None:
                break
            expect(n < 100, "no end to the pages")
        expect_eq(len(seen), len(set(seen)), "keys listed twice")
        expect(set(made) <= set(seen), f"keys missing from the pages: {set(made) - set(seen)}")
        for k in made:
            requests.delete(gw.admin + f"/v1/keys/{k}", headers=bearer(token), timeout=HTTP_TIMEOUT)
        for params in ({"cursor": "not-a-cursor"}, {"limit": "0"}, {"limit": "many"}):
            r = requests.get(gw.admin + "/v1/keys", params=params, headers=bearer(token), timeout=HTTP_TIMEOUT)
            expect_eq(r.status_code, 400, f"{params}")
            validate_against(doc, "#/components/schemas/Error", r.json(), f"{params}: 400 body")
            expect_eq(r.json()["error"], "bad_request", f"{params}: error")
        return f"{len(seen)} keys in {n} pages of 2"
    res.check("[live] GET /v1/keys in pages: every key once, at most `limit` a page; bad limit or cursor → 400",
              walk)


def usage(res, gw, doc, token):
    """GET /v1/usage: the data-plane call of `round_trip` is in the caller's ledger within a
    flush (1 s), every row a UsageRow of the caller; bad parameters 400, another owner 403."""
    def report():
        sub = jwt_claims(token)["sub"]
        deadline, rows = time.monotonic() + 5, []
        while time.monotonic() < deadline:
            r = requests.get(gw.admin + "/v1/usage", params={"group_by": "key,service"},
                             headers=bearer(token), timeout=HTTP_TIMEOUT)
            expect_eq(r.status_code, 200, f"GET /v1/usage ({r.text[:200]!r})")
            validate_against(doc, "#/components/schemas/UsageReport", r.json(), "usage report")
            rows = r.json()["usage"]
            if sum(row["requests"] for row in rows) >= 1:
                break
            time.sleep(0.2)
        expect(rows, "the data-plane call never reached the ledger")
        expect(all(row["owner"] == sub for row in rows), f"rows of another owner: {rows}")
        expect(all(set(row) >= {"key", "service"} and "day" not in row for row in rows), f"grouping: {rows}")
        # Paged like GET /v1/keys: a page of one row at a time, following `next`, gives the
        # rows of one page of up to 1000, in the same order.
        whole = requests.get(gw.admin + "/v1/usage", params={"limit": "1000"}, headers=bearer(token),
                             timeout=HTTP_TIMEOUT).json()
        expect(whole["next"] is None, f"one page holds it all: {whole}")
        paged, cursor = [], None
        while True:
            params = {"limit": "1"} | ({"cursor": cursor} if cursor else {})
            page = requests.get(gw.admin + "/v1/usage", params=params, headers=bearer(token), timeout=HTTP_TIMEOUT)
            expect_eq(page.status_code, 200, f"page after {cursor}")
            validate_against(doc, "#/components/schemas/UsageReport", page.json(), "usage page")
            expect(len(page.json()["usage"]) <= 1, f"over the limit: {page.json()}")
            paged += page.json()["usage"]
            cursor = page.json()["next"]
            if cursor is None:
                break
        expect_eq(paged, whole["usage"], "the pages, one after the other")
        for params, status in (({"from": "2026-02-30"}, 400), ({"group_by": "user"}, 400),
                               ({"from": "2026-03-02", "to": "2026-03-01"}, 400), ({"owner": sub + "-other"}, 403),
                               ({"limit": "0"}, 400), ({"cursor": "not-a-cursor"}, 400)):
            r = requests.get(gw.admin + "/v1/usage", params=params, headers=bearer(token), timeout=HTTP_TIMEOUT)
            expect_eq(r.status_code, status, f"{params}")
            validate_against(doc, "#/components/schemas/Error", r.json(), f"{params}: body")
        return f"{sum(row['requests'] for row in rows)} request(s) of {sub!r}, {len(paged)} row(s) paged one by one"
    res.check("[live] GET /v1/usage shows the caller's own data-plane calls, in pages; bad parameters → 400, "
              "another owner → 403",
              report)


def budgets(res, gw, doc, token):
    """Budgets a non-admin caller manages: its own keys' (POST and PATCH, each response a
    documented shape), its own owner budget read but never set, another owner's refused, and
    every malformed budget refused with a 400 naming the member."""
    sub = jwt_claims(token)["sub"]
    own = gw.admin + f"/v1/owners/{requests.utils.quote(sub, safe='')}/budget"

    def keys():
        before = gw.metric("portcullis_key_events_total", {"event": "budget"})
        r = requests.post(gw.admin + "/v1/keys", headers=bearer(token), timeout=HTTP_TIMEOUT,
                          json={"name": "budgeted", "scopes": ["infer"], "budget": {"tokens_per_day": 1000}})
        expect_eq(r.status_code, 201, f"create with a budget ({r.text[:200]!r})")
        validate_against(doc, "#/components/schemas/Key", r.json(), "201 body")
        expect_eq(r.json()["budget"], {"tokens_per_day": 1000}, "budget of the new key")
        key_id = r.json()["id"]
        path = gw.admin + f"/v1/keys/{key_id}"
        try:
            r = requests.patch(path, headers=bearer(token), timeout=HTTP_TIMEOUT,
                               json={"budget": {"tokens_per_hour": 50, "requests_per_day": 10}})
            expect_eq(r.status_code, 200, f"PATCH ({r.text[:200]!r})")
            validate_against(doc, "#/components/schemas/KeyInfo", r.json(), "PATCH 200 body")
            expect_eq((r.json()["budget"], r.json()["used"]),
                      ({"tokens_per_hour": 50, "requests_per_day": 10}, {"tokens_per_hour": 0, "requests_per_day": 0}),
                      "budget and used after PATCH")
            r = requests.get(gw.admin + "/v1/keys", headers=bearer(token), timeout=HTTP_TIMEOUT)
            validate_against(doc, "#/components/schemas/KeyList", r.json(), "list")
            listed = [k for k in r.json()["keys"] if k["id"] == key_id]
            expect(listed and listed[0]["budget"] == {"tokens_per_hour": 50, "requests_per_day": 10},
                   f"the listing's budget: {listed}")
            for body, member in (({"budget": {"tokens_per_week": 1}}, "tokens_per_week"),
                                 ({"budget": {"tokens_per_day": -1}}, "budget.tokens_per_day"),
                                 ({"budget": {"tokens_per_day": "5"}}, "budget.tokens_per_day"),
                                 ({"budget": [1]}, "budget"), ({}, "budget")):
                r = requests.patch(path, headers=bearer(token), timeout=HTTP_TIMEOUT, json=body)
                expect_eq(r.status_code, 400, f"PATCH {body}")
                validate_against(doc, "#/components/schemas/Error", r.json(), f"PATCH {body}: body")
                expect(member in r.json().get("message", ""), f"PATCH {body}: message {r.json()}")
            r = requests.patch(path, headers={**bearer(token), "content-type": "application/json"},
                               timeout=HTTP_TIMEOUT, data=b'{"budget":{"tokens_per_day":1,"tokens_per_day":2}}')
            expect_eq((r.status_code, r.json().get("message")), (400, "budget.tokens_per_day is given twice"),
                      "a member given twice")
            r = requests.patch(path, headers=bearer(token), timeout=HTTP_TIMEOUT, json={"budget": None})
            expect_eq((r.status_code, r.json()["budget"], r.json()["used"]), (200, None, None), "PATCH null")
            r = requests.patch(gw.admin + "/v1/keys/ffffffffffffffff", headers=bearer(token),
                               timeout=HTTP_TIMEOUT, json={"budget": None})
            expect_eq((r.status_code, r.json()), (404, {"error": "not_found"}), "PATCH of an unknown id")
        finally:
            requests.delete(path, headers=bearer(token), timeout=HTTP_TIMEOUT)
        r = requests.patch(path, headers=bearer(token), timeout=HTTP_TIMEOUT, json={"budget": None})
        expect_eq((r.status_code, r.json().get("error")), (404, "not_found"), "PATCH of a revoked key")
        after = gw.metric("portcullis_key_events_total", {"event": "budget"})
        expect_eq(after - before, 2.0, "portcullis_key_events_total{event=\"budget\"} increase")
        return f"key {key_id}: created with a budget, set, refused 6 bad bodies, cleared"
    res.check("[live] POST /v1/keys with a budget → 201; PATCH /v1/keys/{id} → 200, bad budgets → 400 naming "
              "the member, unknown or revoked id → 404", keys)

    def owners():
        r = requests.get(own, headers=bearer(token), timeout=HTTP_TIMEOUT)
        expect_eq(r.status_code, 200, f"GET own budget ({r.text[:200]!r})")
        validate_against(doc, "#/components/schemas/OwnerBudget", r.json(), "own budget")
        mine = r.json()["budget"]
        r = requests.get(gw.admin + "/v1/owners/someone-else/budget", headers=bearer(token), timeout=HTTP_TIMEOUT)
        expect_eq((r.status_code, r.json().get("error")), (403, "forbidden"), "GET another owner's budget")
        r = requests.put(own, headers=bearer(token), timeout=HTTP_TIMEOUT, json={"budget": {"tokens_per_day": 1}})
        expect_eq((r.status_code, r.json().get("error")), (403, "forbidden"), "PUT own budget as a non-admin")
        validate_against(doc, "#/components/schemas/Error", r.json(), "403 body")
        return f"{sub!r}'s budget: {mine}"
    res.check("[live] GET /v1/owners/{own sub}/budget → 200; another owner's → 403; PUT as a non-admin → 403",
              owners)


def budgets_admin(res, gw, doc, token, admin):
    """What an administrator does to another owner's budgets: sets the owner's, after which the
    owner cannot give a key more; sets the owner's key above it itself; clears it again."""
    sub = jwt_claims(token)["sub"]
    own = gw.admin + f"/v1/owners/{requests.utils.quote(sub, safe='')}/budget"

    def capped():
        r = requests.put(own, headers=bearer(admin), timeout=HTTP_TIMEOUT, json={"budget": {"tokens_per_day": 1000}})
        expect_eq(r.status_code, 200, f"admin PUT ({r.text[:200]!r})")
        validate_against(doc, "#/components/schemas/OwnerBudget", r.json(), "PUT 200 body")
        key_id = None
        try:
            r = requests.get(own, headers=bearer(token), timeout=HTTP_TIMEOUT)
            expect_eq(r.json()["budget"], {"tokens_per_day": 1000}, "the owner reads its budget")
            r = requests.post(gw.admin + "/v1/keys", headers=bearer(token), timeout=HTTP_TIMEOUT,
                              json={"name": "over", "scopes": ["infer"], "budget": {"tokens_per_day": 1001}})
            expect_eq(r.status_code, 403, f"create above the owner's budget ({r.text[:200]!r})")
            expect("tokens_per_day" in r.json().get("message", ""), f"message {r.json()}")
            r = requests.post(gw.admin + "/v1/keys", headers=bearer(token), timeout=HTTP_TIMEOUT,
                              json={"name": "within", "scopes": ["infer"], "budget": {"tokens_per_day": 1000}})
            expect_eq(r.status_code, 201, f"create within the owner's budget ({r.text[:200]!r})")
            key_id = r.json()["id"]
            path = gw.admin + f"/v1/keys/{key_id}"
            r = requests.patch(path, headers=bearer(token), timeout=HTTP_TIMEOUT,
                               json={"budget": {"tokens_per_day": 2000}})
            expect_eq(r.status_code, 403, "the owner raising its key above its budget")
            r = requests.patch(path, headers=bearer(admin), timeout=HTTP_TIMEOUT,
                               json={"budget": {"tokens_per_day": 2000}})
            expect_eq((r.status_code, r.json().get("budget")), (200, {"tokens_per_day": 2000}),
                      "the administrator raising it")
        finally:
            if key_id:
                requests.delete(gw.admin + f"/v1/keys/{key_id}", headers=bearer(token), timeout=HTTP_TIMEOUT)
            r = requests.put(own, headers=bearer(admin), timeout=HTTP_TIMEOUT, json={"budget": None})
        expect_eq((r.status_code, r.json()["budget"]), (200, None), "admin clearing it")
        return f"owner {sub!r} capped at 1000 tokens a day, then cleared"
    res.check("[live] admin PUT /v1/owners/{sub}/budget; the owner's keys stay within it (403 above), the admin "
              "may set more", capped)


def rate_limited(res, gw, doc, token):
    """Over requests_per_minute: the documented 429, with Retry-After."""
    def limited():
        for i in range(2 * LIMITED_REQUESTS_PER_MINUTE + 1):
            r = requests.get(gw.admin + "/v1/keys", headers=bearer(token), timeout=HTTP_TIMEOUT)
            if r.status_code == 429:
                break
            expect_eq(r.status_code, 200, f"request {i + 1}")
        expect_eq(r.status_code, 429, f"after {2 * LIMITED_REQUESTS_PER_MINUTE + 1} requests")
        validate_against(doc, "#/components/schemas/Error", r.json(), "429 body")
        expect_eq(r.json()["error"], "rate_limited", "error")
        retry = r.headers.get("Retry-After", "")
        expect(re.fullmatch(r"[1-9][0-9]?", retry) and int(retry) <= 60, f"Retry-After {retry!r}")
        return f"429 after {i} requests, Retry-After {retry}"
    res.check(f"[live] requests_per_minute = {LIMITED_REQUESTS_PER_MINUTE}: then 429 rate_limited with Retry-After",
              limited)


