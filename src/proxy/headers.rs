//! Header hygiene in both directions (interface.md "Headers").

use std::net::IpAddr;

use http::HeaderValue;
use pingora::http::{RequestHeader, ResponseHeader};

use crate::config::ServiceConfig;

/// Caps on what a client may send in headers: Pingora's own limits (256 headers, about
/// 1 MiB) are far above what any API client needs, and every byte is forwarded upstream.
pub const MAX_HEADERS: usize = 100;
pub const MAX_HEADER_BYTES: usize = 64 * 1024;

/// Whether the request's header block fits the caps.
pub fn within_limits(req: &RequestHeader) -> bool {
    let headers = &req.headers;
    headers.len() <= MAX_HEADERS
        && headers
            .iter()
            .map(|(name, value)| name.as_str().len() + value.len() + 4)
            .sum::<usize>()
            <= MAX_HEADER_BYTES
}

/// Client credentials that must never reach an upstream.
const CLIENT_SECRETS: [&str; 3] = ["authorization", "cookie", "proxy-authorization"];
/// Claims about the client's identity or the original request that only a proxy may make:
/// from a client they are spoofing. `X-Forwarded-For` and `-Proto` are then set by us.
const CLIENT_CLAIMED_IDENTITY: [&str; 4] = [
    "forwarded",
    "x-real-ip",
    "x-forwarded-host",
    "x-forwarded-port",
];
/// Session and challenge headers the gateway never relays: it issues no cookies and
/// speaks only for itself about authentication.
const UPSTREAM_SESSION: [&str; 4] = [
    "set-cookie",
    "set-cookie2",
    "www-authenticate",
    "proxy-authenticate",
];

pub fn to_upstream(
    req: &mut RequestHeader,
    service: &ServiceConfig,
    host: &http::HeaderValue,
    client_ip: Option<IpAddr>,
    client_tls: bool,
    request_id: &str,
) -> pingora::Result<()> {
    for name in CLIENT_SECRETS.iter().chain(&CLIENT_CLAIMED_IDENTITY) {
        req.remove_header(*name);
    }
    req.insert_header("host", host.clone())?;
    match client_ip {
        // A client-sent value is replaced, never appended to: it cannot be trusted.
        Some(ip) => req.insert_header("x-forwarded-for", ip.to_string())?,
        None => {
            req.remove_header("x-forwarded-for");
        }
    }
    let proto = if client_tls { "https" } else { "http" };
    req.insert_header("x-forwarded-proto", HeaderValue::from_static(proto))?;
    req.insert_header("x-request-id", request_id)?;
    for (name, value) in &service.upstream_headers {
        req.insert_header(name.clone(), value.clone())?;
    }
    Ok(())
}

pub fn to_client(resp: &mut ResponseHeader, request_id: &str) -> pingora::Result<()> {
    for name in UPSTREAM_SESSION {
        resp.remove_header(name);
    }
    resp.insert_header("x-request-id", request_id)
}

pub fn is_event_stream(resp: &ResponseHeader) -> bool {
    resp.headers
        .get(http::header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| {
            v.trim_start()
                .get(..17)
                .is_some_and(|t| t.eq_ignore_ascii_case("text/event-stream"))
        })
}
