//! A true worst case for every budgeted request: requests that state no cap get one, the
//! gateway refuses to forward what it cannot meter, and usage it cannot read or believe is
//! charged the whole reservation. The fake upstream generates up to the cap it receives
//! (`?usage=cap`: 100,000 tokens per completion when it receives none, half of them hidden
//! reasoning, as an o-series model's) or reports what the test says.

use std::thread;

use serde_json::{json, Value};
use testkit::postgres::Postgres;
use testkit::redis::RedisServer;
use testkit::Gateway;

use super::{key, ledger_of, metric, portcullis, post, Fixture, Setup, CHAT};

const COMPLETIONS: &str = "/v1/chat/v1/completions";

/// A chat body (streamed or not) with these extra members.
fn chat(stream: bool, extra: Value) -> String {
    let mut body = json!({"model": "m", "stream": stream,
        "messages": [{"role": "user", "content": "hello there, how are you today?"}]});
    for (k, v) in extra.as_object().unwrap() {
        body[k] = v.clone();
    }
    body.to_string()
}

/// The mix of the zero-overshoot tests, request `i` of it: streamed chats without a cap (some
/// with `n` > 1), with a cap, and completions with prompt arrays.
fn mixed(i: usize) -> (&'static str, String) {
    match i % 5 {
        0 | 1 => (CHAT, chat(true, json!({}))),
        2 => (CHAT, chat(true, json!({"n": 3}))),
        3 => (CHAT, chat(true, json!({"max_tokens": 40, "n": 2}))),
        _ => (
            COMPLETIONS,
            json!({"model": "m", "stream": true, "prompt": ["the first of three prompts",
                "the second of three prompts", "the third of three prompts"]})
            .to_string(),
        ),
    }
}

