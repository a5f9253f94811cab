//! Every API, JSON and stream, costed to the micro from the upstream's stated usage.

use std::time::Duration;

use serde_json::{json, Value};
use testkit::{Gateway, Service, Upstream};

use super::{micros, price_table, tomorrow};
use crate::ledger::{usage_cli, wait_for};
use crate::metering::{access_log, send};

/// The chatx entry of today wins over the general one and over tomorrow's; `m-2` has only a
/// general entry (no `cached_input`: cached tokens at `input`).
fn table() -> String {
    format!(
        r#"
[[price]]
model = "m-1"
from = "2000-01-01"
input = 9.0
output = 9.0

[[price]]
service = "chatx"
model = "m-1"
from = "2000-01-01"
input = 2.50
cached_input = 1.25
output = 10.00

[[price]]
service = "chatx"
model = "m-1"
from = "{tomorrow}"
input = 1000
cached_input = 1000
output = 1000

[[price]]
service = "claude"
model = "m-1"
from = "2000-01-01"
input = 2.50
cached_input = 1.25
output = 10.00

[[price]]
model = "m-2"
from = "2000-01-01"
input = 1.00
output = 2.00
"#,
        tomorrow = tomorrow()
    )
}

/// (name, path, body, the cost in micros computed by hand from the fake upstream's usage:
/// ((prompt − cached) × input + cached × cached_input + completion × output) / 10^6, half up).
fn cases() -> Vec<(&'static str, &'static str, Value, u64)> {
    let chat = |model: &str, stream: bool| {
        json!({"model": model, "stream": stream,
            "messages": [{"role": "user", "content": "hi"}]})
    };
    let completion = |stream: bool| json!({"model": "m-1", "prompt": "hi", "stream": stream});
    let responses = |stream: bool| {
        json!({"model": "m-1", "stream": stream, "max_output_tokens": 200,
            "input": [{"role": "user", "content": "hi"}]})
    };
    let messages = |stream: bool| {
        json!({"model": "m-1", "max_tokens": 200, "stream": stream, "system": "be brief",
            "messages": [{"role": "user", "content": [{"type": "text", "text": "hi"}]}]})
    };
    const CHAT: &str = "/v1/chatx/oa/v1/chat/completions";
    const COMPLETIONS: &str = "/v1/chatx/oa/v1/completions";
    const RESPONSES: &str = "/v1/chatx/oa/v1/responses";
    const MESSAGES: &str = "/v1/claude/oa/v1/messages";
    vec![
        // 11 prompt (3 cached), 5 completion: 8×2.5 + 3×1.25 + 5×10 = 73.75 → 74.
        ("chat-json", CHAT, chat("m-1", false), 74),
        // 21 (6 cached), 9: 15×2.5 + 6×1.25 + 9×10 = 135.
        ("chat-stream", CHAT, chat("m-1", true), 135),
        // 31 (12 cached), 19: 19×2.5 + 12×1.25 + 19×10 = 252.5 → 253.
        ("completions-json", COMPLETIONS, completion(false), 253),
        // 41 (18 cached), 23: 23×2.5 + 18×1.25 + 23×10 = 310.
        ("completions-stream", COMPLETIONS, completion(true), 310),
        // 51 (13 cached), 27 (9 of them reasoning): 38×2.5 + 13×1.25 + 27×10 = 381.25 → 381.
        ("responses-json", RESPONSES, responses(false), 381),
        // 61 (17 cached), 33: 44×2.5 + 17×1.25 + 33×10 = 461.25 → 461.
        ("responses-stream", RESPONSES, responses(true), 461),
        // 71 + 5 created + 19 read = 95 (19 cached), 29: 76×2.5 + 19×1.25 + 29×10 = 503.75 → 504.
        ("messages-json", MESSAGES, messages(false), 504),
        // 81 + 7 + 23 = 111 (23 cached), 37: 88×2.5 + 23×1.25 + 37×10 = 618.75 → 619.
        ("messages-stream", MESSAGES, messages(true), 619),
        // The general entry of m-2: 11×1 + 5×2 = 21 (cached tokens at input).
        ("general-entry", CHAT, chat("m-2", false), 21),
    ]
}

#[tokio::test(flavor = "multi_thread")]
async fn every_api_json_and_stream_is_costed_to_the_micro_everywhere() {
    let up = Upstream::start();
    let (_dir, prices) = price_table(&table());
    let gw = Gateway::builder()
        .service(Service::new("chatx", up.url("")).openai())
        .service(Service::new("claude", up.url("")).set("api", "\"anthropic\""))
        .extra(&format!(
            "[access_log]\ndestination = \"{{dir}}/access.log\"\n\
             [metering]\nflush_seconds = 1\n\
             [pricing]\nfile = \"{}\"\ncurrency = \"EUR\"\n",
            prices.display()
        ))
        .start();
    let mut want = Vec::new();
    for (name, path, body, cost) in cases() {
        let (key, key_id) = gw.create_key("chatx,claude", &[]);
        let sent = send(&gw.url(path), Some(&key), &body, "identity", name).await;
        assert_eq!(
            sent.status,
            200,
            "{name}: {}",
            String::from_utf8_lossy(&sent.body)
        );
        want.push((name, key_id, cost));
    }
    // The access log: each request's own cost.
    let ids: Vec<&str> = want.iter().map(|(name, _, _)| *name).collect();
    let lines = access_log(&gw.dir.path().join("access.log"), &ids);
    for (name, _, cost) in &want {
        assert_eq!(
            micros(&lines[*name]["cost"]),
            *cost,
            "{name}: {}",
            lines[*name]
        );
    }
    // The ledger, through `portcullis usage`: one key per request.
    let rows = wait_for(
        Duration::from_secs(20),
        || usage_cli(&gw.config, &["--group-by", "key"]),
        |rows| rows.len() >= want.len(),
    );
    for (name, key_id, cost) in &want {
        let row = (rows.iter().find(|r| r["key"] == key_id.as_str()))
            .unwrap_or_else(|| panic!("{name}: no ledger row in {rows:?}"));
        assert_eq!(micros(&row["cost"]), *cost, "{name}: {row}");
        assert_eq!(row["unpriced_requests"], 0, "{name}: {row}");
    }
    // Prometheus: the sums per service.
    let text = gw.metrics();
    let series = |service: &str| {
        let needle = format!("portcullis_cost_micros_total{{service=\"{service}\"}} ");
        (text.lines())
            .find_map(|l| l.strip_prefix(&needle))
            .map_or(0, |v| v.trim().parse::<u64>().unwrap())
    };
    assert_eq!(series("chatx"), 74 + 135 + 253 + 310 + 381 + 461 + 21);
    assert_eq!(series("claude"), 504 + 619);
}
