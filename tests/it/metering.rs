//! The metering conformance matrix against the real binary and the fake OpenAI-style upstream
//! (which states its own token counts): {chat, completions, embeddings} × {JSON, SSE asking
//! for usage, SSE not asking, SSE abandoned} × {identity, gzip, deflate, br, zstd asked for by
//! the client} × {plain path, percent-encoded path}. Every response is metered exactly (or
//! estimated, for abandoned streams), and the client receives what it would have received
//! from the upstream directly: the gateway's own `include_usage` leaves no trace.

use std::collections::HashMap;
use std::path::Path;
use std::time::{Duration, Instant};

use serde_json::{json, Value};
use testkit::upstream::{
    Coding, Usage, CHAT_JSON_USAGE, CHAT_SSE_USAGE, COMPLETIONS_JSON_USAGE, COMPLETIONS_SSE_USAGE,
    EMBEDDINGS_USAGE,
};
use testkit::{Gateway, Service, Upstream};

use crate::ledger::{total, usage_cli, wait_for};

#[derive(Debug, Clone, Copy, PartialEq)]
enum Endpoint {
    Chat,
    Completions,
    Embeddings,
}

#[derive(Debug, Clone, Copy, PartialEq)]
enum Mode {
    Json,
    /// Streamed, `stream_options.include_usage: true` sent by the client.
    SseAsks,
    /// Streamed without `stream_options`: the gateway must ask for usage itself.
    Sse,
    /// Streamed without `stream_options`, the client leaving after a few events.
    SseAbandoned,
}

const CODINGS: [&str; 5] = ["identity", "gzip", "deflate", "br", "zstd"];

impl Endpoint {
    /// The forwarded path, plain or with a percent-encoded letter.
    fn path(self, encoded: bool) -> &'static str {
        match (self, encoded) {
            (Endpoint::Chat, false) => "/v1/chat/completions",
            (Endpoint::Chat, true) => "/v1/chat/%63ompletions",
            (Endpoint::Completions, false) => "/v1/completions",
            (Endpoint::Completions, true) => "/v1/%63ompletions",
            (Endpoint::Embeddings, false) => "/v1/embeddings",
            (Endpoint::Embeddings, true) => "/v1/embedding%73",
        }
    }

    fn body(self, mode: Mode) -> Value {
        let mut body = match self {
            Endpoint::Chat => {
                json!({"model": "m1", "messages": [{"role": "user", "content": "hi"}]})
            }
            Endpoint::Completions => json!({"model": "m1", "prompt": "Say hi"}),
            Endpoint::Embeddings => json!({"model": "e1", "input": ["a", "b"]}),
        };
        if mode != Mode::Json {
            body["stream"] = json!(true);
        }
        if mode == Mode::SseAsks {
            body["stream_options"] = json!({"include_usage": true});
        }
        body
    }

    fn usage(self, mode: Mode) -> Usage {
        match (self, mode) {
            (Endpoint::Chat, Mode::Json) => CHAT_JSON_USAGE,
            (Endpoint::Chat, _) => CHAT_SSE_USAGE,
            (Endpoint::Completions, Mode::Json) => COMPLETIONS_JSON_USAGE,
            (Endpoint::Completions, _) => COMPLETIONS_SSE_USAGE,
            (Endpoint::Embeddings, _) => EMBEDDINGS_USAGE,
        }
    }
}

fn gateway(up: &Upstream) -> (Gateway, String) {
    let gw = Gateway::builder()
        .service(Service::new("m", up.url("/oa/m")).openai())
        // The estimates of abandoned streams are what these tests check: no reading on after
        // the client left (budgets::worst_case tests the tail).
        .extra("[access_log]\ndestination = \"{dir}/access.log\"\n[metering]\ntail_seconds = 0\n")
        .start();
    let (key, _) = gw.create_key("m", &[]);
    (gw, key)
}

/// A response body as the client got it, decoded per its Content-Encoding.
pub(crate) fn decoded(resp_coding: Option<&str>, body: &[u8]) -> Vec<u8> {
    let coding = resp_coding.map_or(Coding::Identity, |c| Coding::parse(c).expect("a coding"));
    coding.decode(body).expect("decodable")
}

pub(crate) struct Sent {
    pub status: u16,
    pub coding: Option<String>,
    pub body: Vec<u8>,
}

pub(crate) async fn send(
    url: &str,
    key: Option<&str>,
    body: &Value,
    accept: &str,
    id: &str,
) -> Sent {
    let mut req = testkit::client()
        .post(url)
        .header("content-type", "application/json")
        .header("accept-encoding", accept)
        .header("x-request-id", id)
        .body(body.to_string());
    if let Some(key) = key {
        req = req.bearer_auth(key);
    }
    let resp = req.send().await.unwrap();
    let status = resp.status().as_u16();
    let coding = (resp.headers().get("content-encoding")).map(|v| v.to_str().unwrap().to_string());
    let body = resp.bytes().await.unwrap().to_vec();
    Sent {
        status,
        coding,
        body,
    }
}

