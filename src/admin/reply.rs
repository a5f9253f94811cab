//! Responses of the admin listener, its request bodies, and its access-log lines.

use std::borrow::Cow;
use std::time::{Duration, Instant, SystemTime};

use pingora::http::ResponseHeader;
use pingora::protocols::http::ServerSession;

use super::{KeyEvent, SERVICE_LABEL};
use crate::auth::{AuthFailure, Principal};
use crate::errors::GatewayError;
use crate::observe::access_log::{millis, path_only, HttpFields, KeyEventFields, Record, Time};

/// Bodies on the admin listener are a name and a few scopes: anything larger is not ours.
pub(crate) const MAX_BODY: usize = 16 * 1024;
/// How long a client may take to send its (small) body.
const BODY_TIMEOUT: Duration = Duration::from_secs(10);

pub(crate) struct Reply {
    status: u16,
    content_type: &'static str,
    body: Cow<'static, [u8]>,
    /// `www-authenticate`, `allow`, `location`, the console's security headers.
    headers: Vec<(&'static str, Cow<'static, str>)>,
    cache_control: &'static str,
    /// Close the connection after this response: the request body was not read to its end.
    pub close: bool,
}

impl Reply {
    pub(crate) fn json(status: u16, body: Vec<u8>) -> Reply {
        Reply {
            status,
            content_type: "application/json",
            body: Cow::Owned(body),
            headers: Vec::new(),
            cache_control: "no-store",
            close: false,
        }
    }

    pub(crate) fn static_body(
        status: u16,
        content_type: &'static str,
        body: &'static [u8],
    ) -> Reply {
        Reply {
            content_type,
            body: Cow::Borrowed(body),
            ..Reply::json(status, Vec::new())
        }
    }

    pub(crate) fn no_content() -> Reply {
        Reply::json(204, Vec::new())
    }

    /// `{"error": code, "message": message}`, the data plane's shape.
    pub(crate) fn error(status: u16, code: &str, message: Option<&str>) -> Reply {
        let body = match message {
            Some(m) => serde_json::json!({ "error": code, "message": m }),
            None => serde_json::json!({ "error": code }),
        };
        Reply::json(status, body.to_string().into_bytes())
    }

    /// The data plane's 401, byte for byte: same body, same headers, no reason given.
    pub(crate) fn unauthorized() -> Reply {
        let e = GatewayError::Unauthorized;
        let mut reply = Reply::json(e.status(), e.body().to_vec());
        reply
            .headers
            .push(("www-authenticate", Cow::Borrowed("Bearer")));
        reply
    }

    /// Over `[admin] requests_per_minute`: the data plane's 429, with the seconds to wait.
    pub(crate) fn rate_limited(retry_after: u64) -> Reply {
        let e = GatewayError::RateLimited(retry_after);
        Reply::json(e.status(), e.body().to_vec()).header("retry-after", retry_after.to_string())
    }

    pub(crate) fn method_not_allowed(allow: &'static str) -> Reply {
        let message = format!("allowed: {allow}");
        let mut reply = Reply::error(405, "method_not_allowed", Some(&message));
        reply.headers.push(("allow", Cow::Borrowed(allow)));
        reply
    }

    pub(crate) fn redirect(to: &'static str) -> Reply {
        let mut reply = Reply::json(308, Vec::new());
        reply.headers.push(("location", Cow::Borrowed(to)));
        reply
    }

    pub(crate) fn header(
        mut self,
        name: &'static str,
        value: impl Into<Cow<'static, str>>,
    ) -> Reply {
        self.headers.push((name, value.into()));
        self
    }

    pub(crate) fn cache_control(mut self, value: &'static str) -> Reply {
        self.cache_control = value;
        self
    }

    fn closing(mut self) -> Reply {
        self.close = true;
        self
    }

