//! The invariants every parser that reads client bytes promises, as checks that panic when
//! one is broken. One definition serves the libFuzzer targets (`fuzz/`), the replay of their
//! corpora in `make test` (`tests/fuzz_corpus.rs`) and the property tests.
//! Each check takes arbitrary bytes and must never panic for a reason other than a broken
//! invariant.

use std::borrow::Cow;
use std::collections::HashSet;
use std::fmt;
use std::io::Write;
use std::path::Path;

use flate2::write::{DeflateEncoder, GzEncoder, ZlibEncoder};
use http::{HeaderMap, HeaderValue, Method};
use jsonwebtoken::Algorithm;
use serde::de::{self, Deserialize, Deserializer, MapAccess, SeqAccess, Visitor};
use serde_json::value::RawValue;
use serde_json::Value;

use crate::access_log::{path_only, HttpFields, ProxiedFields, Record};
use crate::auth::jwt::{check_header, claims::Claims, MAX_KID_LEN};
use crate::auth::token::{self, Bearer, KeyId, API_KEY_PREFIX, KEY_ID_LEN, SECRET_LEN};
use crate::config::Config;
use crate::model_policy::{self, Applied, BodyError, Endpoint, Models};
use crate::routing::{self, Target};
use crate::usage::{Encoding, Framing, Usage, UsageScanner};

/// One invariant check over arbitrary input bytes.
pub type Check = fn(&[u8]);

/// Every fuzz target by name, for the corpus replay.
pub const TARGETS: [(&str, Check); 8] = [
    ("path_classifier", path_classifier),
    ("bearer_token", bearer_token),
    ("api_key", api_key),
    ("jwt_precheck", jwt_precheck),
    ("config_loader", config_loader),
    ("access_log_json", access_log_json),
    ("model_body", model_body),
    ("usage_scanner", usage_scanner),
];

const METHODS: [&str; 9] = [
    "GET", "POST", "PUT", "PATCH", "DELETE", "HEAD", "OPTIONS", "CONNECT", "TRACE",
];

