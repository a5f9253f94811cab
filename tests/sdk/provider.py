"""The real OpenID provider (tests/sdk/idp.mjs, oidc-provider) and the gateway's checks against
it: the provider started and restarted (fresh signing keys each time), tokens from its
client_credentials grant and its authorization-code flow with PKCE (driven headless through its
login and consent pages), those tokens accepted or refused by scope, audience, type and
signature, and a key rotation picked up without a gateway restart."""
import base64
import hashlib
import html
import http.cookiejar
import json
import os
import re
import secrets
import time
import urllib.parse

from harness import CheckFailed, Child, expect, expect_eq
from plain_http import basic_auth, http_call, http_opener, jwt_parts
from sdk_checks import EMB_MODEL, SERVICES, echo, expect_unauthorized

SDK_DIR = os.path.dirname(os.path.abspath(__file__))
AUDIENCE = "urn:portcullis:test"          # the resource indicator = the gateway's audience
OTHER_AUDIENCE = "urn:portcullis:other"   # a resource server that is not the gateway
REDIRECT_URI = "http://127.0.0.1/callback"  # registered for the `console` client in idp.mjs
CC_CLIENT = ("svc-cc", "svc-cc-test-secret")
CODE_CLIENT = ("console", "console-test-secret")
ROTATION_WINDOW = 15    # seconds a new kid may take to be accepted (gateway unknown-kid cooldown is 10 s)


class Idp:
    def __init__(self, tmp):
        self.tmp, self.child, self.port = tmp, None, 0

    def start(self):
        """Starts (or restarts, on the same port) the provider: fresh signing keys each time."""
        self.child = Child("idp", ["node", os.path.join(SDK_DIR, "idp.mjs"), "--port", str(self.port),
                                   "--audience", AUDIENCE, "--other-audience", OTHER_AUDIENCE],
                           os.path.join(self.tmp, "idp.log"), wait_listening=True)
        self.port = self.child.port

    @property
    def issuer(self):
        return f"http://127.0.0.1:{self.port}"

    def stop(self):
        if self.child:
            self.child.stop()

    def client_credentials(self, scope, resource=AUDIENCE):
        status, _, body = http_call(
            f"{self.issuer}/token", "POST",
            {"grant_type": "client_credentials", "scope": scope, "resource": resource},
            {"Authorization": basic_auth(CC_CLIENT)})
        expect(status == 200, f"client_credentials token request: {status} {body[:300]!r}")
        return json.loads(body)

    def authorization_code(self, scope):
        """The authorization-code flow with PKCE, driven headless through oidc-provider's
        devInteractions login and consent pages with a cookie jar, as a browser would.
        Returns the token endpoint's JSON (access_token, id_token, ...)."""
        opener = http_opener(http.cookiejar.CookieJar())
        verifier = secrets.token_urlsafe(48)
        challenge = base64.urlsafe_b64encode(hashlib.sha256(verifier.encode()).digest()).rstrip(b"=").decode()
        state, nonce = secrets.token_urlsafe(16), secrets.token_urlsafe(16)
        url = f"{self.issuer}/auth?" + urllib.parse.urlencode({
            "client_id": CODE_CLIENT[0], "response_type": "code", "redirect_uri": REDIRECT_URI,
            "scope": scope, "resource": AUDIENCE, "state": state, "nonce": nonce,
            "code_challenge": challenge, "code_challenge_method": "S256"})
        method, form, code, prompts = "GET", None, None, []
        for _ in range(12):
            status, headers, body = http_call(url, method, form, opener=opener)
            method, form = "GET", None
            if status in (301, 302, 303, 307):
                nxt = urllib.parse.urljoin(url, headers["Location"])
                if nxt.startswith(REDIRECT_URI):
                    q = urllib.parse.parse_qs(urllib.parse.urlsplit(nxt).query)
                    expect("error" not in q, f"authorization error: {q}")
                    expect_eq(q.get("state"), [state], "state returned to the client")
                    code = q["code"][0]
                    break
                url = nxt
                continue
            page = body.decode("utf-8", "replace")
            action = re.search(r'<form[^>]*action="([^"]+)"[^>]*method="post"', page)
            prompt = re.search(r'name="prompt" value="(\w+)"', page)
            expect(status == 200 and action and prompt,
                   f"unexpected page in the login flow at {url}: {status} {page[:300]!r}")
            prompts.append(prompt.group(1))
            url, method = urllib.parse.urljoin(url, html.unescape(action.group(1))), "POST"
            form = {"prompt": prompt.group(1)}
            if prompt.group(1) == "login":
                form.update(login="alice", password="any")
        expect(code, f"no authorization code after the steps {prompts}")
        expect_eq(prompts, ["login", "consent"], "interaction prompts shown")
        status, _, body = http_call(
            f"{self.issuer}/token", "POST",
            {"grant_type": "authorization_code", "code": code, "redirect_uri": REDIRECT_URI,
             "code_verifier": verifier, "resource": AUDIENCE},
            {"Authorization": basic_auth(CODE_CLIENT)})
        expect(status == 200, f"code exchange: {status} {body[:300]!r}")
        return json.loads(body)


