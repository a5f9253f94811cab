//! The access log names the replica that answered.

use std::collections::HashMap;
use std::path::Path;
use std::time::{Duration, Instant};

use testkit::{HitLog, Upstream};

use super::{gateway, urls};

/// Access-log lines by request id, waiting until every id in `want` is there.
fn access_lines(path: &Path, want: &[String]) -> HashMap<String, serde_json::Value> {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let text = std::fs::read_to_string(path).unwrap_or_default();
        let lines: HashMap<String, serde_json::Value> = text
            .lines()
            .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
            .filter_map(|v| Some((v["request_id"].as_str()?.to_string(), v)))
            .collect();
        if want.iter().all(|id| lines.contains_key(id)) {
            return lines;
        }
        assert!(Instant::now() < deadline, "missing lines in {text}");
        std::thread::sleep(Duration::from_millis(50));
    }
}

#[tokio::test]
async fn the_access_log_names_the_replica_that_answered_and_null_when_none_did() {
    let log = HitLog::new();
    let a = Upstream::local("A", &log);
    let dead = Upstream::stopped_local("DEAD", &log);
    let c = Upstream::local("C", &log);
    let gw = gateway(
        &urls(&[&a, &dead, &c]),
        "balance = \"round_robin\"",
        "[access_log]\ndestination = \"{dir}/access.log\"\n",
    );
    let (key, _) = gw.create_key("infer", &[]);
    let by_name: HashMap<&str, String> = [("A", a.host_port()), ("C", c.host_port())].into();
    let mut want = Vec::new();
    let mut answered = HashMap::new();
    for i in 0..6 {
        let id = format!("replica-log-{i}");
        let resp = testkit::client()
            .get(gw.url(&format!("/v1/infer/log?i={i}")))
            .bearer_auth(&key)
            .header("x-request-id", &id)
            .send()
            .await
            .unwrap();
        assert_eq!(resp.status(), 200);
        let body: serde_json::Value = resp.json().await.unwrap();
        answered.insert(id.clone(), body["replica"].as_str().unwrap().to_string());
        want.push(id);
    }
    let (status, _, _) = gw.raw(
        b"GET /v1/infer/x HTTP/1.1\r\nHost: gw\r\nX-Request-Id: replica-log-401\r\nConnection: close\r\n\r\n",
    );
    assert_eq!(status, 401);
    want.push("replica-log-401".into());

    let lines = access_lines(&gw.dir.path().join("access.log"), &want);
    for (id, who) in &answered {
        assert_eq!(
            lines[id]["replica"],
            by_name[who.as_str()].as_str(),
            "{id} was answered by {who}: {}",
            lines[id]
        );
    }
    let unauth = lines["replica-log-401"].as_object().unwrap();
    assert!(
        unauth.contains_key("replica") && unauth["replica"].is_null(),
        "no replica answered a 401: {unauth:?}"
    );
}
