//! One line of the access log. Never a token, secret, upstream credential, query or body.
//!
//! Every line has the common fields; a request adds its HTTP fields, a proxied request the
//! upstream's and the usage's, a key event the key's. A group that does not apply is left out
//! of the line, while a field of a group that applies is written as null when unknown.

use std::borrow::Cow;
use std::io::Write;
use std::net::IpAddr;
use std::time::{Duration, SystemTime};

use serde::{Serialize, Serializer};

use crate::store::Budget;

/// Longest path logged; longer ones are cut (on a character boundary) so one request cannot
/// write a megabyte line.
const MAX_PATH: usize = 2048;
/// Longest model name logged, for the same reason: the client writes it.

#[derive(Serialize)]
pub(crate) struct Record<'a> {
    /// When the request started: RFC 3339, UTC, milliseconds.
    pub time: Time,
    pub request_id: &'a str,
    /// The bounded metrics label: a registered service, `_local`, `_unknown`, `_admin`, `_cli`.
    pub service: &'a str,
    /// `api_key`, `jwt` (or `cli` for the command line), once known.
    pub principal_kind: Option<&'static str>,
    /// The key id (never the secret), the JWT `sub`, or the user running the CLI.
    pub principal_id: Option<&'a str>,
    #[serde(flatten)]
    pub http: Option<HttpFields<'a>>,
    #[serde(flatten)]
    pub proxied: Option<ProxiedFields<'a>>,
    #[serde(flatten)]
    pub key_event: Option<KeyEventFields<'a>>,
}

/// What every HTTP request logs, on the data plane and the admin listener.
#[derive(Serialize)]
pub(crate) struct HttpFields<'a> {
    pub method: &'a str,
    /// The request path without its query string (`path_only`).
    pub path: Cow<'a, str>,
    /// 0 when no response was sent (the client left first).
    pub status: u16,
    pub duration_ms: f64,
    pub client: Option<IpAddr>,
    /// Why authentication failed: `missing`, `malformed`, `api_key` or `jwt`.
    pub auth_failure: Option<&'static str>,
}

/// What a data-plane request logs besides.
#[derive(Serialize)]
pub(crate) struct ProxiedFields<'a> {
    pub upstream_ttfb_ms: Option<f64>,
    /// Request body bytes read from the client.
    pub bytes_in: u64,
    /// Response body bytes sent to the client.
    pub bytes_out: u64,
    /// On the endpoints the gateway reads: the model after the policy (cut by
    /// `model_name`), and the usage the upstream reported (or the estimate of a stream that
    /// ended without one, then `usage_estimated`); null when unknown.
    pub model: Option<&'a str>,
    pub prompt_tokens: Option<u64>,
    pub completion_tokens: Option<u64>,
    pub reasoning_tokens: Option<u64>,
    pub cached_tokens: Option<u64>,
    pub usage_estimated: bool,
    /// Whom the request is billed to: the key's owner or the JWT's `sub`.
    pub owner: Option<&'a str>,
    /// The configured `host:port` of the replica the request went to last; null if none.
    pub replica: Option<&'a str>,
    /// On a `prefix_affinity` service: `hit`, `spill` or `none` (as
    /// `portcullis_affinity_total`); null on other services.
    pub affinity: Option<&'static str>,
    /// A call translated to another API (`messages>chat`); absent when not translated.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub translated: Option<&'static str>,
    /// With `[pricing]`, on a request the ledger charges: what it cost in the table's
    /// currency, `null` when unpriced; absent otherwise.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cost: Option<Option<serde_json::Number>>,
}

/// A key created or revoked, or a budget changed, through the key API or the CLI.
#[derive(Serialize)]
pub(crate) struct KeyEventFields<'a> {
    /// `created`, `revoked`, `budget` or `team` (an owner put in a team or taken out).
    pub key_event: &'static str,
    /// The key concerned; left out of an owner's budget change.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub key_id: Option<&'a str>,
    /// The owner whose budget changed; only on an owner's budget change.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub budget_owner: Option<&'a str>,
    /// The team whose budget changed, or (on `team`) the owner's team now, `null` for none.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub team: Option<Option<&'a str>>,
    /// On `team`: the owner put in a team or taken out.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub member: Option<&'a str>,
    /// On a budget change, and a key created with a budget: the limits now set, `null` once
    /// cleared.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub budget: Option<Option<Budget>>,
}

