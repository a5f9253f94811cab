//! Where a request goes, decided from the method and the raw request target alone.
//! Validation works on the bytes as sent: Pingora does not normalise paths, and what we
//! forward must be exactly what we checked.

use http::Method;

use crate::errors::{GatewayError, Malformed};

/// What a request is for, once its method and path shape are known to be acceptable.
#[derive(Debug, PartialEq, Eq)]
pub enum Target<'a> {
    /// `GET`/`HEAD /healthz`, answered locally.
    Health,
    /// Under `/v1/`: authentication comes first, then the service lookup.
    /// `service` is `None` when the path has no `/v1/<service>/` shape at all.
    Protected {
        service: Option<&'a [u8]>,
        /// The remainder to forward: `/<rest>` plus `?<query>` exactly as sent.
        forward: &'a [u8],
    },
    /// Outside `/v1/` and not `/healthz`: 404 without authentication.
    NotFound,
}

const PREFIX: &[u8] = b"/v1/";
const HEALTH: &[u8] = b"/healthz";

/// Whether the request target names the health endpoint, whatever the method or query:
/// even a refused request there is the gateway's own (`_local`) business.
pub(crate) fn is_health_target(target: &[u8]) -> bool {
    target
        .strip_prefix(HEALTH)
        .is_some_and(|rest| rest.is_empty() || rest[0] == b'?')
}

/// Method, then path shape, in the order docs/reference.md gives.
pub fn classify<'a>(method: &Method, target: &'a [u8]) -> Result<Target<'a>, GatewayError> {
    if !is_allowed_method(method) {
        return Err(GatewayError::MethodNotAllowed);
    }
    let path_end = target
        .iter()
        .position(|&b| b == b'?')
        .unwrap_or(target.len());
    let (path, query) = target.split_at(path_end);
    check_path(path)?;
    if query.iter().any(|&b| is_control(b)) {
        return Err(GatewayError::BadRequest(Malformed::ControlCharacter));
    }

    if path == HEALTH {
        return match *method {
            Method::GET | Method::HEAD => Ok(Target::Health),
            _ => Err(GatewayError::MethodNotAllowed),
        };
    }
    let Some(after_prefix) = path.strip_prefix(PREFIX) else {
        return Ok(Target::NotFound);
    };
    let Some(slash) = after_prefix.iter().position(|&b| b == b'/') else {
        return Ok(Target::Protected {
            service: None,
            forward: b"",
        });
    };
    let service = &after_prefix[..slash];
    let forward = &target[PREFIX.len() + slash..];
    let rest = &after_prefix[slash..];
    if rest.windows(2).any(|w| w == b"//") {
        return Err(GatewayError::BadRequest(Malformed::EmptySegment));
    }
    Ok(Target::Protected {
        service: (!service.is_empty()).then_some(service),
        forward,
    })
}

pub(crate) fn is_allowed_method(method: &Method) -> bool {
    matches!(
        *method,
        Method::GET
            | Method::POST
            | Method::PUT
            | Method::PATCH
            | Method::DELETE
            | Method::HEAD
            | Method::OPTIONS
    )
}

fn is_control(b: u8) -> bool {
    b < 0x20 || b == 0x7f
}

fn hex(b: u8) -> Option<u8> {
    (b as char).to_digit(16).map(|d| d as u8)
}