def idp_checks(res, gw, idp):
    """The gateway against the real provider. Returns the authorization-code access token."""
    tokens = {}

    def discovery():
        status, _, body = http_call(idp.issuer + "/.well-known/openid-configuration")
        doc = json.loads(body)
        expect_eq((status, doc.get("issuer")), (200, idp.issuer), "discovery issuer")
        return f"jwks_uri {doc['jwks_uri']}"
    res.check("[idp] discovery document names the issuer the gateway was given", discovery)

    def cc_token():
        t = idp.client_credentials("infer embed")
        header, claims = jwt_parts(t["access_token"])
        expect_eq(header.get("typ"), "at+jwt", "typ (RFC 9068)")
        expect_eq(header.get("alg"), "RS256", "alg")
        expect(header.get("kid"), "no kid")
        expect_eq((claims.get("iss"), claims.get("aud")), (idp.issuer, AUDIENCE), "iss, aud")
        expect_eq(claims.get("scope"), "infer embed", "scope")
        expect(claims.get("sub"), f"no sub in a client_credentials token: {claims}")
        tokens["cc"] = t["access_token"]
        return f"sub={claims['sub']!r} client_id={claims.get('client_id')!r} kid={header['kid']}"
    if not res.check("[idp] client_credentials grant issues an RFC 9068 JWT access token", cc_token):
        return None

    cc = tokens["cc"]
    for service in ("infer", "embed"):
        def allowed(service=service):
            if service == "embed":
                status, _, body = gw.post_json("embed", "/v1/embeddings", cc, {"model": EMB_MODEL, "input": "x"})
                expect_eq(status, 200, f"status ({body[:200]!r})")
                expect_eq(len(json.loads(body)["data"][0]["embedding"]), 1024, "dimensions")
            else:
                status, _, body = gw.post_json(service, "/v1/chat/completions", cc,
                                               {"messages": [{"role": "user", "content": "hi"}]})
                expect_eq(status, 200, f"status ({body[:200]!r})")
                expect_eq(json.loads(body)["choices"][0]["message"]["content"], echo("hi"), "answer")
        res.check(f"[idp] client_credentials token (scope infer embed) accepted on {service}", allowed)
    for service in ("chatx", "chaty"):
        def refused(service=service):
            status, _, body = gw.post_json(service, "/v1/chat/completions", cc,
                                           {"messages": [{"role": "user", "content": "hi"}]})
            expect_eq(status, 403, f"status ({body[:200]!r})")
            expect_eq(json.loads(body).get("error"), "forbidden", "error")
        res.check(f"[idp] client_credentials token refused with 403 on {service}", refused)

    def other_audience():
        t = idp.client_credentials("infer embed", resource=OTHER_AUDIENCE)["access_token"]
        expect_eq(jwt_parts(t)[1]["aud"], OTHER_AUDIENCE, "aud of the other resource's token")
        status, headers, body = gw.get("infer", "/v1/models", t)
        expect_eq((status, json.loads(body)), (401, {"error": "unauthorized"}), "response")
    res.check("[idp] a well-signed token for another audience is refused with 401", other_audience)

    def auth_code():
        t = idp.authorization_code("openid infer chatx chaty embed")
        at, idt = t.get("access_token"), t.get("id_token")
        expect(at and idt, f"token response lacks access_token or id_token: {sorted(t)}")
        header, claims = jwt_parts(at)
        expect_eq((header.get("typ"), claims.get("sub"), claims.get("aud")), ("at+jwt", "alice", AUDIENCE),
                  "access token typ, sub, aud")
        for service in SERVICES:
            path = "/v1/embeddings" if service == "embed" else "/v1/chat/completions"
            body = {"model": EMB_MODEL, "input": "x"} if service == "embed" else \
                {"messages": [{"role": "user", "content": "hi"}]}
            status, _, resp = gw.post_json(service, path, at, body)
            expect_eq(status, 200, f"{service} status ({resp[:200]!r})")
        tokens["code"], tokens["id"] = at, idt
        return f"scope {claims.get('scope')!r}"
    res.check("[idp] authorization-code flow (headless login + consent) token accepted on all four services",
              auth_code)

    def id_token():
        expect("id" in tokens, "no ID token (the authorization-code check failed)")
        header, claims = jwt_parts(tokens["id"])
        status, headers, body = gw.get("infer", "/v1/models", tokens["id"])
        expect_eq((status, json.loads(body)), (401, {"error": "unauthorized"}), "response")
        expect_eq(headers.get("WWW-Authenticate"), "Bearer", "WWW-Authenticate")
        same_kid = header.get("kid") == jwt_parts(tokens["code"])[0].get("kid")
        return (f"typ={header.get('typ')!r} aud={claims.get('aud')!r} sub={claims.get('sub')!r}, "
                f"{'same' if same_kid else 'other'} kid as the access token")
    res.check("[idp] the provider's ID token is refused with 401", id_token)

    def tampered():
        h, p, s = cc.split(".")
        forged_claims = dict(jwt_parts(cc)[1], scope="infer chatx chaty embed")
        p2 = base64.urlsafe_b64encode(json.dumps(forged_claims).encode()).rstrip(b"=").decode()
        return expect_unauthorized(lambda: gw.sdk("chatx", f"{h}.{p2}.{s}").models.list(), "a token with a forged scope")
    res.check("[py] a JWT whose claims were altered (scope widened) raises AuthenticationError", tampered)
    return tokens.get("code"), tokens.get("cc")