impl<'a> KeyEventFields<'a> {
    /// A key created or revoked, or its budget changed.
    pub(crate) fn key(key_event: &'static str, key_id: &'a str) -> KeyEventFields<'a> {
        KeyEventFields {
            key_event,
            key_id: Some(key_id),
            budget_owner: None,
            team: None,
            member: None,
            budget: None,
        }
    }
}

/// A line's time, written as `rfc3339_millis` straight into the line.
#[derive(Clone, Copy)]
pub(crate) struct Time(pub SystemTime);

impl Serialize for Time {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let mut buf = [0; crate::time::RFC3339_MILLIS_MAX];
        s.serialize_str(crate::time::rfc3339_millis_into(self.0, &mut buf))
    }
}

impl Record<'_> {
    /// The JSON line, newline included. serde_json escapes whatever odd bytes a path held.
    pub(crate) fn to_line(&self) -> Vec<u8> {
        let mut line = Vec::with_capacity(384);
        self.write_line(&mut line);
        line
    }

    /// The line appended to `out`, newline included: what the access log's per-thread buffer
    /// takes, with no allocation but the buffer's own growth (every field is borrowed, the
    /// time written from the stack, numbers by serde_json's own formatting).
    pub(crate) fn write_line(&self, out: &mut Vec<u8>) {
        if self.key_event.is_some() {
            // Rare (the key API's and the CLI's lines), and a budget is serde's to write.
            // Serialising plain fields into a Vec cannot fail.
            let _ = serde_json::to_writer(&mut *out, self);
        } else {
            self.write_request(out);
        }
        out.push(b'\n');
    }

    /// A request's line by hand: the keys as literals and only values escaped, the same bytes
    /// as serde_json writes for it (`lines_are_written_byte_for_byte_as_serde_writes_them`),
    /// at a fraction of the cost (serde_json escapes every key and value a byte at a time).
    fn write_request(&self, out: &mut Vec<u8>) {
        let mut time = [0; crate::time::RFC3339_MILLIS_MAX];
        out.extend_from_slice(b"{\"time\":");
        json_str(
            out,
            crate::time::rfc3339_millis_into(self.time.0, &mut time),
        );
        out.extend_from_slice(b",\"request_id\":");
        json_str(out, self.request_id);
        out.extend_from_slice(b",\"service\":");
        json_str(out, self.service);
        out.extend_from_slice(b",\"principal_kind\":");
        json_opt_str(out, self.principal_kind);
        out.extend_from_slice(b",\"principal_id\":");
        json_opt_str(out, self.principal_id);
        if let Some(h) = &self.http {
            out.extend_from_slice(b",\"method\":");
            json_str(out, h.method);
            out.extend_from_slice(b",\"path\":");
            json_str(out, &h.path);
            out.extend_from_slice(b",\"status\":");
            json_number(out, h.status);
            out.extend_from_slice(b",\"duration_ms\":");
            json_number(out, h.duration_ms);
            out.extend_from_slice(b",\"client\":");
            match h.client {
                Some(ip) => {
                    // An address's text needs no escaping.
                    out.push(b'"');
                    ip_text(out, ip);
                    out.push(b'"');
                }
                None => out.extend_from_slice(b"null"),
            }
            out.extend_from_slice(b",\"auth_failure\":");
            json_opt_str(out, h.auth_failure);
        }
        if let Some(p) = &self.proxied {
            out.extend_from_slice(b",\"upstream_ttfb_ms\":");
            json_number(out, p.upstream_ttfb_ms);
            out.extend_from_slice(b",\"bytes_in\":");
            json_number(out, p.bytes_in);
            out.extend_from_slice(b",\"bytes_out\":");
            json_number(out, p.bytes_out);
            out.extend_from_slice(b",\"model\":");
            json_opt_str(out, p.model);
            out.extend_from_slice(b",\"prompt_tokens\":");
            json_number(out, p.prompt_tokens);
            out.extend_from_slice(b",\"completion_tokens\":");
            json_number(out, p.completion_tokens);
            out.extend_from_slice(b",\"reasoning_tokens\":");
            json_number(out, p.reasoning_tokens);
            out.extend_from_slice(b",\"cached_tokens\":");
            json_number(out, p.cached_tokens);
            out.extend_from_slice(b",\"usage_estimated\":");
            out.extend_from_slice(if p.usage_estimated { b"true" } else { b"false" });
            out.extend_from_slice(b",\"owner\":");
            json_opt_str(out, p.owner);
            out.extend_from_slice(b",\"replica\":");
            json_opt_str(out, p.replica);
            out.extend_from_slice(b",\"affinity\":");
            json_opt_str(out, p.affinity);
            if let Some(pair) = p.translated {
                out.extend_from_slice(b",\"translated\":");
                json_str(out, pair);
            }
            if let Some(cost) = &p.cost {
                out.extend_from_slice(b",\"cost\":");
                json_number(out, cost);
            }
        }
        out.push(b'}');
    }
}