/// Sends `n` of `mixed` at once, spread over `ports`; each answer a 200 or a 429.
fn storm(ports: &[u16], key: &str, n: usize) -> usize {
    let threads: Vec<_> = (0..n)
        .map(|i| {
            let (port, key) = (ports[i % ports.len()], key.to_string());
            thread::spawn(move || {
                let (path, body) = mixed(i);
                post(port, &key, &format!("{path}?usage=cap&n=2&gap_ms=5"), &body).0
            })
        })
        .collect();
    let statuses: Vec<u16> = threads.into_iter().map(|t| t.join().unwrap()).collect();
    assert!(
        statuses.iter().all(|s| *s == 200 || *s == 429),
        "{statuses:?}"
    );
    statuses.iter().filter(|s| **s == 200).count()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_hundred_requests_without_stated_caps_on_four_gateways_never_pass_the_budget() {
    let pg = tokio::task::block_in_place(Postgres::start);
    let redis = tokio::task::block_in_place(RedisServer::start);
    let fx = Fixture::start().await;
    let setup = Setup {
        database: Some(&pg.url),
        redis: Some(redis.url()),
        budgets: "default_max_tokens = 50",
        ..Setup::default()
    };
    let fleet: Vec<Gateway> = (0..4).map(|_| fx.gateway(&setup)).collect();
    const BUDGET: u64 = 4000;
    let (k, id) = key(&fleet[0], &["--tokens-per-day", &BUDGET.to_string()]);
    let ports: Vec<u16> = fleet.iter().map(|g| g.port).collect();
    let admitted = tokio::task::block_in_place(|| storm(&ports, &k, 200));
    assert!(admitted > 0 && admitted < 200, "{admitted} admitted");
    let (used, requests) = tokio::task::block_in_place(|| ledger_of(&fleet[0], &id));
    assert_eq!(requests, admitted as u64);
    assert!(
        used <= BUDGET,
        "{used} tokens used of a budget of {BUDGET}: overshoot"
    );
    // Every request the upstream received had a cap: the one stated or the one inserted.
    for hit in fx.up.requests() {
        let body: Value = serde_json::from_slice(&hit.body).unwrap();
        let cap = body.get("max_completion_tokens").or(body.get("max_tokens"));
        assert!(
            cap.is_some_and(Value::is_u64),
            "no cap reached the upstream: {body}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_without_a_cap_gets_the_default_written_in_or_is_refused() {
    let fx = Fixture::start().await;
    let gw = fx.gateway(&Setup {
        budgets: "default_max_tokens = 64",
        ..Setup::default()
    });
    let (budgeted, _) = key(&gw, &["--tokens-per-day", "100000"]);
    let (requests_only, _) = key(&gw, &["--requests-per-day", "100"]);
    let body = chat(false, json!({"n": 2}));
    assert_eq!(post(gw.port, &budgeted, CHAT, &body).0, 200);
    assert_eq!(post(gw.port, &requests_only, CHAT, &body).0, 200);
    let reached = fx.up.requests();
    let sent: Vec<Value> = (reached.iter())
        .map(|h| serde_json::from_slice(&h.body).unwrap())
        .collect();
    assert_eq!(sent[0]["max_completion_tokens"], 64);
    assert_eq!(
        reached[0].body.len(),
        body.len() + r#""max_completion_tokens":64,"#.len()
    );
    // A caller without a token budget is forwarded as it sent.
    assert_eq!(reached[1].body, body.as_bytes());
    let refusing = fx.gateway(&Setup {
        budgets: "unstated_cap = \"refuse\"",
        ..Setup::default()
    });
    let (budgeted, _) = key(&refusing, &["--tokens-per-day", "100000"]);
    let (status, _, answer) = post(refusing.port, &budgeted, CHAT, &body);
    assert_eq!(status, 400);
    let answer: Value = serde_json::from_slice(&answer).unwrap();
    let message = answer["message"].as_str().unwrap();
    assert!(
        message.starts_with("max_completion_tokens is required"),
        "{message}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_caller_with_a_token_budget_may_not_call_what_the_gateway_does_not_meter() {
    let fx = Fixture::start().await;
    let gw = fx.gateway(&Setup {
        chat_lines: "unmetered_paths = [\"/v1/files\"]",
        ..Setup::default()
    });
    let (budgeted, _) = key(&gw, &["--tokens-per-day", "100000"]);
    let (requests_only, _) = key(&gw, &["--requests-per-day", "100"]);
    let (free, _) = key(&gw, &[]);
    let refused = |token: &str, method: &str, path: &str, body: &str| {
        let req = format!(
            "{method} {path} HTTP/1.1\r\nHost: gw\r\nAuthorization: Bearer {token}\r\n\
             Content-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
            body.len()
        );
        let (status, _, answer) =
            tokio::task::block_in_place(|| testkit::raw(gw.port, req.as_bytes()));
        let answer: Value = serde_json::from_slice(&answer).unwrap_or(Value::Null);
        (status == 403 && answer["error"] == "endpoint_not_metered")
            .then(|| answer["message"].as_str().unwrap().to_string())
    };
    for (method, path) in [
        ("POST", "/v1/chat/v1/batches"),
        ("POST", "/v1/chat/invocations?token=secret"),
        ("GET", "/v1/chat/v1/responses/resp_1"),
        ("POST", "/v1/chat/v1/messages/batches"),
    ] {
        let message = refused(&budgeted, method, path, "{}");
        let message = message.unwrap_or_else(|| panic!("{method} {path} was not refused"));
        let shown = path
            .trim_start_matches("/v1/chat")
            .split('?')
            .next()
            .unwrap();
        assert!(message.starts_with(shown), "{message}");
        assert!(!message.contains("secret"), "{message}");
        // Only callers with a token budget are held to it.
        assert_eq!(refused(&requests_only, method, path, "{}"), None);
        assert_eq!(refused(&free, method, path, "{}"), None);
    }
    // Model lists and the service's unmetered_paths pass.
    assert_eq!(refused(&budgeted, "GET", "/v1/chat/v1/models", ""), None);
    assert_eq!(
        refused(&budgeted, "POST", "/v1/chat/v1/files/f-1", "{}"),
        None
    );
    // A Responses request run in the background is generated where no meter sees it.
    let background = r#"{"model":"m","input":"hi","background":true,"max_output_tokens":9}"#;
    let message = refused(&budgeted, "POST", "/v1/chat/v1/responses", background);
    assert!(message.unwrap().contains("background"));
    assert_eq!(
        refused(&free, "POST", "/v1/chat/v1/responses", background),
        None
    );
    let before = fx.up.requests().len();
    assert!(refused(&budgeted, "POST", "/v1/chat/v1/batches", "{}").is_some());
    assert_eq!(
        fx.up.requests().len(),
        before,
        "a refused request reached the upstream"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn usage_that_cannot_be_read_or_believed_is_charged_the_whole_reservation() {
    let fx = Fixture::start().await;
    let gw = fx.gateway(&Setup {
        budgets: "default_max_tokens = 500",
        ..Setup::default()
    });
    let (k, id) = key(&gw, &["--tokens-per-day", "100000"]);
    let body = chat(false, json!({"max_tokens": 300}));
    let reserved = (body.len() as u64).div_ceil(4) + 300;
    // A 2xx answer without usage.
    assert_eq!(
        post(gw.port, &k, &format!("{CHAT}?usage=none"), &body).0,
        200
    );
    let (used, _) = tokio::task::block_in_place(|| ledger_of(&gw, &id));
    assert_eq!(
        used, reserved,
        "a 2xx without usage is charged its reservation"
    );
    // A count no request uses (2^63 + 2^62): not believed, charged the reservation, and the
    // ledger and the listings still add up.
    let absurd = format!("{CHAT}?prompt_tokens=13835058055282163712");
    assert_eq!(post(gw.port, &k, &absurd, &body).0, 200);
    let (used, _) = tokio::task::block_in_place(|| ledger_of(&gw, &id));
    assert_eq!(used, 2 * reserved);
    let implausible = "portcullis_usage_unread_total{reason=\"implausible\",service=\"chat\"}";
    assert_eq!(metric(&gw, implausible), 1.0);
    let listed = portcullis(&gw, &["keys", "list"]);
    assert!(listed.contains(&id), "{listed}");
    // A client that leaves before the usage report: the gateway reads on (tail_seconds) and
    // charges what the upstream reports, hidden reasoning included, not what the client saw.
    let streamed = chat(true, json!({"max_tokens": 300}));
    leave_early(gw.port, &k, &streamed, "usage=cap&n=20&gap_ms=50");
    let (used, requests) = tokio::task::block_in_place(|| ledger_of(&gw, &id));
    assert_eq!(requests, 3);
    assert_eq!(
        used,
        2 * reserved + 21 + 300,
        "the upstream's own count, read after the client left"
    );
}

/// Sends a streamed chat and leaves after the first read.
fn leave_early(port: u16, key: &str, body: &str, query: &str) {
    let request = format!(
        "POST {CHAT}?{query} HTTP/1.1\r\nHost: gw\r\nAuthorization: Bearer {key}\r\n\
         Content-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    );
    tokio::task::block_in_place(|| {
        use std::io::{Read, Write};
        let mut s = std::net::TcpStream::connect(("127.0.0.1", port)).unwrap();
        s.write_all(request.as_bytes()).unwrap();
        let mut seen = [0u8; 2048];
        let _ = s.read(&mut seen).unwrap();
    });
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stream_whose_tail_outlasts_tail_seconds_is_charged_its_reservation() {
    let fx = Fixture::start().await;
    let gw = fx.gateway(&Setup {
        metering: "tail_seconds = 1",
        ..Setup::default()
    });
    let (k, id) = key(&gw, &["--tokens-per-day", "100000"]);
    let streamed = chat(true, json!({"max_tokens": 300}));
    // 4 s of stream: the usage report comes long after the one second the tail may take.
    leave_early(gw.port, &k, &streamed, "usage=cap&n=40&gap_ms=100");
    let (used, requests) = tokio::task::block_in_place(|| ledger_of(&gw, &id));
    assert_eq!(requests, 1);
    assert_eq!(used, (streamed.len() as u64).div_ceil(4) + 300);
    // The upstream's connection was dropped once the tail was over, before the stream's end.
    let stream = fx.up.stream(0);
    let stream = stream.lock().unwrap();
    assert!(
        !stream.finished && stream.aborted.is_some(),
        "the upstream's stream was cut"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_refused_before_its_body_went_upstream_is_not_a_ledger_request() {
    let fx = Fixture::start().await;
    let gw = fx.gateway(&Setup {
        max_body: Some(1 << 20),
        ..Setup::default()
    });
    let (k, id) = key(&gw, &["--requests-per-day", "2"]);
    // Over 64 KiB, so held until complete: the upstream gets the head, then the gateway
    // refuses the body. As every Claude Code request is held, each refusal must not count.
    let pad = "x".repeat(80 * 1024);
    let bad = json!({"model": "m", "messages": 7, "pad": pad}).to_string();
    for _ in 0..3 {
        assert_eq!(post(gw.port, &k, CHAT, &bad).0, 400);
    }
    let good = chat(false, json!({"max_tokens": 5, "pad": pad}));
    assert_eq!(post(gw.port, &k, CHAT, &good).0, 200);
    assert_eq!(post(gw.port, &k, CHAT, &good).0, 200);
    let (_, requests) = tokio::task::block_in_place(|| ledger_of(&gw, &id));
    assert_eq!(requests, 2, "refused requests were counted");
    // The budget counted the two as well: the third is over requests_per_day.
    assert_eq!(post(gw.port, &k, CHAT, &good).0, 429);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_caller_cannot_grow_the_ledger_with_model_names_it_makes_up() {
    let fx = Fixture::start().await;
    let gw = fx.gateway(&Setup::default());
    let (k, id) = key(&gw, &[]);
    // The first tries to rewrite the operator's terminal (sent first, so it keeps a row).
    let evil = json!({"model": "evil\u{1b}[2K\rforged_row\u{202e}", "max_tokens": 5,
        "messages": [{"role": "user", "content": "hi"}]});
    assert_eq!(post(gw.port, &k, CHAT, &evil.to_string()).0, 200);
    let threads: Vec<_> = (2..80)
        .map(|i| {
            let (port, k) = (gw.port, k.clone());
            thread::spawn(move || {
                let model = format!("{i:03}-{}", "m".repeat(246));
                let body = json!({"model": model, "max_tokens": 5,
                    "messages": [{"role": "user", "content": "hi"}]});
                // Half are refused by the upstream (an unknown model): no model recorded.
                let path = if i % 2 == 0 {
                    format!("{CHAT}?status=404")
                } else {
                    CHAT.into()
                };
                post(port, &k, &path, &body.to_string()).0
            })
        })
        .collect();
    let statuses: Vec<u16> = threads.into_iter().map(|t| t.join().unwrap()).collect();
    assert_eq!(statuses.iter().filter(|s| **s == 404).count(), 39);
    let (_, requests) = tokio::task::block_in_place(|| ledger_of(&gw, &id));
    assert_eq!(requests, 79);
    let rows = crate::ledger::usage_cli(&gw.config, &["--group-by", "key,model"]);
    let mine: Vec<&Value> = rows.iter().filter(|r| r["key"] == id.as_str()).collect();
    // 32 models of the 40 answered (max_models_per_key_hour), the rest under (other), and
    // the 40 refused under no model at all.
    assert_eq!(mine.len(), 34, "{mine:?}");
    let other = mine.iter().find(|r| r["model"] == "(other)").unwrap();
    assert_eq!(other["requests"], 8);
    let out = tokio::task::block_in_place(|| {
        testkit::cli(&gw.config, &["usage", "--group-by", "key,model"])
    });
    let text = String::from_utf8(out.stdout).unwrap();
    assert!(!text.contains(['\u{1b}', '\r', '\u{202e}']), "{text:?}");
    assert!(text.contains("evil\\u{1b}[2K\\u{d}forged"), "{text}");
    // And the report is as long as the operator asks.
    let out = tokio::task::block_in_place(|| {
        testkit::cli(
            &gw.config,
            &["usage", "--group-by", "key,model", "--limit", "5"],
        )
    });
    assert_eq!(
        String::from_utf8(out.stdout).unwrap().lines().count(),
        1 + 5
    );
    let note = String::from_utf8(out.stderr).unwrap();
    assert!(note.starts_with("5 of 34 rows shown"), "{note}");
}
