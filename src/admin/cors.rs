//! CORS for the console's browser calls: only the configured origins, never `*`, never
//! credentials (the API takes a bearer token, not cookies).

use pingora::http::RequestHeader;

use super::reply::Reply;

/// The request headers a browser may send cross-origin.
const ALLOWED_HEADERS: &str = "authorization, content-type, x-request-id";
/// How long a browser may cache a preflight answer.
const MAX_AGE_SECONDS: &str = "600";

/// The request's `Origin`, when it is one of `allowed` (compared case-insensitively, as
/// scheme and host are). `allowed` holds lower-case origins (see `config::admin`).
pub(crate) fn allowed_origin<'a>(allowed: &[String], req: &'a RequestHeader) -> Option<&'a str> {
    let origin = req.headers.get(http::header::ORIGIN)?.to_str().ok()?;
    allowed
        .iter()
        .any(|a| a.eq_ignore_ascii_case(origin))
        .then_some(origin)
}

/// The answer to an `OPTIONS` request. From an allowed origin asking for a method the route
/// answers: the methods and headers it may use. Otherwise a plain answer with no CORS headers,
/// so the browser refuses the call.
pub(crate) fn preflight(allowed: &[String], req: &RequestHeader, methods: &'static str) -> Reply {
    let reply = Reply::no_content().header("allow", methods);
    let asked = req
        .headers
        .get(http::header::ACCESS_CONTROL_REQUEST_METHOD)
        .and_then(|v| v.to_str().ok());
    let method_ok = asked.is_some_and(|m| methods.split(", ").any(|x| x == m));
    if allowed_origin(allowed, req).is_none() || !method_ok {
        return reply;
    }
    reply
        .header("access-control-allow-methods", methods)
        .header("access-control-allow-headers", ALLOWED_HEADERS)
        .header("access-control-max-age", MAX_AGE_SECONDS)
}