/// A number (or null) as serde_json writes it; numbers need no escaping.
fn json_number<T: Serialize>(out: &mut Vec<u8>, n: T) {
    let _ = serde_json::to_writer(&mut *out, &n);
}

fn json_opt_str(out: &mut Vec<u8>, s: Option<&str>) {
    match s {
        Some(s) => json_str(out, s),
        None => out.extend_from_slice(b"null"),
    }
}

/// The bytes a JSON string escapes: control characters, `"` and `\\`.
static ESCAPED: [bool; 256] = {
    let mut table = [false; 256];
    let mut b = 0;
    while b < 0x20 {
        table[b] = true;
        b += 1;
    }
    table[b'"' as usize] = true;
    table[b'\\' as usize] = true;
    table
};

/// An address as its `Display` writes it; an IPv4 one without the formatting machinery
/// (a tenth of its cost), the rarer IPv6 through it.
fn ip_text(out: &mut Vec<u8>, ip: IpAddr) {
    match ip {
        IpAddr::V4(v4) => {
            for (n, octet) in v4.octets().into_iter().enumerate() {
                if n > 0 {
                    out.push(b'.');
                }
                if octet >= 100 {
                    out.push(b'0' + octet / 100);
                }
                if octet >= 10 {
                    out.push(b'0' + octet / 10 % 10);
                }
                out.push(b'0' + octet % 10);
            }
        }
        IpAddr::V6(_) => {
            let _ = write!(out, "{ip}");
        }
    }
}

/// A JSON string as serde_json writes it: `"` and `\\` escaped, control characters as `\n`,
/// `\t` … or `\u00xx`, everything else as it is; runs without such bytes copied whole.
fn json_str(out: &mut Vec<u8>, s: &str) {
    out.push(b'"');
    let bytes = s.as_bytes();
    let mut start = 0;
    for (i, &b) in bytes.iter().enumerate() {
        if !ESCAPED[usize::from(b)] {
            continue;
        }
        out.extend_from_slice(&bytes[start..i]);
        match b {
            b'"' => out.extend_from_slice(b"\\\""),
            b'\\' => out.extend_from_slice(b"\\\\"),
            b'\n' => out.extend_from_slice(b"\\n"),
            b'\r' => out.extend_from_slice(b"\\r"),
            b'\t' => out.extend_from_slice(b"\\t"),
            0x08 => out.extend_from_slice(b"\\b"),
            0x0c => out.extend_from_slice(b"\\f"),
            _ => {
                const HEX: &[u8; 16] = b"0123456789abcdef";
                out.extend_from_slice(b"\\u00");
                out.push(HEX[usize::from(b >> 4)]);
                out.push(HEX[usize::from(b & 0xf)]);
            }
        }
        start = i + 1;
    }
    out.extend_from_slice(&bytes[start..]);
    out.push(b'"');
}

/// The path without its query, lossily decoded and capped: what any log line may show.
pub(crate) fn path_only(raw: &[u8]) -> Cow<'_, str> {
    let end = raw.iter().position(|&b| b == b'?').unwrap_or(raw.len());
    match String::from_utf8_lossy(&raw[..end]) {
        Cow::Borrowed(path) => Cow::Borrowed(cut(path, MAX_PATH)),
        Cow::Owned(path) if path.len() <= MAX_PATH => Cow::Owned(path),
        Cow::Owned(path) => Cow::Owned(cut(&path, MAX_PATH).to_string()),
    }
}

/// `s` cut to at most `max` bytes, on a character boundary.
fn cut(s: &str, max: usize) -> &str {
    if s.len() <= max {
        return s;
    }
    let mut end = max;
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    &s[..end]
}

