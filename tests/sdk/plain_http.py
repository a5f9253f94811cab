"""Plain HTTP for the SDK suite, where no SDK may smooth things over: the provider's endpoints
(every redirect surfaced, so each step of the login flow is explicit), exact status checks on
the gateway, Basic auth and a JWT's decoded parts."""
import base64
import json
import urllib.error
import urllib.parse
import urllib.request

HTTP_TIMEOUT = 20


class _NoRedirect(urllib.request.HTTPRedirectHandler):
    def redirect_request(self, *args, **kwargs):
        return None  # surface every 3xx, so each step of the login flow is explicit


def http_opener(jar=None):
    handlers = [_NoRedirect()]
    if jar is not None:
        handlers.append(urllib.request.HTTPCookieProcessor(jar))
    return urllib.request.build_opener(*handlers)


def http_call(url, method="GET", body=None, headers=None, opener=None):
    """(status, headers, body bytes) for any status; never follows redirects."""
    data = None
    headers = dict(headers or {})
    if isinstance(body, dict):
        data = urllib.parse.urlencode(body).encode()
        headers.setdefault("Content-Type", "application/x-www-form-urlencoded")
    elif isinstance(body, (bytes, str)):
        data = body.encode() if isinstance(body, str) else body
    req = urllib.request.Request(url, data=data, method=method, headers=headers)
    try:
        with (opener or http_opener()).open(req, timeout=HTTP_TIMEOUT) as r:
            return r.status, r.headers, r.read()
    except urllib.error.HTTPError as e:
        return e.code, e.headers, e.read()


def basic_auth(client):
    return "Basic " + base64.b64encode(f"{client[0]}:{client[1]}".encode()).decode()


def jwt_parts(token):
    def seg(s):
        return json.loads(base64.urlsafe_b64decode(s + "=" * (-len(s) % 4)))
    h, p, _ = token.split(".")
    return seg(h), seg(p)