/// `routing::classify` on raw target bytes: what it forwards never holds a dot segment (raw,
/// encoded, or before `;params`), an encoded `/` or `\`, a backslash, a control character or
/// an empty segment; it is the target's own tail; and it reads nothing but the target.
pub fn path_classifier(data: &[u8]) {
    let (method, target) = match data.split_first() {
        Some((&m, rest)) => (METHODS[m as usize % METHODS.len()], rest),
        None => ("GET", data),
    };
    let method = Method::from_bytes(method.as_bytes()).expect("a known method");
    match routing::classify(&method, target) {
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
        time: "2026-01-01T00:00:00.000Z".into(),
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
            replica: Some(&id),
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

/// The policy `model_body` applies besides none at all: a default, an alias, an alias to
/// itself (a body naming it is left alone) and one whose name and target need JSON escapes.
const DEFAULT_MODEL: &str = "default-model";
const ALIASES: [(&str, &str); 3] = [
    ("fast", "gpt-4o-mini"),
    ("same", "same"),
    ("q\"\u{e9}", "org/model \"v2\"\u{2028}\\"),
];

/// Every message a refused body can get, digits written `N`: a message outside this list
/// might quote the body.
const BODY_ERRORS: [&str; 4] = [
    "body is not valid JSON (line N, column N)",
    "body must be a JSON object",
    "model appears more than once",
    "model must be a string",
];
const CHAT_ERRORS: [&str; 11] = [
    "messages is required",
    "messages appears more than once",
    "messages must be a non-empty array",
    "messages[N] must be an object",
    "messages[N].role appears more than once",
    "messages[N].role must be a string",
    "messages[N].content appears more than once",
    "messages[N].content must be a string, an array of content parts or null",
    "messages[N].content[N] must be an object",
    "stream appears more than once",
    "stream must be a boolean",
];
const EMBEDDINGS_ERRORS: [&str; 3] = [
    "input is required",
    "input appears more than once",
    "input must be a string, an array of strings, an array of integers or an array of \
     integer arrays",
];

/// `model_policy::apply` on an arbitrary body, for both endpoints, with and without a policy:
/// it never panics; the policy never changes whether a body is accepted; an accepted body is
/// a JSON object of the promised shape (checked here on serde_json's own reading); a changed
/// body is the original with only its model token replaced or a model inserted; a refusal
/// is one line from a fixed vocabulary, so it never quotes the body.
pub fn model_body(data: &[u8]) {
    let none = Models::new(None, []);
    let policy = Models::new(
        Some(DEFAULT_MODEL.to_string()),
        ALIASES.map(|(alias, name)| (alias.to_string(), name.to_string())),
    );
    // What serde_json reads, the reference every outcome is compared with.
    let parsed = serde_json::from_slice::<Value>(data).ok();
    for endpoint in [Endpoint::Chat, Endpoint::Embeddings] {
        let plain = model_policy::apply(endpoint, data, &none);
        let with = model_policy::apply(endpoint, data, &policy);
        let (plain, with) = match (plain, with) {
            (Ok(plain), Ok(with)) => (plain, with),
            (Err(plain), Err(with)) => {
                assert_eq!(plain, with, "the policy changes why a body is refused");
                assert_refusal(endpoint, &plain, data, parsed.as_ref());
                continue;
            }
            (plain, with) => panic!("accepted under one policy only: {plain:?} / {with:?}"),
        };
        let Some(value) = &parsed else {
            panic!("{endpoint:?}: accepted a body serde_json refuses");
        };
        assert!(
            well_shaped(endpoint, value),
            "{endpoint:?}: accepted a body of the wrong shape"
        );
        let model = value
            .get("model")
            .map(|m| m.as_str().expect("a string model"));
        // Without a policy nothing changes and the model is reported as the body has it.
        assert_eq!(
            plain,
            Applied {
                body: None,
                model: model.map(str::to_string),
            }
        );
        let expected = match model {
            None => DEFAULT_MODEL,
            Some(name) => ALIASES
                .iter()
                .find(|(alias, _)| *alias == name)
                .map_or(name, |(_, target)| target),
        };
        assert_eq!(with.model.as_deref(), Some(expected));
        match &with.body {
            // Left alone: the body already names the model it goes to.
            None => assert_eq!(model, Some(expected), "an alias or default not applied"),
            Some(new) => assert_rewrite(data, value, new, expected),
        }
    }
}

/// A refusal is one line of the fixed vocabulary; "not valid JSON" only when serde_json
/// agrees; and a body serde_json finds well shaped is refused only when it repeats a key
/// somewhere (serde_json keeps the last copy; the policy refuses the repetition, or the
/// first copy when that one is wrong).
fn assert_refusal(endpoint: Endpoint, e: &BodyError, body: &[u8], parsed: Option<&Value>) {
    let message = e.message();
    assert!(!message.contains(['\n', '\r']), "a refusal spans lines");
    // Each run of digits (an index, a line, a column) becomes one `N`.
    let mut shape = String::with_capacity(message.len());
    let mut in_number = false;
    for c in message.chars() {
        if !c.is_ascii_digit() {
            shape.push(c);
        } else if !in_number {
            shape.push('N');
        }
        in_number = c.is_ascii_digit();
    }
    let for_endpoint: &[&str] = match endpoint {
        Endpoint::Chat => &CHAT_ERRORS,
        Endpoint::Embeddings => &EMBEDDINGS_ERRORS,
    };
    assert!(
        BODY_ERRORS.contains(&&*shape) || for_endpoint.contains(&&*shape),
        "{endpoint:?}: a refusal outside the vocabulary: {message:?}"
    );
    if let Some(value) = parsed {
        assert!(
            !message.starts_with("body is not valid JSON"),
            "{endpoint:?}: serde_json reads a body refused as not JSON: {message:?}"
        );
        if well_shaped(endpoint, value) && has_unique_keys(body) {
            panic!("{endpoint:?}: a well-shaped body refused: {message:?}");
        }
    }
}

/// Whether serde_json reads `body` as JSON in which no object repeats a key.
fn has_unique_keys(body: &[u8]) -> bool {
    struct Unique;
    impl<'de> Deserialize<'de> for Unique {
        fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
            deserializer.deserialize_any(UniqueVisitor)
        }
    }
    struct UniqueVisitor;
    impl<'de> Visitor<'de> for UniqueVisitor {
        type Value = Unique;
        fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
            f.write_str("JSON without a repeated key")
        }
        fn visit_bool<E: de::Error>(self, _: bool) -> Result<Unique, E> {
            Ok(Unique)
        }
        fn visit_i64<E: de::Error>(self, _: i64) -> Result<Unique, E> {
            Ok(Unique)
        }
        fn visit_u64<E: de::Error>(self, _: u64) -> Result<Unique, E> {
            Ok(Unique)
        }
        fn visit_f64<E: de::Error>(self, _: f64) -> Result<Unique, E> {
            Ok(Unique)
        }
        fn visit_str<E: de::Error>(self, _: &str) -> Result<Unique, E> {
            Ok(Unique)
        }
        fn visit_unit<E: de::Error>(self) -> Result<Unique, E> {
            Ok(Unique)
        }
        fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Unique, A::Error> {
            while seq.next_element::<Unique>()?.is_some() {}
            Ok(Unique)
        }
        fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Unique, A::Error> {
            let mut keys = HashSet::new();
            while let Some(key) = map.next_key::<String>()? {
                if !keys.insert(key) {
                    return Err(de::Error::custom("a repeated key"));
                }
                map.next_value::<Unique>()?;
            }
            Ok(Unique)
        }
    }
    serde_json::from_slice::<Unique>(body).is_ok()
}