/// Milliseconds with microsecond precision, as every duration in the log is written.
pub(crate) fn millis(d: Duration) -> f64 {
    d.as_micros() as f64 / 1000.0
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn paths_lose_their_query_and_are_capped() {
        assert_eq!(path_only(b"/v1/infer/x?key=secret"), "/v1/infer/x");
        assert_eq!(path_only(b"/a/\xff\x01b"), "/a/\u{fffd}\u{1}b");
        let long = "é".repeat(MAX_PATH);
        let cut = path_only(long.as_bytes());
        assert!(cut.len() <= MAX_PATH && cut.chars().all(|c| c == 'é'));
    }

    /// A data-plane line with every group, odd bytes in its path, a query cut off.
    fn proxied<'a>(path: Cow<'a, str>, cost: Option<Option<serde_json::Number>>) -> Record<'a> {
        Record {
            time: Time(std::time::UNIX_EPOCH + Duration::from_millis(1_795_000_000_042)),
            request_id: "r-1",
            service: "infer",
            principal_kind: Some("api_key"),
            principal_id: Some("k1"),
            http: Some(HttpFields {
                method: "POST",
                path,
                status: 200,
                duration_ms: millis(Duration::from_micros(12_345)),
                client: Some("::1".parse().unwrap()),
                auth_failure: None,
            }),
            proxied: Some(ProxiedFields {
                upstream_ttfb_ms: Some(1.5),
                bytes_in: 10,
                bytes_out: 0,
                model: Some("gpt"),
                prompt_tokens: Some(3),
                completion_tokens: None,
                reasoning_tokens: None,
                cached_tokens: Some(0),
                usage_estimated: false,
                owner: Some("alice"),
                replica: None,
                affinity: Some("hit"),
                translated: None,
                cost,
            }),
            key_event: None,
        }
    }

    /// Every byte below 0x80 and a few non-ASCII characters in every string field, each
    /// optional field present and absent, IPv4 and IPv6, odd floats: the hand-written line is
    /// serde_json's, byte for byte.
    #[test]
    fn lines_are_written_byte_for_byte_as_serde_writes_them() {
        let odd: String = (0u8..0x80)
            .map(char::from)
            .chain("é\u{fffd}\u{2028}😀".chars())
            .collect();
        let units = crate::pricing::money::units;
        for (n, text) in ["", "plain", odd.as_str(), "\"\\\u{7f}"]
            .into_iter()
            .enumerate()
        {
            let mut r = proxied(Cow::Borrowed(text), Some(Some(units(n as u64 * 333_333))));
            r.request_id = text;
            r.principal_id = Some(text).filter(|_| n % 2 == 0);
            let (Some(h), Some(p)) = (r.http.as_mut(), r.proxied.as_mut()) else {
                unreachable!()
            };
            h.method = text;
            h.client = ["", "10.0.0.1", "::1", "255.100.9.199"].map(|ip| ip.parse().ok())[n];
            if n == 2 {
                // Both kinds and every octet width, each against serde.
                for ip in ["0.0.0.0", "1.22.255.9", "fe80::1:2"] {
                    let mut one = proxied(Cow::Borrowed(text), None);
                    one.http.as_mut().unwrap().client = ip.parse().ok();
                    let mut by_hand = Vec::new();
                    one.write_line(&mut by_hand);
                    let mut by_serde = serde_json::to_vec(&one).unwrap();
                    by_serde.push(b'\n');
                    assert_eq!(by_hand, by_serde, "{ip}");
                }
            }
            h.duration_ms = [0.0, 0.001, 1e21, 123_456.789][n];
            h.auth_failure = Some("api_key").filter(|_| n == 1);
            p.model = Some(text);
            p.owner = Some(text).filter(|_| n != 2);
            p.replica = Some(text);
            p.upstream_ttfb_ms = [None, Some(f64::NAN), Some(0.5), Some(f64::INFINITY)][n];
            p.usage_estimated = n % 2 == 1;
            p.translated = Some("messages>chat").filter(|_| n > 1);
            p.cost = [None, Some(None), p.cost.clone(), p.cost.clone()][n].clone();
            let mut by_hand = Vec::new();
            r.write_line(&mut by_hand);
            let mut by_serde = serde_json::to_vec(&r).unwrap();
            by_serde.push(b'\n');
            assert_eq!(
                String::from_utf8_lossy(&by_hand),
                String::from_utf8_lossy(&by_serde)
            );
            for http in [true, false] {
                let mut fewer = proxied(Cow::Borrowed(text), None);
                fewer.proxied = None;
                if !http {
                    fewer.http = None;
                    fewer.principal_kind = None;
                }
                let mut by_hand = Vec::new();
                fewer.write_line(&mut by_hand);
                let mut by_serde = serde_json::to_vec(&fewer).unwrap();
                by_serde.push(b'\n');
                assert_eq!(by_hand, by_serde);
            }
        }
    }

    /// The bytes the lines had when each was a `String` time and a `serde_json::Value` cost,
    /// serialised into a fresh Vec: the same now, written into a buffer.
    #[test]
    fn lines_are_written_byte_for_byte_as_before() {
        let path = path_only(b"/v1/a\"b\\c\x01\xff\xc3\xa9?key=secret");
        let head = concat!(
            r#"{"time":"2026-11-18T11:06:40.042Z","request_id":"r-1","service":"infer","#,
            r#""principal_kind":"api_key","principal_id":"k1","method":"POST","#,
            r#""path":"/v1/a\"b\\c\u0001"#,
            "\u{fffd}\u{e9}",
            r#"","status":200,"duration_ms":12.345,"#,
            r#""client":"::1","auth_failure":null,"upstream_ttfb_ms":1.5,"bytes_in":10,"#,
            r#""bytes_out":0,"model":"gpt","prompt_tokens":3,"completion_tokens":null,"#,
            r#""reasoning_tokens":null,"cached_tokens":0,"usage_estimated":false,"#,
            r#""owner":"alice","replica":null,"affinity":"hit""#,
        );
        let units = crate::pricing::money::units;
        for (cost, tail) in [
            (None, "}"),
            (Some(None), r#","cost":null}"#),
            (Some(Some(units(1_500_000))), r#","cost":1.5}"#),
            (Some(Some(units(2_000_000))), r#","cost":2}"#),
            (Some(Some(units(1))), r#","cost":1e-6}"#),
        ] {
            // What the `serde_json::Value` of before wrote for the cost.
            if let Some(c) = &cost {
                let before = match c {
                    None => serde_json::Value::Null,
                    Some(n) => serde_json::Value::Number(n.clone()),
                };
                assert!(tail.contains(&format!(r#""cost":{before}"#)), "{tail}");
            }
            let line = proxied(path.clone(), cost).to_line();
            assert_eq!(String::from_utf8(line).unwrap(), format!("{head}{tail}\n"));
        }
        // Appended to what a buffer holds already, as the access log's buffers take lines.
        let mut buf = b"x\n".to_vec();
        proxied(path.clone(), None).write_line(&mut buf);
        assert_eq!(buf, [&b"x\n"[..], head.as_bytes(), b"}\n"].concat());
    }

    #[test]
    fn groups_that_do_not_apply_are_left_out_and_unknown_fields_are_null() {
        let line = Record {
            time: Time(std::time::UNIX_EPOCH),
            request_id: "r",
            service: "_cli",
            principal_kind: Some("cli"),
            principal_id: None,
            http: None,
            proxied: None,
            key_event: Some(KeyEventFields::key("revoked", "k")),
        }
        .to_line();
        let v: serde_json::Value = serde_json::from_slice(&line).unwrap();
        let keys: Vec<&str> = v.as_object().unwrap().keys().map(|k| k.as_str()).collect();
        let mut want = [
            "time",
            "request_id",
            "service",
            "principal_kind",
            "principal_id",
            "key_event",
            "key_id",
        ];
        want.sort();
        let mut got = keys.clone();
        got.sort();
        assert_eq!(got, want);
        assert!(v["principal_id"].is_null());
    }

    #[test]
    fn budget_events_name_the_key_or_the_owner_and_the_budget_or_null() {
        let line = |fields: KeyEventFields| {
            let line = Record {
                time: Time(std::time::UNIX_EPOCH),
                request_id: "r",
                service: "_admin",
                principal_kind: Some("jwt"),
                principal_id: Some("root"),
                http: None,
                proxied: None,
                key_event: Some(fields),
            }
            .to_line();
            serde_json::from_slice::<serde_json::Value>(&line).unwrap()
        };
        let budget = Budget::from_limits([None, Some(100), None, Some(5), None, None]);
        let v = line(KeyEventFields {
            budget: Some(Some(budget)),
            ..KeyEventFields::key("budget", "k")
        });
        assert_eq!(v["key_id"], "k");
        assert_eq!(
            v["budget"],
            serde_json::json!({"tokens_per_day": 100, "requests_per_day": 5})
        );
        assert!(v.get("budget_owner").is_none());
        let v = line(KeyEventFields {
            key_event: "budget",
            key_id: None,
            budget_owner: Some("alice"),
            team: None,
            member: None,
            budget: Some(None),
        });
        assert_eq!(v["budget_owner"], "alice");
        assert!(v["budget"].is_null() && v.get("key_id").is_none(), "{v}");
    }
}
