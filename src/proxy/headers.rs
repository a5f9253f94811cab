//! Header hygiene in both directions (the header rules of docs/reference.md).

use std::net::IpAddr;

use http::header::{self, HeaderName};
use http::HeaderValue;
use pingora::http::{RequestHeader, ResponseHeader};

use crate::config::ServiceConfig;

/// Caps on what a client may send in headers: Pingora's own limits (256 headers, about
/// 1 MiB) are far above what any API client needs, and every byte is forwarded upstream.
pub(crate) const MAX_HEADERS: usize = 100;
pub(crate) const MAX_HEADER_BYTES: usize = 64 * 1024;

/// Whether the request's header block fits the caps.
pub(crate) fn within_limits(req: &RequestHeader) -> bool {
    let headers = &req.headers;
    headers.len() <= MAX_HEADERS
        && headers
            .iter()
            .map(|(name, value)| name.as_str().len() + value.len() + 4)
            .sum::<usize>()
            <= MAX_HEADER_BYTES
}

/// `X-Request-Id`, parsed once: a name given as a string is parsed again on every use. Statics,
/// not consts: a const array of names would be built and dropped at every use.
pub(crate) static X_REQUEST_ID: HeaderName = HeaderName::from_static("x-request-id");
/// `X-Session-Id`: the affinity key of a `prefix_affinity` service when sent.
pub(crate) static X_SESSION_ID: HeaderName = HeaderName::from_static("x-session-id");
static X_FORWARDED_FOR: HeaderName = HeaderName::from_static("x-forwarded-for");

/// Never forwarded upstream. The client's credentials, then claims about the client's
/// identity or the original request that only a proxy may make: from a client they are
/// spoofing. `X-Forwarded-For` and `-Proto` are then set by us. Last, the key headers of
/// Anthropic's API and Azure OpenAI: the gateway reads neither, and an agent configured with
/// a provider's real key would otherwise hand it to whatever upstream this is.
static NOT_TO_UPSTREAM: [HeaderName; 9] = [
    header::AUTHORIZATION,
    header::COOKIE,
    header::PROXY_AUTHORIZATION,
    header::FORWARDED,
    HeaderName::from_static("x-real-ip"),
    HeaderName::from_static("x-forwarded-host"),
    HeaderName::from_static("x-forwarded-port"),
    HeaderName::from_static("x-api-key"),
    HeaderName::from_static("api-key"),
];
/// Session and challenge headers the gateway never relays: it issues no cookies and
/// speaks only for itself about authentication.
static NOT_TO_CLIENT: [HeaderName; 4] = [
    header::SET_COOKIE,
    HeaderName::from_static("set-cookie2"),
    header::WWW_AUTHENTICATE,
    header::PROXY_AUTHENTICATE,
];

/// Which of `names` occur in `headers`, as a bit mask: one pass over the few headers a request
/// carries instead of a hash lookup for each name, most of which are absent.
fn present(headers: &http::HeaderMap, names: &[HeaderName]) -> u32 {
    let mut found = 0;
    for name in headers.keys() {
        if let Some(i) = names.iter().position(|n| n == name) {
            found |= 1 << i;
        }
    }
    found
}