/// The shapes `model_policy` promises, read independently on serde_json's `Value`.
fn well_shaped(endpoint: Endpoint, body: &Value) -> bool {
    let Some(body) = body.as_object() else {
        return false;
    };
    if body.get("model").is_some_and(|m| !m.is_string()) {
        return false;
    }
    let integer = |v: &Value| v.is_i64() || v.is_u64();
    match endpoint {
        Endpoint::Chat => {
            let message = |m: &Value| {
                m.as_object().is_some_and(|m| {
                    m.get("role").is_some_and(Value::is_string)
                        && match m.get("content") {
                            None | Some(Value::Null | Value::String(_)) => true,
                            Some(Value::Array(parts)) => parts.iter().all(Value::is_object),
                            Some(_) => false,
                        }
                })
            };
            body.get("stream").is_none_or(Value::is_boolean)
                && body
                    .get("messages")
                    .and_then(Value::as_array)
                    .is_some_and(|ms| !ms.is_empty() && ms.iter().all(message))
        }
        Endpoint::Embeddings => match body.get("input") {
            Some(Value::String(_)) => true,
            // All strings, all integers, or all arrays of integers.
            Some(Value::Array(items)) => {
                let kind = |v: &Value| match v {
                    Value::String(_) => Some(0),
                    v if integer(v) => Some(1),
                    Value::Array(tokens) if tokens.iter().all(integer) => Some(2),
                    _ => None,
                };
                let kinds: Option<Vec<_>> = items.iter().map(kind).collect();
                kinds.is_some_and(|k| k.windows(2).all(|w| w[0] == w[1]))
            }
            _ => false,
        },
    }
}

/// A changed body means what the original meant with `model` set to `expected`, and differs
/// from it in one place only: the original's model token, or an insertion when it had none.
fn assert_rewrite(original: &[u8], value: &Value, new: &[u8], expected: &str) {
    let new_value: Value = serde_json::from_slice(new).expect("a changed body is JSON");
    let mut wanted = value.clone();
    wanted["model"] = Value::from(expected);
    assert_eq!(new_value, wanted, "a changed body means something else");
    // The bytes outside the change: common prefix and suffix, not overlapping.
    let prefix = common_len(original.iter(), new.iter());
    let suffix = common_len(original[prefix..].iter().rev(), new[prefix..].iter().rev());
    let removed = prefix..original.len() - suffix;
    let added = new.len() - suffix - prefix;
    let new_token = serde_json::to_string(expected).unwrap();
    let model_token = top_level_members(original)
        .expect("an accepted body is an object")
        .into_iter()
        .find(|(key, _)| key == "model");
    match model_token {
        // A default went in and nothing came out.
        None => {
            assert!(removed.is_empty(), "a default insertion removed bytes");
            assert_eq!(added, format!("\"model\":{new_token},").len());
        }
        // Only bytes of the model token changed, and only to the new token's.
        Some((_, token)) => {
            let start = token.get().as_ptr() as usize - original.as_ptr() as usize;
            let end = start + token.get().len();
            assert!(
                start <= removed.start && removed.end <= end,
                "bytes outside the model token changed"
            );
            assert!(added <= new_token.len());
            assert_eq!(
                new.len() + token.get().len(),
                original.len() + new_token.len()
            );
        }
    }
}