    /// The response head with the headers every admin response carries, named and ordered as
    /// the data plane's (content-type, content-length, x-request-id, cache-control, then the
    /// reply's own), so a 401 is the same bytes on both; CORS headers when the request came
    /// from an allowed origin. And the body (empty for HEAD).
    pub(crate) fn into_parts(
        self,
        request_id: &str,
        origin: Option<&str>,
        head: bool,
    ) -> pingora::Result<(ResponseHeader, Vec<u8>)> {
        let mut h = ResponseHeader::build(self.status, Some(8 + self.headers.len()))?;
        if self.status != 204 && self.status != 308 {
            h.insert_header("content-type", self.content_type)?;
            h.insert_header("content-length", self.body.len())?;
        }
        h.insert_header("x-request-id", request_id)?;
        h.insert_header("cache-control", self.cache_control)?;
        for (name, value) in &self.headers {
            h.append_header(*name, value.as_ref())?;
        }
        if let Some(origin) = origin {
            h.insert_header("access-control-allow-origin", origin)?;
            h.insert_header("access-control-expose-headers", "x-request-id")?;
            h.insert_header("vary", "origin")?;
        }
        let body = if head {
            Vec::new()
        } else {
            self.body.into_owned()
        };
        Ok((h, body))
    }
}

/// The store failed: the client may retry; the cause goes to the log only.
pub(crate) fn store_failed(what: &str, e: &dyn std::fmt::Display) -> Reply {
    log::warn!("admin: cannot {what}: {e}");
    Reply::error(
        503,
        "unavailable",
        Some("the key store is unavailable; try again shortly"),
    )
    .header("retry-after", "1")
}

/// The whole request body, at most `MAX_BODY` bytes; a reply to send instead otherwise.
pub(crate) async fn read_body(session: &mut ServerSession) -> Result<Vec<u8>, Reply> {
    let too_large = || {
        let message = format!("request body exceeds {MAX_BODY} bytes");
        Reply::error(413, "payload_too_large", Some(&message)).closing()
    };
    let declared = session
        .req_header()
        .headers
        .get(http::header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok());
    if declared.is_some_and(|n| n > MAX_BODY as u64) {
        return Err(too_large());
    }
    let mut body = Vec::with_capacity(declared.unwrap_or(0) as usize);
    let read = async {
        while let Some(chunk) = session.read_request_body().await? {
            if body.len() + chunk.len() > MAX_BODY {
                return Ok(false);
            }
            body.extend_from_slice(&chunk);
        }
        Ok::<bool, Box<pingora::Error>>(true)
    };
    match tokio::time::timeout(BODY_TIMEOUT, read).await {
        Ok(Ok(true)) => Ok(body),
        Ok(Ok(false)) => Err(too_large()),
        Ok(Err(_)) => Err(Reply::error(
            400,
            "bad_request",
            Some("the request body could not be read"),
        )
        .closing()),
        Err(_) => Err(Reply::error(
            400,
            "bad_request",
            Some("the request body did not arrive in time"),
        )
        .closing()),
    }
}

pub(crate) fn log_line<'a>(
    session: &'a ServerSession,
    request_id: &'a str,
    status: u16,
    start: Instant,
    principal: Option<&'a Principal>,
    auth_failure: Option<AuthFailure>,
    event: Option<&'a KeyEvent>,
) -> Record<'a> {
    let elapsed = start.elapsed();
    let req = session.req_header();
    Record {
        time: Time(SystemTime::now() - elapsed),
        request_id,
        service: SERVICE_LABEL,
        principal_kind: principal.map(|p| p.kind.as_str()),
        principal_id: principal.map(|p| &*p.id),
        http: Some(HttpFields {
            method: req.method.as_str(),
            path: path_only(req.raw_path()),
            status,
            duration_ms: millis(elapsed),
            client: session
                .client_addr()
                .and_then(|a| a.as_inet())
                .map(|a| a.ip()),
            auth_failure: auth_failure.map(|f| f.as_str()),
        }),
        proxied: None,
        key_event: event.map(|e| KeyEventFields {
            key_event: e.event,
            key_id: e.key_id.as_deref(),
            budget_owner: e.budget_owner.as_deref(),
            team: e.team.as_ref().map(Option::as_deref),
            member: e.member.as_deref(),
            budget: e.budget,
        }),
    }
}
