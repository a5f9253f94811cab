//! The fake upstream against the OpenAI behaviour the metering tests rely on: chunk shapes with
//! and without `include_usage`, text completions, content codings (each decoded back, each
//! stream decodable event by event), forced codings and percent-decoded routing.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::Duration;

use serde_json::{json, Value};

use super::*;

pub(super) struct Resp {
    pub status: u16,
    pub headers: Vec<(String, String)>,
    /// The body's HTTP chunks as sent (one element for a Content-Length body).
    pub chunks: Vec<Vec<u8>>,
}

impl Resp {
    pub(super) fn header(&self, name: &str) -> Option<&str> {
        crate::http::header(&self.headers, name)
    }

    pub(super) fn raw_body(&self) -> Vec<u8> {
        self.chunks.concat()
    }

    /// The body decoded per its Content-Encoding.
    pub(super) fn body(&self) -> Vec<u8> {
        self.coding()
            .decode(&self.raw_body())
            .expect("the body does not decode")
    }

    pub(super) fn coding(&self) -> Coding {
        self.header("content-encoding")
            .map_or(Coding::Identity, |c| {
                Coding::parse(c).expect("unknown coding")
            })
    }

    pub(super) fn json(&self) -> Value {
        serde_json::from_slice(&self.body()).unwrap()
    }

    /// The `data:` payloads of an SSE body.
    pub(super) fn events(&self) -> Vec<String> {
        String::from_utf8(self.body())
            .unwrap()
            .split("\n\n")
            .filter_map(|e| e.strip_prefix("data: ").map(String::from))
            .collect()
    }
}