fn common_len<'a>(a: impl Iterator<Item = &'a u8>, b: impl Iterator<Item = &'a u8>) -> usize {
    a.zip(b).take_while(|(x, y)| x == y).count()
}

/// The root object's members in order, duplicates included, each value as its raw text
/// within `body`; None when `body` is not a JSON object (as serde_json reads it).
fn top_level_members(body: &[u8]) -> Option<Vec<(String, &RawValue)>> {
    struct Members<'a>(Vec<(String, &'a RawValue)>);
    impl<'de> Deserialize<'de> for Members<'de> {
        fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
            struct MembersVisitor;
            impl<'de> Visitor<'de> for MembersVisitor {
                type Value = Members<'de>;
                fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                    f.write_str("a JSON object")
                }
                fn visit_map<A: MapAccess<'de>>(
                    self,
                    mut map: A,
                ) -> Result<Members<'de>, A::Error> {
                    let mut members = Vec::new();
                    while let Some(member) = map.next_entry()? {
                        members.push(member);
                    }
                    Ok(Members(members))
                }
            }
            deserializer.deserialize_map(MembersVisitor)
        }
    }
    serde_json::from_slice::<Members>(body).ok().map(|m| m.0)
}

/// Largest `usage` object the scanner reads (its documented 4 KiB).
const USAGE_CAP: usize = 4096;

/// `UsageScanner` on an arbitrary response body: the chunking never changes the usage (whole,
/// cut once where the first byte says, a byte at a time, chunk sizes drawn from the data),
/// nor does compressing the body; where serde_json can read the body, the usage is the one it
/// finds; and the bytes fed as a gzip or deflate body (garbage, almost always) never panic.
pub fn usage_scanner(data: &[u8]) {
    let cut = data.first().map_or(1, |&b| usize::from(b) % data.len());
    let drawn: Vec<usize> = data.iter().take(16).map(|&b| usize::from(b % 32)).collect();
    let compressed = compressed(data);
    for framing in [Framing::Json, Framing::EventStream] {
        let usage = |encoding, body: &[u8], sizes: &[usize]| {
            usage_in_chunks(framing, encoding, body, sizes)
        };
        let whole = usage(Encoding::Identity, data, &[data.len()]);
        let cut_once = usage(Encoding::Identity, data, &[cut, data.len()]);
        assert_eq!(cut_once, whole, "{framing:?}: cut at {cut}");
        assert_eq!(
            usage(Encoding::Identity, data, &drawn),
            whole,
            "{framing:?}: {drawn:?}"
        );
        if data.len() <= 1024 {
            assert_eq!(
                usage(Encoding::Identity, data, &[1]),
                whole,
                "{framing:?}: bytewise"
            );
        }
        let reference = match framing {
            Framing::Json => json_usage(data),
            Framing::EventStream => event_stream_usage(data),
        };
        if let Some(reference) = reference {
            assert_eq!(
                whole, reference,
                "{framing:?}: not the usage serde_json reads"
            );
        }
        for (encoding, body) in &compressed {
            let cut = cut % body.len().max(1);
            assert_eq!(
                usage(*encoding, body, &[body.len()]),
                whole,
                "{framing:?} {encoding:?}"
            );
            let cut_once = usage(*encoding, body, &[cut, body.len()]);
            assert_eq!(cut_once, whole, "{framing:?} {encoding:?}: cut at {cut}");
        }
        for encoding in [Encoding::Gzip, Encoding::Deflate] {
            usage(encoding, data, &[data.len()]);
            usage(encoding, data, &[cut, data.len()]);
            usage(encoding, data, &drawn);
        }
    }
}

