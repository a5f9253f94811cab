//! The request head: the path classifier, the bearer token and its two shapes, the config
//! file, and the access-log line.

use std::borrow::Cow;
use std::path::Path;

use http::{HeaderMap, HeaderValue, Method};
use jsonwebtoken::Algorithm;

use crate::auth::jwt::{check_header, claims::Claims, MAX_KID_LEN};
use crate::auth::token::{self, Bearer, KeyId, API_KEY_PREFIX, KEY_ID_LEN, SECRET_LEN};
use crate::config::Config;
use crate::observe::access_log::{path_only, HttpFields, ProxiedFields, Record};
use crate::proxy::{classify_path, Target};
const METHODS: [&str; 9] = [
    "GET", "POST", "PUT", "PATCH", "DELETE", "HEAD", "OPTIONS", "CONNECT", "TRACE",
];

/// `proxy::classify_path` on raw target bytes: what it forwards never holds a dot segment (raw,
/// encoded, or before `;params`), an encoded `/` or `\`, a backslash, a control character or
/// an empty segment; it is the target's own tail; and it reads nothing but the target.
pub fn path_classifier(data: &[u8]) {
    let (method, target) = match data.split_first() {
        Some((&m, rest)) => (METHODS[m as usize % METHODS.len()], rest),
        None => ("GET", data),
    };
    let method = Method::from_bytes(method.as_bytes()).expect("a known method");
    match classify_path(&method, target) {
        Ok(Target::Protected { service, forward }) => {
            assert!(target.ends_with(forward), "forwards a part of the target");
            let path = target.split(|&b| b == b'?').next().unwrap_or_default();
            assert_forwardable(path);
            if let Some(service) = service {
                assert!(!service.is_empty() && !service.contains(&b'/'));
                assert!(target.starts_with(b"/v1/"));
            }
            let forward_path = forward.split(|&b| b == b'?').next().unwrap_or_default();
            assert!(
                !forward_path.windows(2).any(|w| w == b"//"),
                "empty segment forwarded"
            );
            let query = &target[path.len()..];
            assert!(
                !query.iter().any(|&b| b < 0x20 || b == 0x7f),
                "control in query"
            );
        }
        Ok(Target::Health) => {
            assert!(target.split(|&b| b == b'?').next() == Some(b"/healthz"));
            assert!(method == Method::GET || method == Method::HEAD);
        }
        Ok(Target::NotFound) | Err(_) => {}
    }
}

/// An independent reading of a path, segment by segment, the way a lenient upstream would
/// decode it (percent-decoding, then cutting `;params`).
fn assert_forwardable(path: &[u8]) {
    assert!(!path.contains(&b'\\'), "raw backslash forwarded");
    for segment in path.split(|&b| b == b'/') {
        let decoded = percent_decode(segment);
        for &b in &decoded {
            assert!(b >= 0x20 && b != 0x7f, "control character forwarded");
            assert!(b != b'/' && b != b'\\', "encoded separator forwarded");
        }
        let name = decoded.split(|&b| b == b';').next().unwrap_or_default();
        assert!(
            name != b"." && name != b"..",
            "dot segment forwarded: {:?}",
            String::from_utf8_lossy(segment)
        );
    }
}

fn percent_decode(s: &[u8]) -> Vec<u8> {
    let hex = |b: u8| (b as char).to_digit(16).map(|d| d as u8);
    let mut out = Vec::with_capacity(s.len());
    let mut i = 0;
    while i < s.len() {
        match (
            s[i],
            s.get(i + 1).copied().and_then(hex),
            s.get(i + 2).copied().and_then(hex),
        ) {
            (b'%', Some(h), Some(l)) => {
                out.push(h << 4 | l);
                i += 3;
            }
            (b, _, _) => {
                out.push(b);
                i += 1;
            }
        }
    }
    out
}

/// `token::bearer` on an arbitrary Authorization header (or several): a token is told as an
/// API key or a JWT only when it has exactly that shape, and it is the header's own text.
pub fn bearer_token(data: &[u8]) {
    let mut headers = HeaderMap::new();
    for value in data.split(|&b| b == b'\n').take(3) {
        if let Ok(v) = HeaderValue::from_bytes(value) {
            headers.append(http::header::AUTHORIZATION, v);
        }
    }
    let count = headers.get_all(http::header::AUTHORIZATION).iter().count();
    match token::bearer(&headers) {
        Ok(bearer) => {
            assert_eq!(count, 1, "one Authorization header, never several");
            let value = headers[http::header::AUTHORIZATION].to_str().unwrap();
            let (scheme, token) = value.split_once(' ').unwrap();
            assert!(scheme.eq_ignore_ascii_case("bearer"));
            assert_eq!(token::classify(token), Some(bearer));
            assert_shape(token);
        }
        Err(token::ShapeError::Missing) => assert_eq!(count, 0),
        Err(token::ShapeError::Malformed) => assert!(count > 0),
    }
}

fn assert_shape(token: &str) {
    let b64 = |s: &str| {
        !s.is_empty()
            && s.bytes()
                .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
    };
    match token::classify(token) {
        Some(Bearer::ApiKey { key_id, secret }) => {
            assert_eq!(
                token,
                format!("{API_KEY_PREFIX}{}.{secret}", key_id.as_str())
            );
            assert_eq!(secret.len(), SECRET_LEN);
            assert!(b64(secret));
        }
        Some(Bearer::Jwt(jwt)) => {
            assert_eq!(jwt, token);
            assert!(token.len() <= token::MAX_TOKEN_LEN);
            let segments: Vec<&str> = token.split('.').collect();
            assert_eq!(segments.len(), 3);
            assert!(segments.iter().all(|s| b64(s)));
        }
        None => {}
    }
}