/// POSTs `body` to `target` and reads the answer (the fake keeps the connection open), keeping
/// the HTTP chunks apart.
pub(super) fn post(up: &Upstream, target: &str, headers: &[(&str, &str)], body: &str) -> Resp {
    let mut s = TcpStream::connect(up.addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    let extra: String = headers
        .iter()
        .map(|(k, v)| format!("{k}: {v}\r\n"))
        .collect();
    let req = format!(
        "POST {target} HTTP/1.1\r\nhost: up\r\ncontent-type: application/json\r\n\
         content-length: {}\r\n{extra}\r\n{body}",
        body.len()
    );
    s.write_all(req.as_bytes()).unwrap();
    let mut buf = Vec::new();
    let mut chunk = [0u8; 16 * 1024];
    loop {
        if let Some(resp) = parse(&buf) {
            return resp;
        }
        let n = s.read(&mut chunk).unwrap();
        assert!(
            n > 0,
            "closed mid-answer: {:?}",
            String::from_utf8_lossy(&buf)
        );
        buf.extend_from_slice(&chunk[..n]);
    }
}

/// The answer in `buf`, once it is complete.
fn parse(buf: &[u8]) -> Option<Resp> {
    let mut parsed_headers = [httparse::EMPTY_HEADER; 32];
    let mut parsed = httparse::Response::new(&mut parsed_headers);
    let httparse::Status::Complete(n) = parsed.parse(buf).unwrap() else {
        return None;
    };
    let status = parsed.code.unwrap();
    let headers = crate::http::header_pairs(parsed.headers);
    let mut rest = &buf[n..];
    let mut chunks = Vec::new();
    if let Some(len) = crate::http::header(&headers, "content-length") {
        let len: usize = len.parse().unwrap();
        chunks.push(rest.get(..len)?.to_vec());
    } else {
        loop {
            let line = rest.windows(2).position(|w| w == b"\r\n")?;
            let size = std::str::from_utf8(&rest[..line]).unwrap();
            let size = usize::from_str_radix(size, 16).unwrap();
            if size == 0 {
                break;
            }
            chunks.push(rest.get(line + 2..line + 2 + size)?.to_vec());
            rest = rest.get(line + 2 + size + 2..)?;
        }
    }
    Some(Resp {
        status,
        headers,
        chunks,
    })
}

const CHAT: &str = "/oa/v1/chat/completions";
const COMPLETIONS: &str = "/oa/v1/completions";
const FAST: &str = "?n=3&gap_ms=0&split_ms=0";

fn chat_body(stream: Option<bool>, stream_options: Option<Value>) -> String {
    let mut body = json!({"model": "m-1", "messages": [{"role": "user", "content": "hi"}]});
    if let Some(s) = stream {
        body["stream"] = json!(s);
    }
    if let Some(o) = stream_options {
        body["stream_options"] = o;
    }
    body.to_string()
}

fn usage_of(u: Usage) -> Value {
    json!({"prompt_tokens": u.prompt, "completion_tokens": u.completion,
        "total_tokens": u.prompt + u.completion,
        "prompt_tokens_details": {"cached_tokens": u.cached, "audio_tokens": 0},
        "completion_tokens_details": {"reasoning_tokens": u.reasoning, "audio_tokens": 0,
            "accepted_prediction_tokens": 0, "rejected_prediction_tokens": 0}})
}

#[test]
fn the_stated_counts_are_distinct_and_keep_the_old_numbers() {
    assert_eq!(
        (CHAT_JSON_USAGE.prompt, CHAT_JSON_USAGE.completion),
        (11, 5)
    );
    assert_eq!((CHAT_SSE_USAGE.prompt, CHAT_SSE_USAGE.completion), (21, 9));
    assert_eq!(EMBEDDINGS_USAGE.prompt, 7);
    for u in [
        CHAT_JSON_USAGE,
        CHAT_SSE_USAGE,
        COMPLETIONS_JSON_USAGE,
        COMPLETIONS_SSE_USAGE,
    ] {
        let mut all = vec![u.prompt, u.completion, u.reasoning, u.cached];
        all.dedup();
        assert_eq!(all.len(), 4, "{u:?}");
        assert!(
            u.reasoning > 0 && u.cached > 0 && u.reasoning < u.completion && u.cached < u.prompt
        );
    }
}

#[test]
fn include_usage_adds_null_usage_to_every_chunk_and_a_final_usage_chunk() {
    let up = Upstream::start();
    let body = chat_body(Some(true), Some(json!({"include_usage": true})));
    let resp = post(&up, &format!("{CHAT}{FAST}"), &[], &body);
    assert_eq!(resp.status, 200);
    assert_eq!(resp.header("content-type"), Some("text/event-stream"));
    let events = resp.events();
    assert_eq!(
        events.len(),
        5,
        "3 content chunks, the usage chunk, [DONE]: {events:?}"
    );
    assert_eq!(events[4], "[DONE]");
    for (i, e) in events[..3].iter().enumerate() {
        let chunk: Value = serde_json::from_str(e).unwrap();
        let finish = if i == 2 { json!("stop") } else { Value::Null };
        let mut delta = json!({"content": format!("tok{i} ")});
        if i == 0 {
            delta["role"] = json!("assistant");
        }
        assert_eq!(
            chunk,
            json!({"id": "chatcmpl-fake", "object": "chat.completion.chunk", "created": CREATED,
                "model": "m-1", "usage": null, "choices": [{"index": 0, "delta": delta,
                "logprobs": null, "finish_reason": finish}]})
        );
        // OpenAI's key order, which serde_json's map would not keep.
        assert!(e.starts_with(r#"{"id":"chatcmpl-fake","object":"chat.completion.chunk","#));
    }
    let last: Value = serde_json::from_str(&events[3]).unwrap();
    assert_eq!(
        last,
        json!({"id": "chatcmpl-fake", "object": "chat.completion.chunk", "created": CREATED,
            "model": "m-1", "choices": [], "usage": usage_of(CHAT_SSE_USAGE)})
    );
}

#[test]
fn without_include_usage_no_chunk_has_a_usage_member() {
    let up = Upstream::start();
    for options in [
        None,
        Some(Value::Null),
        Some(json!({})),
        Some(json!({"include_usage": false})),
        Some(json!({"include_usage": null})),
    ] {
        let resp = post(
            &up,
            &format!("{CHAT}{FAST}"),
            &[],
            &chat_body(Some(true), options.clone()),
        );
        let events = resp.events();
        assert_eq!(events.len(), 4, "{options:?}: {events:?}");
        assert_eq!(events[3], "[DONE]");
        for e in &events[..3] {
            let chunk: Value = serde_json::from_str(e).unwrap();
            assert!(chunk.get("usage").is_none(), "{options:?}: {e}");
            assert_eq!(chunk["choices"].as_array().unwrap().len(), 1);
        }
        let last: Value = serde_json::from_str(&events[2]).unwrap();
        assert_eq!(last["choices"][0]["finish_reason"], "stop");
    }
    // The stream's pacing stays observable: one logged write per event.
    let log = up.stream(0);
    let log = log.lock().unwrap();
    assert_eq!(log.sent.len(), 4);
    assert!(log.finished);
}

#[test]
fn chat_json_has_detailed_usage_and_stream_null_is_json() {
    let up = Upstream::start();
    for stream in [None, Some(false)] {
        let resp = post(&up, CHAT, &[], &chat_body(stream, None));
        let v = resp.json();
        assert_eq!(v["object"], "chat.completion");
        assert_eq!(v["usage"], usage_of(CHAT_JSON_USAGE));
        assert_eq!(v["choices"][0]["finish_reason"], "stop");
    }
    let v = post(&up, CHAT, &[], r#"{"stream":null,"messages":[]}"#).json();
    assert_eq!(
        (v["object"].clone(), v["model"].clone()),
        (json!("chat.completion"), Value::Null)
    );
}

#[test]
fn completions_answer_text_completions_in_json_and_sse() {
    let up = Upstream::start();
    let body = r#"{"model":"m-2","prompt":"Say hi"}"#;
    let v = post(&up, COMPLETIONS, &[], body).json();
    assert_eq!(v["object"], "text_completion");
    assert_eq!(v["id"], "cmpl-fake");
    assert_eq!(v["model"], "m-2");
    let choice = &v["choices"][0];
    assert!(choice["text"].is_string() && choice["logprobs"].is_null());
    assert_eq!(
        (choice["index"].clone(), choice["finish_reason"].clone()),
        (json!(0), json!("stop"))
    );
    assert_eq!(v["usage"], usage_of(COMPLETIONS_JSON_USAGE));

    let streamed = r#"{"model":"m-2","prompt":"Say hi","stream":true,"stream_options":{"include_usage":true}}"#;
    let events = post(&up, &format!("{COMPLETIONS}{FAST}"), &[], streamed).events();
    assert_eq!(events.len(), 5, "{events:?}");
    for (i, e) in events[..3].iter().enumerate() {
        let chunk: Value = serde_json::from_str(e).unwrap();
        assert_eq!(chunk["object"], "text_completion");
        assert_eq!(chunk["choices"][0]["text"], format!("tok{i} "));
        assert!(chunk["usage"].is_null() && chunk.get("usage").is_some());
    }
    let last: Value = serde_json::from_str(&events[3]).unwrap();
    assert_eq!(last["choices"], json!([]));
    assert_eq!(last["usage"], usage_of(COMPLETIONS_SSE_USAGE));

    let plain = r#"{"model":"m-2","prompt":"Say hi","stream":true}"#;
    let events = post(&up, &format!("{COMPLETIONS}{FAST}"), &[], plain).events();
    assert_eq!(events.len(), 4);
    assert!(events.iter().all(|e| !e.contains("usage")), "{events:?}");
}

#[test]
fn routes_match_the_percent_decoded_path_and_the_raw_target_is_recorded() {
    let up = Upstream::start();
    let encoded = "/oa/v1/chat/%63ompletions?n=1";
    let v = post(&up, encoded, &[], &chat_body(None, None)).json();
    assert_eq!(v["object"], "chat.completion");
    assert_eq!(v["usage"]["prompt_tokens"], CHAT_JSON_USAGE.prompt);
    let hit = up.last();
    assert_eq!(hit.target, encoded);
    assert_eq!(hit.decoded_path(), "/oa/v1/chat/completions");
    // `%2F` decodes to `/` as uvicorn decodes it; chat still wins over text completions.
    let v = post(
        &up,
        "/oa/v1/chat%2Fcompletions",
        &[],
        &chat_body(None, None),
    )
    .json();
    assert_eq!(v["object"], "chat.completion");
    let v = post(&up, "/oa/v1/%63ompletions", &[], r#"{"prompt":"x"}"#).json();
    assert_eq!(v["object"], "text_completion");
    let v = post(&up, "/oa/v1/emb%65ddings", &[], r#"{"input":"x"}"#).json();
    assert_eq!(v["usage"], json!({"prompt_tokens": 7, "total_tokens": 7}));
}

#[test]
fn accept_encoding_is_negotiated_as_rfc_9110_asks() {
    use Coding::*;
    let cases = [
        (None, Identity),
        (Some(""), Identity),
        (Some("gzip"), Gzip),
        (Some("x-gzip"), Gzip),
        (Some("deflate"), Deflate),
        (Some("BR"), Br),
        (Some("zstd"), Zstd),
        (Some("gzip, deflate, br, zstd"), Zstd),
        (Some("gzip, deflate"), Gzip),
        (Some("gzip;q=0.5, br;q=0.8"), Br),
        (Some("br;q=0, gzip"), Gzip),
        (Some("*"), Zstd),
        (Some("*;q=0.5, zstd;q=0, br;q=0"), Gzip),
        (Some("identity"), Identity),
        (Some("identity;q=0"), Identity),
        (Some("identity;q=1, gzip;q=0.5"), Identity),
        (Some("identity;q=0.5, gzip"), Gzip),
        (Some("gzip;q=nonsense"), Identity),
        (Some("compress, sdch"), Identity),
    ];
    for (header, want) in cases {
        assert_eq!(Coding::negotiate(header), want, "{header:?}");
    }
}

#[test]
fn every_coding_round_trips_json_and_streams_event_by_event() {
    let up = Upstream::start();
    let stream = chat_body(Some(true), Some(json!({"include_usage": true})));
    let identity_json = post(&up, CHAT, &[], &chat_body(None, None)).raw_body();
    let identity_sse = post(&up, &format!("{CHAT}{FAST}"), &[], &stream).raw_body();
    let identity_emb = post(&up, "/oa/v1/embeddings", &[], r#"{"input":"x"}"#).raw_body();
    for coding in Coding::COMPRESSED {
        let ae = [("accept-encoding", coding.name())];
        let json_resp = post(&up, CHAT, &ae, &chat_body(None, None));
        assert_eq!(json_resp.header("content-encoding"), Some(coding.name()));
        assert_ne!(
            json_resp.raw_body(),
            identity_json,
            "{coding:?} sent plain bytes"
        );
        assert_eq!(json_resp.body(), identity_json, "{coding:?}");
        let emb = post(&up, "/oa/v1/embeddings", &ae, r#"{"input":"x"}"#);
        assert_eq!(emb.body(), identity_emb, "{coding:?}");

        let sse = post(&up, &format!("{CHAT}{FAST}"), &ae, &stream);
        assert_eq!(sse.header("content-encoding"), Some(coding.name()));
        assert_eq!(sse.body(), identity_sse, "{coding:?}");
        // Each event was flushed: the chunks up to an event decode to exactly the events so far.
        // Chunk 3 and 4 are the usage event's halves, cut inside "prompt_tokens".
        let text = String::from_utf8(identity_sse.clone()).unwrap();
        let ends: Vec<usize> = text.match_indices("\n\n").map(|(i, _)| i + 2).collect();
        let prefix = |k: usize| coding.decode_prefix(&sse.chunks[..k].concat());
        for (k, end) in [
            (1, ends[0]),
            (2, ends[1]),
            (3, ends[2]),
            (5, ends[3]),
            (6, ends[4]),
        ] {
            assert_eq!(
                prefix(k),
                identity_sse[..end],
                "{coding:?}: first {k} chunks"
            );
        }
        let half = String::from_utf8(prefix(4)).unwrap();
        assert!(
            half.ends_with("\"promp"),
            "{coding:?}: the usage event's first half: {half}"
        );
    }
}

#[test]
fn force_encoding_compresses_whatever_the_request_asked() {
    let up = Upstream::start();
    for coding in Coding::COMPRESSED {
        let target = format!("{CHAT}?force_encoding={}", coding.name());
        for asked in [
            vec![],
            vec![("accept-encoding", "identity")],
            vec![("accept-encoding", "gzip;q=0")],
        ] {
            let resp = post(&up, &target, &asked, &chat_body(None, None));
            assert_eq!(
                resp.header("content-encoding"),
                Some(coding.name()),
                "{asked:?}"
            );
            assert_eq!(
                resp.json()["usage"]["prompt_tokens"],
                CHAT_JSON_USAGE.prompt
            );
        }
        let sse_target = format!("{CHAT}{FAST}&force_encoding={}", coding.name());
        let resp = post(&up, &sse_target, &[], &chat_body(Some(true), None));
        assert_eq!(resp.coding(), coding);
        assert_eq!(resp.events().len(), 4);
    }
    // Plain answers say nothing about codings.
    let resp = post(&up, CHAT, &[], &chat_body(None, None));
    assert!(resp.header("content-encoding").is_none() && resp.header("vary").is_none());
}

#[test]
fn the_stated_bodies_are_what_the_upstream_sends() {
    let up = Upstream::start();
    for (endpoint, path) in [(Endpoint::Chat, CHAT), (Endpoint::Completions, COMPLETIONS)] {
        let sent = post(
            &up,
            path,
            &[("accept-encoding", "br")],
            r#"{"model":"m-3"}"#,
        )
        .body();
        assert_eq!(sent, json_body(endpoint, Some("m-3")).as_bytes());
        for include_usage in [false, true] {
            let body = json!({"stream": true, "stream_options": {"include_usage": include_usage}});
            let target = format!("{path}?n=4&gap_ms=0&split_ms=0");
            let sent = post(&up, &target, &[], &body.to_string()).body();
            assert_eq!(sent, sse_body(endpoint, None, 4, include_usage).as_bytes());
        }
    }
    let sent = post(&up, "/oa/v1/embeddings", &[], r#"{"model":"e"}"#).body();
    assert_eq!(sent, embeddings_body(Some("e")).as_bytes());
}