/// Rejects control characters, backslashes, encoded `/` and `\` and dot segments,
/// raw or percent-encoded: anything an upstream might resolve differently than we route.
/// A segment's `;params` (RFC 3986 §3.3) do not hide a dot segment: Tomcat, Jetty and Spring
/// cut them off and then treat `..;x` as `..`, so what counts is the part before the first
/// `;` (raw or `%3b`).
fn check_path(path: &[u8]) -> Result<(), GatewayError> {
    let mut i = 0;
    // Per segment, up to its first `;`: how many characters, and how many of them were
    // (possibly encoded) dots.
    let (mut seg_len, mut seg_dots, mut in_params) = (0usize, 0usize, false);
    while i <= path.len() {
        let (decoded, width) = match path.get(i) {
            None | Some(b'/') => {
                if seg_len > 0 && seg_len == seg_dots && seg_dots <= 2 {
                    return Err(GatewayError::BadRequest(Malformed::DotSegment));
                }
                (seg_len, seg_dots, in_params) = (0, 0, false);
                i += 1;
                continue;
            }
            Some(b'%') => match (
                path.get(i + 1).and_then(|&b| hex(b)),
                path.get(i + 2).and_then(|&b| hex(b)),
            ) {
                (Some(h), Some(l)) => (h << 4 | l, 3),
                // A lone `%` is passed through as a literal: the upstream decides.
                _ => (b'%', 1),
            },
            Some(&b) => (b, 1),
        };
        if width == 1 && decoded == b'\\' {
            return Err(GatewayError::BadRequest(Malformed::Backslash));
        }
        if width == 3 && (decoded == b'/' || decoded == b'\\') {
            return Err(GatewayError::BadRequest(Malformed::EncodedSeparator));
        }
        if is_control(decoded) {
            return Err(GatewayError::BadRequest(Malformed::ControlCharacter));
        }
        in_params |= decoded == b';';
        if !in_params {
            seg_len += 1;
            seg_dots += usize::from(decoded == b'.');
        }
        i += width;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ok(target: &str) -> Target<'_> {
        classify(&Method::GET, target.as_bytes()).unwrap()
    }

    fn bad(target: &str) -> Malformed {
        match classify(&Method::GET, target.as_bytes()) {
            Err(GatewayError::BadRequest(m)) => m,
            other => panic!("{target}: expected 400, got {other:?}"),
        }
    }

    #[test]
    fn splits_service_and_forwards_rest_with_query_verbatim() {
        assert_eq!(
            ok("/v1/infer/v1/chat/completions?a=1&b=%20x"),
            Target::Protected {
                service: Some(b"infer"),
                forward: b"/v1/chat/completions?a=1&b=%20x"
            }
        );
        assert_eq!(
            ok("/v1/embed/"),
            Target::Protected {
                service: Some(b"embed"),
                forward: b"/"
            }
        );
    }

    #[test]
    fn paths_without_a_service_shape_stay_protected_but_unrouted() {
        for p in ["/v1/infer", "/v1/", "/v1//x"] {
            match classify(&Method::GET, p.as_bytes()) {
                Ok(Target::Protected { service: None, .. }) => {}
                Err(GatewayError::BadRequest(Malformed::EmptySegment)) if p == "/v1//x" => {}
                other => panic!("{p}: {other:?}"),
            }
        }
    }

    #[test]
    fn health_and_outside_paths() {
        assert_eq!(ok("/healthz"), Target::Health);
        assert_eq!(
            classify(&Method::HEAD, b"/healthz").unwrap(),
            Target::Health
        );
        assert_eq!(
            classify(&Method::POST, b"/healthz"),
            Err(GatewayError::MethodNotAllowed)
        );
        for p in [
            "/",
            "/v1",
            "/v2/infer/x",
            "/healthz/",
            "/metrics",
            "http://h/v1/infer/x",
        ] {
            assert_eq!(ok(p), Target::NotFound, "{p}");
        }
    }

    #[test]
    fn rejects_unknown_methods_before_looking_at_the_path() {
        let trace = Method::from_bytes(b"TRACE").unwrap();
        assert_eq!(
            classify(&trace, b"/v1/../x"),
            Err(GatewayError::MethodNotAllowed)
        );
        assert_eq!(
            classify(&Method::CONNECT, b"/healthz"),
            Err(GatewayError::MethodNotAllowed)
        );
    }

    #[test]
    fn rejects_dot_segments_raw_and_encoded() {
        for p in [
            "/v1/infer/../x",
            "/v1/infer/./x",
            "/v1/infer/%2e%2e/x",
            "/v1/infer/.%2E/x",
            "/v1/infer/%2e/x",
            "/v1/infer/x/..",
            "/v1/infer/x/%2e%2e?q",
            // Path parameters cut off by Tomcat, Jetty and Spring before they resolve dots.
            "/v1/chaty/..;/x",
            "/v1/chaty/.;/x",
            "/v1/chaty/..;jsessionid=1/x",
            "/v1/chaty/%2e%2e;/x",
            "/v1/chaty/..%3b/x",
            "/v1/chaty/.%3B/x",
            "/v1/chaty/x/..;",
        ] {
            assert_eq!(bad(p), Malformed::DotSegment, "{p}");
        }
        // Three dots or dots inside a name are ordinary segments.
        assert!(matches!(
            ok("/v1/infer/.../a.b/..c"),
            Target::Protected { .. }
        ));
        // Parameters on ordinary segments, and dots after the `;`, are forwarded as sent.
        assert_eq!(
            ok("/v1/infer/a;v=1/b;..;x/...;y?q=..;"),
            Target::Protected {
                service: Some(b"infer"),
                forward: b"/a;v=1/b;..;x/...;y?q=..;"
            }
        );
    }

    #[test]
    fn rejects_separators_controls_and_empty_segments() {
        assert_eq!(bad("/v1/infer/a%2fb"), Malformed::EncodedSeparator);
        assert_eq!(bad("/v1/infer/a%2Fb"), Malformed::EncodedSeparator);
        assert_eq!(bad("/v1/infer/a%5cb"), Malformed::EncodedSeparator);
        assert_eq!(bad("/v1/infer/a\\b"), Malformed::Backslash);
        assert_eq!(bad("/v1/infer/a%00b"), Malformed::ControlCharacter);
        assert_eq!(bad("/v1/infer/a%0Ab"), Malformed::ControlCharacter);
        assert_eq!(bad("/v1/infer/a\x01b"), Malformed::ControlCharacter);
        assert_eq!(bad("/v1/infer/a?q=\x7f"), Malformed::ControlCharacter);
        assert_eq!(bad("/v1/infer/a//b"), Malformed::EmptySegment);
        // A trailing slash is not an empty segment in the middle.
        assert!(matches!(
            ok("/v1/infer/v1/models/"),
            Target::Protected { .. }
        ));
        // A lone percent sign is literal.
        assert!(matches!(ok("/v1/infer/100%"), Target::Protected { .. }));
    }
}
