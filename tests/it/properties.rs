//! Property tests of the client-facing parsers: generated inputs built to hit the edges
//! (dot segments in every spelling, path parameters, token shapes), checked against the same
//! invariants as the fuzz targets, plus ground truths the generator knows.
#![cfg(feature = "fuzzing")]

use http::Method;
use portcullis::fuzzing;
use portcullis::GatewayError;
use portcullis::{classify_path as classify, Target};
use proptest::prelude::*;

/// Path segment pieces, dot spellings and separators included.
fn piece() -> impl Strategy<Value = &'static str> {
    prop::sample::select(vec![
        ".", "..", "%2e", "%2E", "%2e%2E", ";", "%3b", "%3B", ";x=1", "a", "v1", "chat", "%2f",
        "%5C", "\\", "%00", "%", "%zz", "...", "é", "~", "-", "_", "%41",
    ])
}

/// Whether a segment is `.` or `..` once decoded and cut at its first `;`.
fn is_dot_segment(segment: &str) -> bool {
    let decoded = segment
        .replace("%2e", ".")
        .replace("%2E", ".")
        .replace("%3b", ";")
        .replace("%3B", ";");
    matches!(decoded.split(';').next(), Some(".") | Some(".."))
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(4000))]

    #[test]
    fn no_dot_segment_is_ever_forwarded(
        segments in prop::collection::vec(prop::collection::vec(piece(), 1..4), 1..6),
        query in "[a-z=&.;%0-9]{0,12}",
    ) {
        let segments: Vec<String> = segments.iter().map(|p| p.concat()).collect();
        let target = format!("/v1/infer/{}?{query}", segments.join("/"));
        fuzzing::path_classifier(&[[0u8].as_slice(), target.as_bytes()].concat());
        if segments.iter().any(|s| is_dot_segment(s)) {
            let refused = classify(&Method::GET, target.as_bytes());
            prop_assert!(
                matches!(refused, Err(GatewayError::BadRequest(_))),
                "{target}: {refused:?}"
            );
        }
    }

    #[test]
    fn what_is_forwarded_is_the_targets_own_tail(rest in "(/[a-z0-9._~;=-]{1,8}){1,5}(\\?[ -~]{0,16})?") {
        let target = format!("/v1/embed{rest}");
        match classify(&Method::POST, target.as_bytes()) {
            Ok(Target::Protected { service, forward }) => {
                prop_assert_eq!(service, Some(&b"embed"[..]));
                prop_assert_eq!(forward, rest.as_bytes());
            }
            Err(GatewayError::BadRequest(_)) => prop_assert!(rest.split('?').next().unwrap().split('/').any(is_dot_segment)),
            other => prop_assert!(false, "{target}: {other:?}"),
        }
    }

    #[test]
    fn bearer_tokens_are_told_apart_by_shape_alone(
        scheme in "(Bearer|bearer|BEARER|Basic|Token)",
        token in "(ak_[0-9a-f]{16}\\.[A-Za-z0-9_-]{43}|ak_[0-9a-fA-F]{15,17}\\.[A-Za-z0-9_+-]{42,44}|[A-Za-z0-9_-]{1,6}\\.[A-Za-z0-9_=-]{0,6}\\.[A-Za-z0-9_-]{0,6}(\\.[a-z]{1,3})?|[ -~]{0,24})",
    ) {
        fuzzing::bearer_token(format!("{scheme} {token}").as_bytes());
        fuzzing::api_key(token.as_bytes());
    }

    #[test]
    fn jwt_headers_are_prechecked_without_panics(
        alg in "(RS256|ES256|EdDSA|HS256|none|RS512|)",
        typ in "(at\\+jwt|application/at\\+jwt|JWT|)",
        kid in "[a-z]{0,3}",
        crit in any::<bool>(),
        claims in "[ -~]{0,40}",
    ) {
        use base64::Engine as _;
        let b64 = base64::engine::general_purpose::URL_SAFE_NO_PAD;
        let mut header = serde_json::json!({"alg": alg, "typ": typ, "kid": kid});
        if crit {
            header["crit"] = serde_json::json!(["exp"]);
        }
        let token = format!("{}.{}.c2ln", b64.encode(header.to_string()), b64.encode(&claims));
        fuzzing::jwt_precheck(token.as_bytes());
    }

    #[test]
    fn configs_are_accepted_only_when_valid(
        name in "(infer|_local|_x|a-b|Bad|)",
        scope in "(infer|chat x|a\\\\b|portcullis:admin|)",
        upstream in "(http://127.0.0.1:8000|https://\\[::1\\]/v1|ftp://x|http://u:p@127.0.0.1|http://host.invalid)",
        listen in "(127.0.0.1:8080|nope|\\[::1\\]:9100|:80)",
    ) {
        let text = format!(
            "[server]\nlisten = [\"{listen}\"]\n[metrics]\nlisten = \"{listen}\"\n\
             [services.\"{name}\"]\nupstream = \"{upstream}\"\nscope = \"{scope}\"\n"
        );
        fuzzing::config_loader(text.as_bytes());
    }

    #[test]
    fn access_log_lines_are_one_valid_json_line(path in prop::collection::vec(any::<u8>(), 0..64)) {
        fuzzing::access_log_json(&path);
    }
}
