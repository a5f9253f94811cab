//! A model without a price is unpriced everywhere (never costed 0); `unpriced = "refuse"`
//! refuses it to a caller with a cost budget only.

use std::time::Duration;

use serde_json::{json, Value};

use super::price_table;
use testkit::raw;

use crate::budgets::{admin, admin_port, key, metric, Fixture, Setup, CHAT};
use crate::ledger::{usage_cli, wait_for};
use crate::metering::access_log;

const TABLE: &str = r#"
[[price]]
model = "m-1"
from = "2000-01-01"
input = 3
output = 15
"#;

/// A JSON chat naming `model`, with `id` as its request id: (status, body).
fn chat(port: u16, token: &str, model: &str, id: &str) -> (u16, Value) {
    let body = json!({"model": model, "max_tokens": 9,
        "messages": [{"role": "user", "content": "hello there, how are you today?"}]});
    let body = body.to_string();
    let req = format!(
        "POST {CHAT} HTTP/1.1\r\nHost: gw\r\nAuthorization: Bearer {token}\r\n\
         X-Request-Id: {id}\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\
         Connection: close\r\n\r\n{body}",
        body.len()
    );
    let (status, _, body) = raw(port, req.as_bytes());
    (status, serde_json::from_slice(&body).unwrap_or(Value::Null))
}

#[tokio::test(flavor = "multi_thread")]
async fn an_unpriced_model_is_recorded_unpriced_never_zero() {
    let fx = Fixture::start().await;
    let (_dir, prices) = price_table(TABLE);
    let pricing = format!("file = \"{}\"", prices.display());
    let port = admin_port();
    let gw = fx.gateway(&Setup {
        pricing: &pricing,
        admin_port: Some(port),
        extra: "[access_log]\ndestination = \"{dir}/access.log\"\n",
        ..Setup::default()
    });
    let (k, id) = key(&gw, &["--owner", "carol"]);
    let (status, body) = tokio::task::block_in_place(|| chat(gw.port, &k, "m-unknown", "u-1"));
    assert_eq!(status, 200, "{body}");
    let (status, body) = tokio::task::block_in_place(|| chat(gw.port, &k, "m-1", "p-1"));
    assert_eq!(status, 200, "{body}");
    // The access log: null for the unpriced one, a number for the priced one.
    let lines = tokio::task::block_in_place(|| {
        access_log(&gw.dir.path().join("access.log"), &["u-1", "p-1"])
    });
    assert!(lines["u-1"]["cost"].is_null(), "{}", lines["u-1"]);
    assert!(
        lines["p-1"]["cost"].as_f64().unwrap() > 0.0,
        "{}",
        lines["p-1"]
    );
    // The ledger through the CLI, by model: the unpriced row has no cost, and counts one.
    let rows = tokio::task::block_in_place(|| {
        wait_for(
            Duration::from_secs(20),
            || usage_cli(&gw.config, &["--group-by", "key,model"]),
            |rows| rows.iter().filter(|r| r["key"] == id.as_str()).count() == 2,
        )
    });
    let row = |model: &str| {
        (rows.iter())
            .find(|r| r["key"] == id.as_str() && r["model"] == model)
            .unwrap_or_else(|| panic!("no {model} row in {rows:?}"))
            .clone()
    };
    let unpriced = row("m-unknown");
    assert!(unpriced["cost"].is_null(), "{unpriced}");
    assert_eq!(unpriced["unpriced_requests"], 1, "{unpriced}");
    let priced = row("m-1");
    assert!(priced["cost"].as_f64().unwrap() > 0.0, "{priced}");
    assert_eq!(priced["unpriced_requests"], 0, "{priced}");
    // The key's row over both models: the priced one's cost, one unpriced.
    let both = tokio::task::block_in_place(|| usage_cli(&gw.config, &["--group-by", "key"]));
    let both = both.iter().find(|r| r["key"] == id.as_str()).unwrap();
    assert_eq!(both["cost"], priced["cost"], "{both}");
    assert_eq!(both["unpriced_requests"], 1, "{both}");
    // The API, to an administrator.
    let admin_token = fx.token("root", "chat plain portcullis:admin");
    let (status, report) = admin(
        port,
        &admin_token,
        "GET",
        "/v1/usage?group_by=model&owner=carol",
        None,
    );
    assert_eq!(status, 200, "{report}");
    let api_row = |model: &str| {
        (report["usage"].as_array().unwrap().iter())
            .find(|r| r["model"] == model)
            .unwrap_or_else(|| panic!("no {model} row in {report}"))
            .clone()
    };
    assert!(api_row("m-unknown")["cost"].is_null(), "{report}");
    assert_eq!(api_row("m-unknown")["unpriced_requests"], 1, "{report}");
    assert_eq!(api_row("m-1")["cost"], priced["cost"], "{report}");
    // Prometheus.
    assert_eq!(
        metric(&gw, "portcullis_unpriced_requests_total{service=\"chat\"}"),
        1.0
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn refuse_stops_an_unpriced_model_only_for_a_cost_budgeted_caller() {
    let fx = Fixture::start().await;
    let (_dir, prices) = price_table(TABLE);
    let pricing = format!("file = \"{}\"\nunpriced = \"refuse\"", prices.display());
    let gw = fx.gateway(&Setup {
        pricing: &pricing,
        ..Setup::default()
    });
    let (budgeted, _) = key(&gw, &["--cost-per-day", "5"]);
    let (free, _) = key(&gw, &[]);
    let (status, body) = tokio::task::block_in_place(|| chat(gw.port, &budgeted, "m-x", "r-1"));
    assert_eq!(status, 403, "{body}");
    assert_eq!(body["error"], "model_unpriced", "{body}");
    let message = body["message"].as_str().unwrap();
    assert!(message.contains("\"m-x\""), "{message}");
    // Never forwarded.
    assert_eq!(fx.chats_upstream(), 0);
    // Priced: served to the budgeted caller; unpriced: served to the unbudgeted one.
    let (status, body) = tokio::task::block_in_place(|| chat(gw.port, &budgeted, "m-1", "r-2"));
    assert_eq!(status, 200, "{body}");
    let (status, body) = tokio::task::block_in_place(|| chat(gw.port, &free, "m-x", "r-3"));
    assert_eq!(status, 200, "{body}");
    assert_eq!(fx.chats_upstream(), 2);
}