/// Reads `events` SSE events of a stream, then leaves; how many it read.
pub(crate) async fn abandon(
    url: &str,
    key: &str,
    body: &Value,
    accept: &str,
    id: &str,
    events: usize,
) {
    let mut resp = testkit::client()
        .post(url)
        .bearer_auth(key)
        .header("accept-encoding", accept)
        .header("x-request-id", id)
        .body(body.to_string())
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 200, "{id}");
    let mut seen = Vec::new();
    while seen.windows(2).filter(|w| w == b"\n\n").count() < events {
        let chunk = resp.chunk().await.unwrap().expect("the stream ended early");
        seen.extend_from_slice(&chunk);
    }
    drop(resp);
}

pub(crate) fn access_log(path: &Path, ids: &[impl AsRef<str>]) -> HashMap<String, Value> {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let text = std::fs::read_to_string(path).unwrap_or_default();
        let lines: HashMap<String, Value> = text
            .lines()
            .map(|l| serde_json::from_str::<Value>(l).unwrap())
            .map(|v| (v["request_id"].as_str().unwrap().to_string(), v))
            .collect();
        if ids.iter().all(|id| lines.contains_key(id.as_ref())) {
            return lines;
        }
        assert!(Instant::now() < deadline, "missing lines");
        std::thread::sleep(Duration::from_millis(50));
    }
}

fn metric(gw: &Gateway, name: &str, labels: &str) -> u64 {
    let needle = format!("{name}{{{labels}}} ");
    gw.metrics()
        .lines()
        .find_map(|l| l.strip_prefix(&needle))
        .map_or(0, |v| v.trim().parse().unwrap())
}

#[tokio::test(flavor = "multi_thread")]
async fn every_response_is_metered_and_the_client_sees_no_trace_of_it() {
    let up = Upstream::start();
    let (gw, key) = gateway(&up);
    let mut exact: Vec<(String, Usage)> = Vec::new();
    let mut abandoned: Vec<(String, usize)> = Vec::new();
    let (abandon_after, stream_len) = (3, 40);
    for endpoint in [Endpoint::Chat, Endpoint::Completions, Endpoint::Embeddings] {
        let modes: &[Mode] = match endpoint {
            Endpoint::Embeddings => &[Mode::Json],
            _ => &[Mode::Json, Mode::SseAsks, Mode::Sse, Mode::SseAbandoned],
        };
        for &mode in modes {
            for accept in CODINGS {
                for encoded in [false, true] {
                    let id = format!("{endpoint:?}-{mode:?}-{accept}-{encoded}");
                    let body = endpoint.body(mode);
                    let path = endpoint.path(encoded);
                    if mode == Mode::SseAbandoned {
                        let query = format!("?n={stream_len}&gap_ms=20");
                        let url = gw.url(&format!("/v1/m{path}{query}"));
                        abandon(&url, &key, &body, accept, &id, abandon_after).await;
                        abandoned.push((id, body.to_string().len()));
                        continue;
                    }
                    let through = send(
                        &gw.url(&format!("/v1/m{path}")),
                        Some(&key),
                        &body,
                        accept,
                        &id,
                    )
                    .await;
                    assert_eq!(
                        through.status,
                        200,
                        "{id}: {:?}",
                        String::from_utf8_lossy(&through.body)
                    );
                    // What the upstream answers the client's own request, asked directly.
                    let direct = send(
                        &up.url(&format!("/oa/m{path}")),
                        None,
                        &body,
                        accept,
                        "direct",
                    )
                    .await;
                    assert_eq!(direct.status, 200, "{id}: direct");
                    assert_eq!(
                        String::from_utf8(decoded(through.coding.as_deref(), &through.body))
                            .unwrap(),
                        String::from_utf8(decoded(direct.coding.as_deref(), &direct.body)).unwrap(),
                        "{id}: the client got something else than the upstream's own answer"
                    );
                    // The gateway let the upstream answer only in a coding it reads.
                    let coding = through.coding.as_deref().unwrap_or("identity");
                    assert!(
                        ["identity", "gzip", "deflate"].contains(&coding),
                        "{id}: {coding}"
                    );
                    exact.push((id, endpoint.usage(mode)));
                }
            }
        }
    }
    let mut ids: Vec<String> = exact.iter().map(|(id, _)| id.clone()).collect();
    ids.extend(abandoned.iter().map(|(id, _)| id.clone()));
    let log = access_log(&gw.dir.path().join("access.log"), &ids);
    let mut totals = [0u64; 4];
    for (id, usage) in &exact {
        let line = &log[id];
        let got = [
            &line["prompt_tokens"],
            &line["completion_tokens"],
            &line["reasoning_tokens"],
            &line["cached_tokens"],
        ];
        let want = [
            usage.prompt,
            usage.completion,
            usage.reasoning,
            usage.cached,
        ];
        let want_json: Vec<Value> = want
            .iter()
            .enumerate()
            .map(|(i, &n)| {
                if n == 0 && i > 0 {
                    Value::Null
                } else {
                    json!(n)
                }
            })
            .collect();
        assert_eq!(got.map(Clone::clone).to_vec(), want_json, "{id}: {line}");
        assert_eq!(line["usage_estimated"], false, "{id}");
        for (total, n) in totals.iter_mut().zip(want) {
            *total += n;
        }
    }
    for (id, body_len) in &abandoned {
        let line = &log[id];
        assert_eq!(line["usage_estimated"], true, "{id}: {line}");
        assert_eq!(line["prompt_tokens"], json!(body_len.div_ceil(4)), "{id}");
        let completion = line["completion_tokens"].as_u64().unwrap();
        assert!(
            (abandon_after as u64..stream_len).contains(&completion),
            "{id}: {completion} events estimated"
        );
        totals[0] += body_len.div_ceil(4) as u64;
        totals[1] += completion;
    }
    for (kind, total) in ["prompt", "completion", "reasoning", "cached"]
        .iter()
        .zip(totals)
    {
        let labels = format!("kind=\"{kind}\",service=\"m\"");
        assert_eq!(
            metric(&gw, "portcullis_tokens_total", &labels),
            total,
            "{kind}"
        );
    }
    let unread = r#"reason="abandoned",service="m""#;
    assert_eq!(
        metric(&gw, "portcullis_usage_unread_total", unread),
        abandoned.len() as u64
    );
    // The ledger, read back from the store with `portcullis usage`: the same totals.
    let requests = (exact.len() + abandoned.len()) as u64;
    let rows = wait_for(
        Duration::from_secs(20),
        || usage_cli(&gw.config, &["--group-by", "key"]),
        |rows| !rows.is_empty() && total(rows, "requests") == requests,
    );
    let fields = [
        "prompt_tokens",
        "completion_tokens",
        "reasoning_tokens",
        "cached_tokens",
    ];
    let ledger = fields.map(|field| total(&rows, field));
    assert_eq!(ledger, totals, "the ledger: {rows:?}");
    assert_eq!(
        total(&rows, "estimated"),
        abandoned.len() as u64,
        "{rows:?}"
    );
}