pub(crate) fn to_upstream(
    req: &mut RequestHeader,
    service: &ServiceConfig,
    host: &HeaderValue,
    client_ip: Option<IpAddr>,
    client_tls: bool,
    request_id: &str,
) -> pingora::Result<()> {
    let found = present(&req.headers, &NOT_TO_UPSTREAM);
    for (i, name) in NOT_TO_UPSTREAM.iter().enumerate() {
        if found & (1 << i) != 0 {
            req.remove_header(name);
        }
    }
    req.insert_header("host", host.clone())?;
    match client_ip {
        // A client-sent value is replaced, never appended to: it cannot be trusted.
        Some(ip) => req.insert_header("x-forwarded-for", ip_value(ip))?,
        None => {
            req.remove_header(&X_FORWARDED_FOR);
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

pub(crate) fn to_client(resp: &mut ResponseHeader, request_id: &str) -> pingora::Result<()> {
    let found = present(&resp.headers, &NOT_TO_CLIENT);
    for (i, name) in NOT_TO_CLIENT.iter().enumerate() {
        if found & (1 << i) != 0 {
            resp.remove_header(name);
        }
    }
    resp.insert_header("x-request-id", request_id)
}

/// An address as a header value, IPv4 without the formatting machinery (a tenth of the cost).
fn ip_value(ip: IpAddr) -> HeaderValue {
    let IpAddr::V4(v4) = ip else {
        return HeaderValue::from_str(&ip.to_string()).expect("an address is a valid value");
    };
    let mut buf = [0u8; 15];
    let mut len = 0;
    for (i, octet) in v4.octets().into_iter().enumerate() {
        if i > 0 {
            buf[len] = b'.';
            len += 1;
        }
        let digits = [octet / 100, octet / 10 % 10, octet % 10];
        let skip = if octet >= 100 {
            0
        } else if octet >= 10 {
            1
        } else {
            2
        };
        for d in &digits[skip..] {
            buf[len] = b'0' + d;
            len += 1;
        }
    }
    HeaderValue::from_bytes(&buf[..len]).expect("digits and dots are a valid value")
}

pub(crate) fn is_event_stream(resp: &ResponseHeader) -> bool {
    resp.headers
        .get(http::header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| {
            v.trim_start()
                .get(..17)
                .is_some_and(|t| t.eq_ignore_ascii_case("text/event-stream"))
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn formats_addresses_as_std_does() {
        for ip in [
            "0.0.0.0",
            "1.2.3.4",
            "10.20.30.40",
            "100.200.255.9",
            "255.255.255.255",
        ] {
            let ip: IpAddr = ip.parse().unwrap();
            assert_eq!(ip_value(ip).to_str().unwrap(), ip.to_string());
        }
        let v6: IpAddr = "2001:db8::1".parse().unwrap();
        assert_eq!(ip_value(v6).to_str().unwrap(), "2001:db8::1");
    }

    #[test]
    fn strips_every_listed_header_whatever_its_case_or_count() {
        let mut req = RequestHeader::build("GET", b"/", None).unwrap();
        for name in [
            "Authorization",
            "COOKIE",
            "x-real-ip",
            "X-Forwarded-Port",
            "X-Api-Key",
            "accept",
        ] {
            req.append_header(name.to_string(), "v").unwrap();
        }
        req.append_header("cookie".to_string(), "second").unwrap();
        assert_eq!(present(&req.headers, &NOT_TO_UPSTREAM), 0b1101_0011);
        let config = crate::config::Config::parse(
            std::path::Path::new("t.toml"),
            "[services.infer]\nupstream = \"http://127.0.0.1:8000\"\nscope = \"infer\"\n",
            |_| None,
        )
        .unwrap();
        let host = HeaderValue::from_static("127.0.0.1:8000");
        to_upstream(&mut req, &config.services[0], &host, None, false, "id").unwrap();
        let left: Vec<&str> = req.headers.keys().map(|k| k.as_str()).collect();
        assert!(
            NOT_TO_UPSTREAM.iter().all(|n| !req.headers.contains_key(n)),
            "{left:?}"
        );
        assert_eq!(req.headers.get("accept").unwrap(), "v");
        assert_eq!(req.headers.get("x-request-id").unwrap(), "id");
        let mut resp = ResponseHeader::build(200, None).unwrap();
        resp.append_header("Set-Cookie".to_string(), "a=1").unwrap();
        resp.append_header("set-cookie".to_string(), "b=2").unwrap();
        resp.append_header("Set-Cookie2".to_string(), "c=3")
            .unwrap();
        to_client(&mut resp, "id").unwrap();
        assert!(resp.headers.get("set-cookie").is_none());
        assert!(resp.headers.get("set-cookie2").is_none());
        assert_eq!(resp.headers.get("x-request-id").unwrap(), "id");
    }
}