def rotation_check(res, gw, idp):
    def rotate():
        old_kid = jwt_parts(idp.client_credentials("infer")["access_token"])[0]["kid"]
        port = idp.port
        idp.stop()
        idp.start()  # same port, fresh signing key
        expect_eq(idp.port, port, "provider port after restart")
        new = idp.client_credentials("infer")["access_token"]
        new_kid = jwt_parts(new)[0]["kid"]
        expect(new_kid != old_kid, f"the restarted provider signs with the same kid {new_kid}")
        t0 = time.monotonic()
        last = None
        while time.monotonic() - t0 < ROTATION_WINDOW:
            status, _, body = gw.post_json("infer", "/v1/chat/completions", new,
                                           {"messages": [{"role": "user", "content": "rotated"}]})
            if status == 200:
                return f"new kid accepted after {time.monotonic() - t0:.2f} s, gateway not restarted"
            last = (status, body[:200])
            time.sleep(0.25)
        raise CheckFailed(f"token with the new kid still refused after {ROTATION_WINDOW} s: {last}")
    res.check("[idp] provider restarted on the same port with new signing keys: new kid accepted", rotate)
    res.check("[idp] the gateway kept running through the provider restart (same process)",
              lambda: expect(gw.child.proc.poll() is None, "the gateway exited"))