/// `token::classify` and `KeyId::parse` on arbitrary text: an accepted key id is 16 lowercase
/// hex characters and prints back as it was read.
pub fn api_key(data: &[u8]) {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    assert_shape(text);
    if let Some(id) = KeyId::parse(text) {
        assert_eq!(id.as_str(), text);
        assert_eq!(text.len(), KEY_ID_LEN);
        assert!(text.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f')));
    }
    if let Some(rest) = text.strip_prefix(API_KEY_PREFIX) {
        if let Some(Bearer::ApiKey { key_id, .. }) = token::classify(text) {
            assert!(rest.starts_with(key_id.as_str()));
        }
    }
}

/// The checks a JWT passes before any key is looked up, and the claims reader: an accepted
/// header names an allowed algorithm and a bounded `kid`; scopes are never empty or spaced.
pub fn jwt_precheck(data: &[u8]) {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    let allowed = [Algorithm::RS256, Algorithm::ES256, Algorithm::EdDSA];
    let types = ["at+jwt".to_string(), "application/at+jwt".to_string()];
    if let Ok((alg, kid)) = check_header(text, &types, |a| allowed.contains(&a)) {
        assert!(allowed.contains(&alg));
        assert!(!kid.is_empty() && kid.len() <= MAX_KID_LEN);
    }
    // The claims segment, as the verifier would read it once the signature holds.
    let payload = text.split('.').nth(1).unwrap_or(text);
    let json = base64::Engine::decode(&base64::engine::general_purpose::URL_SAFE_NO_PAD, payload)
        .unwrap_or_else(|_| data.to_vec());
    if let Ok(claims) = serde_json::from_slice::<Claims>(&json) {
        let _ = claims.exp();
        for scope in claims.scopes().iter() {
            assert!(!scope.is_empty());
            assert!(!scope.contains([' ', '\t', '\n', '\r', '\x0c']));
        }
    }
}

/// The config loader on arbitrary TOML: never a panic; an accepted config has services with
/// valid names, single-token scopes and parsable listeners; every problem is one line.
pub fn config_loader(data: &[u8]) {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    // No network: only IP literals resolve. `${VAR}` finds `X` alone.
    let resolve = |host: &str, port: u16| {
        host.parse::<std::net::IpAddr>()
            .map(|ip| vec![std::net::SocketAddr::new(ip, port)])
            .map_err(|_| format!("`{host}` is not resolved while fuzzing"))
    };
    let lookup = |name: &str| (name == "X").then(|| "x".to_string());
    match Config::parse_with(Path::new("fuzz.toml"), text, &lookup, &resolve) {
        Ok(config) => {
            assert!(!config.services.is_empty());
            for s in &config.services {
                assert!(!s.name.is_empty() && !s.name.starts_with('_'));
                assert!(crate::scope::Scope::is_token(&s.scope));
            }
            for addr in &config.server.listen {
                assert!(addr.parse::<std::net::SocketAddr>().is_ok());
            }
            if let Some(m) = &config.metrics {
                assert!(m.listen.parse::<std::net::SocketAddr>().is_ok());
            }
        }
        Err(e) => {
            assert!(!e.problems.is_empty());
            for p in &e.problems {
                assert!(!p.contains('\n'), "a problem spans lines: {p:?}");
            }
            assert!(!e.summary().contains('\n'));
        }
    }
}

/// The access-log line for a request with arbitrary path bytes: one line of valid JSON whose
/// `path` is the path without its query, and no query byte anywhere.
pub fn access_log_json(data: &[u8]) {
    let path = path_only(data);
    let id = String::from_utf8_lossy(&data[..data.len().min(16)]);
    let entry = Record {
        time: crate::observe::access_log::Time(std::time::SystemTime::now()),
        request_id: &id,
        service: "_unknown",
        principal_kind: None,
        principal_id: Some(&id),
        http: Some(HttpFields {
            method: "GET",
            path: Cow::Borrowed(&path),
            status: 200,
            duration_ms: 1.5,
            client: None,
            auth_failure: None,
        }),
        proxied: Some(ProxiedFields {
            upstream_ttfb_ms: None,
            bytes_in: 0,
            bytes_out: 0,
            model: Some(&id),
            prompt_tokens: Some(1),
            completion_tokens: None,
            reasoning_tokens: None,
            cached_tokens: None,
            usage_estimated: false,
            owner: Some(&id),
            replica: Some(&id),
            affinity: Some("hit"),
            translated: Some("messages>chat"),
            cost: Some(None),
        }),
        key_event: None,
    };
    let line = entry.to_line();
    assert_eq!(line.last(), Some(&b'\n'));
    assert!(!line[..line.len() - 1].contains(&b'\n'), "one line");
    let parsed: serde_json::Value = serde_json::from_slice(&line).expect("valid JSON");
    assert_eq!(
        parsed["path"].as_str(),
        Some(&*path),
        "the path round-trips"
    );
    assert_eq!(parsed["request_id"].as_str(), Some(&*id));
    assert!(!path.contains('?'), "no query logged");
}