#[test]
fn a_percent_encoded_endpoint_is_held_to_the_policy() {
    let up = Upstream::start();
    let (gw, key) = gateway(&up);
    // The issue's probe: a duplicate `model` on an encoded path was forwarded byte for byte.
    let body = br#"{"model":"a","model":"b","messages":[{"role":"user","content":"hi"}]}"#;
    for path in [
        "/v1/m/v1/chat/%63ompletions",
        "/v1/m/v1/chat/completions;x=1",
        "/v1/m/v1/chat/completions/",
    ] {
        let req = format!(
            "POST {path} HTTP/1.1\r\nHost: gw\r\nAuthorization: Bearer {key}\r\n\
             Content-Length: {}\r\nConnection: close\r\n\r\n",
            body.len()
        );
        let (status, _, answer) = gw.raw(&[req.as_bytes(), body].concat());
        assert_eq!(status, 400, "{path}");
        let v: Value = serde_json::from_slice(&answer).unwrap();
        assert_eq!(v["message"], "model appears more than once", "{path}");
    }
    assert!(
        up.requests().is_empty(),
        "a refused body reached the upstream"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn an_upstream_that_ignores_accept_encoding_is_counted_unread() {
    let up = Upstream::start();
    let (gw, key) = gateway(&up);
    let body = Endpoint::Chat.body(Mode::Json);
    let url = gw.url("/v1/m/v1/chat/completions?force_encoding=br");
    let sent = send(&url, Some(&key), &body, "gzip", "forced").await;
    assert_eq!(sent.status, 200);
    assert_eq!(
        sent.coding.as_deref(),
        Some("br"),
        "passed on as the upstream sent it"
    );
    // Counted once the exchange is logged, just after the client has its last byte.
    let unread = r#"reason="encoding",service="m""#;
    let deadline = Instant::now() + Duration::from_secs(10);
    while metric(&gw, "portcullis_usage_unread_total", unread) == 0 {
        assert!(Instant::now() < deadline, "never counted unread");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(metric(&gw, "portcullis_usage_unread_total", unread), 1);
    assert_eq!(up.last().header("accept-encoding"), Some("gzip"));
}