/// Feeds `body` in chunks of the given sizes (cycled; 0 counts as 1), then asks for the usage.
pub(crate) fn usage_in_chunks(
    framing: Framing,
    encoding: Encoding,
    body: &[u8],
    sizes: &[usize],
) -> Option<Usage> {
    let mut scanner = UsageScanner::new(framing, encoding);
    let mut rest = body;
    for &size in sizes.iter().cycle() {
        if rest.is_empty() {
            break;
        }
        let (chunk, tail) = rest.split_at(size.clamp(1, rest.len()));
        scanner.feed(chunk);
        rest = tail;
    }
    scanner.usage()
}

/// `body` as a gzip, a zlib-wrapped deflate and a raw deflate response body.
fn compressed(body: &[u8]) -> [(Encoding, Vec<u8>); 3] {
    let level = flate2::Compression::fast();
    let mut gzip = GzEncoder::new(Vec::new(), level);
    let mut zlib = ZlibEncoder::new(Vec::new(), level);
    let mut raw = DeflateEncoder::new(Vec::new(), level);
    gzip.write_all(body).unwrap();
    zlib.write_all(body).unwrap();
    raw.write_all(body).unwrap();
    [
        (Encoding::Gzip, gzip.finish().unwrap()),
        (Encoding::Deflate, zlib.finish().unwrap()),
        (Encoding::Deflate, raw.finish().unwrap()),
    ]
}

/// The usage of one JSON document as serde_json reads it: Some(None) when it is no object
/// (the scanner ignores it); None when that cannot be told: it starts as an object but
/// serde_json refuses it (not JSON, or nested deeper than serde_json's limit, or a lone
/// surrogate escape: the scanner checks neither).
fn json_usage(document: &[u8]) -> Option<Option<Usage>> {
    let start = document.iter().find(|b| !b" \t\n\r".contains(b));
    if start != Some(&b'{') {
        return Some(None);
    }
    let mut usage = None;
    // The last usage object wins; one that is not an object or is too long is passed over.
    for (key, raw) in top_level_members(document)? {
        let raw = raw.get();
        if key == "usage" && raw.starts_with('{') && raw.len() <= USAGE_CAP {
            let object: Value = serde_json::from_str(raw).ok()?;
            let count = |name| object.get(name).and_then(Value::as_u64);
            usage = Some(Usage {
                prompt_tokens: count("prompt_tokens"),
                completion_tokens: count("completion_tokens"),
            });
        }
    }
    Some(usage)
}

/// The usage of an event stream, read as WHATWG says (one BOM skipped; lines end in CRLF, LF
/// or CR; a `data` field's value loses one leading space; an event's data lines are joined
/// with LF) and each event's data by `json_usage`. The event the stream ends in counts even
/// without its blank line, as the scanner reads usage as soon as it is complete.
fn event_stream_usage(stream: &[u8]) -> Option<Option<Usage>> {
    let stream = stream.strip_prefix(b"\xEF\xBB\xBF").unwrap_or(stream);
    let mut usage = None;
    let mut data: Option<Vec<u8>> = None;
    let mut end_event = |data: &mut Option<Vec<u8>>| -> Option<()> {
        if let Some(data) = data.take() {
            usage = json_usage(&data)?.or(usage);
        }
        Some(())
    };
    let mut rest = stream;
    while !rest.is_empty() {
        let eol = rest.iter().position(|&b| b == b'\n' || b == b'\r');
        let line = &rest[..eol.unwrap_or(rest.len())];
        rest = match eol {
            Some(at) if rest[at..].starts_with(b"\r\n") => &rest[at + 2..],
            Some(at) => &rest[at + 1..],
            None => &[],
        };
        if line.is_empty() {
            end_event(&mut data)?;
            continue;
        }
        let (field, value) = match line.iter().position(|&b| b == b':') {
            Some(colon) => {
                let value = &line[colon + 1..];
                (&line[..colon], value.strip_prefix(b" ").unwrap_or(value))
            }
            None => (line, &[][..]),
        };
        if field == b"data" {
            match &mut data {
                Some(data) => {
                    data.push(b'\n');
                    data.extend_from_slice(value);
                }
                None => data = Some(value.to_vec()),
            }
        }
    }
    end_event(&mut data)?;
    Some(usage)
}
