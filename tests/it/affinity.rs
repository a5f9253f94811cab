//! `balance = "prefix_affinity"` end to end: the real gateway binary in front of three
//! simulated model servers with prefix caches (`testkit::Upstream::sim`), on real TCP with
//! real API keys. A request's replica is read from the sim's `x-sim-replica` answer header.
//!
//! Config under test: `balance = "prefix_affinity"`, `affinity_load_factor`, with
//! `api = "openai"`, `health_check`; metric `portcullis_affinity_total`, access-log `affinity`.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use serde_json::{json, Value};
use testkit::{Gateway, Service, SimSettings, Upstream};

/// The tests of where keys go, one request after another: a request counts as in flight until
/// the gateway is done with it, which can be a moment after the client has the answer, so the
/// next one may see it still there. A factor of 3 keeps one such request from making a spill
/// (⌈3 × 2 / 3⌉ = 2); the spill test uses the default and waits instead.
const ROOMY: &str = "affinity_load_factor = 3.0";
const HEALTH_1S: &str = "affinity_load_factor = 3.0\n\
    health_check = { path = \"/health\", interval_seconds = 1, timeout_seconds = 1 }";

/// Three simulated replicas A, B and C, each decoding a token every `decode`.
fn three_sims(decode: Duration) -> [Upstream; 3] {
    let settings = SimSettings {
        cache_blocks: 10_000,
        prefill_per_token: Duration::from_micros(1),
        decode_per_token: decode,
    };
    ["A", "B", "C"].map(|n| Upstream::sim(n, testkit::net::local_addr(), settings.clone()))
}

fn gateway(sims: &[Upstream; 3], extra_lines: &'static str) -> Gateway {
    let urls: Vec<String> = sims.iter().map(|s| s.url("")).collect();
    Gateway::builder()
        .service(
            Service::replicas("infer", &urls)
                .openai()
                .set("balance", "\"prefix_affinity\"")
                .lines(extra_lines),
        )
        .extra("[access_log]\ndestination = \"{dir}/access.log\"\n")
        .max_body(4 << 20)
        .start()
}

struct Answer {
    replica: String,
    cached_tokens: u64,
    request_id: String,
}

/// One chat completion; panics unless it is answered 200 by a sim.
async fn chat(gw: &Gateway, key: &str, session: Option<&str>, body: &Value) -> Answer {
    let mut req = testkit::client()
        .post(gw.url("/v1/infer/v1/chat/completions"))
        .bearer_auth(key)
        .timeout(Duration::from_secs(20))
        .json(body);
    if let Some(s) = session {
        req = req.header("x-session-id", s);
    }
    let resp = req
        .send()
        .await
        .unwrap_or_else(|e| panic!("{e}\n{}", gw.log()));
    assert_eq!(resp.status(), 200, "{}", gw.log());
    let header = |name: &str| resp.headers()[name].to_str().unwrap().to_string();
    let (replica, request_id) = (header("x-sim-replica"), header("x-request-id"));
    let answer: Value = resp.json().await.unwrap();
    Answer {
        replica,
        cached_tokens: answer["usage"]["prompt_tokens_details"]["cached_tokens"]
            .as_u64()
            .unwrap(),
        request_id,
    }
}

fn short_body() -> Value {
    json!({"model": "m", "max_tokens": 1, "messages": [{"role": "user", "content": "hi"}]})
}

/// Until the gateway is done with the requests answered so far.
async fn settle() {
    tokio::time::sleep(Duration::from_millis(200)).await;
}

/// Where each of `sessions` lands, one request each, one after another.
async fn placement(gw: &Gateway, key: &str, sessions: &[String]) -> Vec<String> {
    let mut out = Vec::new();
    for s in sessions {
        out.push(chat(gw, key, Some(s), &short_body()).await.replica);
    }
    out
}

/// `portcullis_affinity_total{service="infer",result=…}` now.
fn affinity_count(gw: &Gateway, result: &str) -> u64 {
    let want = format!("portcullis_affinity_total{{result=\"{result}\",service=\"infer\"}} ");
    let text = gw.metrics();
    text.lines()
        .find_map(|l| l.strip_prefix(&want)?.trim().parse().ok())
        .unwrap_or_else(|| panic!("no {want} in:\n{text}"))
}

/// Waits for `portcullis_affinity_total{result}` to reach `want` (a request is counted once
/// the gateway is done with it, a moment after the client has its answer).
async fn expect_count(gw: &Gateway, result: &str, want: u64) {
    let deadline = Instant::now() + Duration::from_secs(5);
    while affinity_count(gw, result) != want && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(affinity_count(gw, result), want, "{result}");
}

async fn wait_metric(gw: &Gateway, replica: &Upstream, value: u8) {
    let want = format!(
        "portcullis_upstream_healthy{{replica=\"{}\",service=\"infer\"}} {value}",
        replica.host_port()
    );
    let deadline = Instant::now() + Duration::from_secs(10);
    while !gw.metrics().lines().any(|l| l == want) {
        assert!(Instant::now() < deadline, "never {want}:\n{}", gw.metrics());
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

fn sessions(n: usize) -> Vec<String> {
    (0..n).map(|i| format!("session-{i}")).collect()
}

#[tokio::test]
async fn the_same_session_id_always_lands_on_one_replica_and_sessions_spread() {
    let sims = three_sims(Duration::ZERO);
    let gw = gateway(&sims, ROOMY);
    let (key, _) = gw.create_key("infer", &[]);
    // Present at 0 before any request.
    expect_count(&gw, "hit", 0).await;
    expect_count(&gw, "none", 0).await;
    let ids = sessions(12);
    let first = placement(&gw, &key, &ids).await;
    for _ in 0..3 {
        assert_eq!(placement(&gw, &key, &ids).await, first);
    }
    let mut per_replica: HashMap<&str, usize> = HashMap::new();
    for r in &first {
        *per_replica.entry(r).or_default() += 1;
    }
    assert_eq!(
        per_replica.len(),
        3,
        "12 sessions use every replica: {first:?}"
    );
    expect_count(&gw, "hit", 48).await;
    expect_count(&gw, "spill", 0).await;
    // Not a body the gateway reads (no affinity key): least_requests, counted as none.
    let resp = testkit::client()
        .get(gw.url("/v1/infer/v1/models"))
        .bearer_auth(&key)
        .send()
        .await
        .unwrap();
    let id = resp.headers()["x-request-id"].to_str().unwrap().to_string();
    expect_count(&gw, "none", 1).await;
    let last = chat(&gw, &key, Some(&ids[0]), &short_body()).await;
    let log = access_lines(&gw, &[&id, &last.request_id]);
    assert_eq!(log[&id]["affinity"], "none");
    assert_eq!(log[&last.request_id]["affinity"], "hit");
}

#[tokio::test]
async fn a_multi_turn_conversation_stays_on_one_replica_and_its_cache_hits() {
    let sims = three_sims(Duration::ZERO);
    let gw = gateway(&sims, ROOMY);
    let (key, _) = gw.create_key("infer", &[]);
    let system = (0..200)
        .map(|i| format!("rule{i}"))
        .collect::<Vec<_>>()
        .join(" ");
    let mut where_each = Vec::new();
    for c in 0..9 {
        let mut messages = vec![
            json!({"role": "system", "content": system}),
            json!({"role": "user",
                "content": format!("conversation {c} asks something long enough to fill a block")}),
        ];
        let mut replicas = Vec::new();
        for turn in 0..4 {
            // The model and stream flag change between turns; the key does not.
            let body = json!({"stream": false, "model": format!("m{turn}"), "max_tokens": 4,
                "messages": messages});
            let a = chat(&gw, &key, None, &body).await;
            if turn > 0 {
                assert!(
                    a.cached_tokens >= 200,
                    "turn {turn} reuses the cache: {}",
                    a.cached_tokens
                );
            }
            replicas.push(a.replica);
            messages.push(json!({"role": "assistant", "content": "tok tok tok tok"}));
            messages.push(json!({"role": "user", "content": format!("turn {turn} follow-up")}));
        }
        assert!(
            replicas.iter().all(|r| *r == replicas[0]),
            "conversation {c}: {replicas:?}"
        );
        where_each.push(replicas[0].clone());
    }
    where_each.sort();
    where_each.dedup();
    assert!(where_each.len() > 1, "conversations spread: {where_each:?}");
    expect_count(&gw, "hit", 36).await;
    expect_count(&gw, "none", 0).await;
}

#[tokio::test]
async fn an_overloaded_replica_spills_to_the_next_on_the_ring_then_gets_its_key_back() {
    // 40 tokens 50 ms apart: each request stays two seconds in flight, longer than placing
    // all six takes even on a loaded machine.
    let sims = three_sims(Duration::from_millis(50));
    let gw = gateway(&sims, "affinity_load_factor = 1.25");
    let (key, _) = gw.create_key("infer", &[]);
    let owner = chat(&gw, &key, Some("hot"), &short_body()).await.replica;
    settle().await;
    let slow =
        json!({"model": "m", "max_tokens": 40, "messages": [{"role": "user", "content": "hi"}]});
    let mut held = Vec::new();
    for _ in 0..6 {
        let (gw_url, key, body) = (
            gw.url("/v1/infer/v1/chat/completions"),
            key.clone(),
            slow.clone(),
        );
        held.push(tokio::spawn(async move {
            let resp = testkit::client()
                .post(gw_url)
                .bearer_auth(key)
                .header("x-session-id", "hot")
                .json(&body)
                .send()
                .await
                .unwrap();
            resp.headers()["x-sim-replica"]
                .to_str()
                .unwrap()
                .to_string()
        }));
        // Each is in flight before the next is placed.
        tokio::time::sleep(Duration::from_millis(150)).await;
    }
    let mut got = Vec::new();
    for h in held {
        got.push(h.await.unwrap());
    }
    // In flight across the service 0..5 as each came: the bound ⌈1.25 × (n + 1) / 3⌉ is
    // 1, 1, 2, 2, 3, 3, so the owner takes the 1st, 3rd and 5th and the rest spill.
    let on_owner = got.iter().filter(|r| **r == owner).count();
    assert_eq!(on_owner, 3, "owner {owner}: {got:?}");
    expect_count(&gw, "spill", 3).await;
    expect_count(&gw, "hit", 4).await;
    settle().await;
    // Idle again: the key is its replica's.
    assert_eq!(
        chat(&gw, &key, Some("hot"), &short_body()).await.replica,
        owner
    );
}

#[tokio::test]
async fn a_replica_killed_and_restarted_takes_back_only_its_share() {
    let sims = three_sims(Duration::ZERO);
    let gw = gateway(&sims, HEALTH_1S);
    let (key, _) = gw.create_key("infer", &[]);
    let ids = sessions(30);
    let before = placement(&gw, &key, &ids).await;
    let gone = &sims[1];
    gone.kill();
    // The gateway's pooled connections to it see the resets.
    tokio::time::sleep(Duration::from_millis(200)).await;
    // Connects refused: failover, then the health check takes it out.
    let during = placement(&gw, &key, &ids).await;
    wait_metric(&gw, gone, 0).await;
    let out = placement(&gw, &key, &ids).await;
    for (i, (b, o)) in before.iter().zip(&out).enumerate() {
        if *b == gone.name {
            assert_ne!(*o, gone.name);
        } else {
            assert_eq!(b, o, "session {i} kept its replica");
            assert_eq!(b, &during[i]);
        }
    }
    assert!(before.contains(&gone.name), "{before:?}");
    gone.restart();
    wait_metric(&gw, gone, 1).await;
    assert_eq!(
        placement(&gw, &key, &ids).await,
        before,
        "only its share came back"
    );
}

#[tokio::test]
async fn a_health_check_failure_moves_only_its_keys_each_to_one_next_replica() {
    let sims = three_sims(Duration::ZERO);
    let gw = gateway(&sims, HEALTH_1S);
    let (key, _) = gw.create_key("infer", &[]);
    let ids = sessions(30);
    let before = placement(&gw, &key, &ids).await;
    let sick = &sims[2];
    let moved = before.iter().filter(|r| **r == sick.name).count() as u64;
    assert!(moved > 0, "{before:?}");
    sick.set_healthy(false);
    wait_metric(&gw, sick, 0).await;
    let spills = affinity_count(&gw, "spill");
    let out = placement(&gw, &key, &ids).await;
    assert_eq!(
        placement(&gw, &key, &ids).await,
        out,
        "each moved key has one new replica"
    );
    for (b, o) in before.iter().zip(&out) {
        if *b == sick.name {
            assert_ne!(*o, sick.name);
        } else {
            assert_eq!(b, o);
        }
    }
    expect_count(&gw, "spill", spills + 2 * moved).await;
    sick.set_healthy(true);
    wait_metric(&gw, sick, 1).await;
    assert_eq!(placement(&gw, &key, &ids).await, before);
}

/// Access-log lines by request id, waiting until `want` are all there.
fn access_lines(gw: &Gateway, want: &[&str]) -> HashMap<String, Value> {
    let path = gw.dir.path().join("access.log");
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let text = std::fs::read_to_string(&path).unwrap_or_default();
        let lines: HashMap<String, Value> = text
            .lines()
            .filter_map(|l| serde_json::from_str::<Value>(l).ok())
            .map(|v| (v["request_id"].as_str().unwrap_or_default().to_string(), v))
            .collect();
        if want.iter().all(|id| lines.contains_key(*id)) {
            return lines;
        }
        assert!(Instant::now() < deadline, "missing lines in:\n{text}");
        std::thread::sleep(Duration::from_millis(50));
    }
}

#[tokio::test]
async fn a_long_conversation_held_whole_keeps_its_replica_sent_with_a_length_or_chunked() {
    let sims = three_sims(Duration::ZERO);
    let gw = gateway(&sims, ROOMY);
    let (key, _) = gw.create_key("infer", &[]);
    let long = |w: &str| vec![w; 20_000].join(" ");
    let mut placed = Vec::new();
    for c in 0..4 {
        // Over 64 KiB: held in the request body filter, its start read before the replica.
        let mut messages = vec![
            json!({"role": "system", "content": long("rules")}),
            json!({"role": "user", "content": format!("conversation {c}: {}", long("doc"))}),
        ];
        let mut replicas = Vec::new();
        for turn in 0..3 {
            let body = json!({"model": "m", "max_tokens": 2, "messages": messages});
            let bytes = serde_json::to_vec(&body).unwrap();
            assert!(bytes.len() > 200_000);
            // Turn 1 chunked (no length declared), the others with a length.
            let framing = if turn == 1 {
                "Transfer-Encoding: chunked".to_string()
            } else {
                format!("Content-Length: {}", bytes.len())
            };
            let mut request = format!(
                "POST /v1/infer/v1/chat/completions HTTP/1.1\r\nHost: gw\r\n\
                 Authorization: Bearer {key}\r\nContent-Type: application/json\r\n\
                 Connection: close\r\n{framing}\r\n\r\n"
            )
            .into_bytes();
            if turn == 1 {
                for chunk in bytes.chunks(10_000) {
                    request.extend_from_slice(format!("{:x}\r\n", chunk.len()).as_bytes());
                    request.extend_from_slice(chunk);
                    request.extend_from_slice(b"\r\n");
                }
                request.extend_from_slice(b"0\r\n\r\n");
            } else {
                request.extend_from_slice(&bytes);
            }
            let (status, headers, answer) = gw.raw(&request);
            assert_eq!(status, 200, "{}", gw.log());
            replicas.push(
                testkit::header(&headers, "x-sim-replica")
                    .unwrap()
                    .to_string(),
            );
            let answer: Value = serde_json::from_slice(&answer).unwrap();
            if turn > 0 {
                let cached = answer["usage"]["prompt_tokens_details"]["cached_tokens"].as_u64();
                assert!(cached.unwrap() >= 40_000, "turn {turn}: {answer}");
            }
            messages.push(json!({"role": "assistant", "content": "tok tok"}));
            messages.push(json!({"role": "user", "content": format!("turn {turn}")}));
        }
        assert!(replicas.iter().all(|r| *r == replicas[0]), "{replicas:?}");
        placed.push(replicas[0].clone());
    }
    expect_count(&gw, "hit", 12).await;
    expect_count(&gw, "none", 0).await;
    // A small chunked body is read whole before the choice, and still sent whole.
    let small = serde_json::to_vec(&short_body()).unwrap();
    let mut request = format!(
        "POST /v1/infer/v1/chat/completions HTTP/1.1\r\nHost: gw\r\n\
         Authorization: Bearer {key}\r\nContent-Type: application/json\r\n\
         Connection: close\r\nTransfer-Encoding: chunked\r\n\r\n{:x}\r\n",
        small.len()
    )
    .into_bytes();
    request.extend_from_slice(&small);
    request.extend_from_slice(b"\r\n0\r\n\r\n");
    let (status, _, answer) = gw.raw(&request);
    assert_eq!(status, 200, "{}", String::from_utf8_lossy(&answer));
    expect_count(&gw, "hit", 13).await;
    // Embeddings are not conversations: no key.
    let resp = testkit::client()
        .post(gw.url("/v1/infer/v1/embeddings"))
        .bearer_auth(&key)
        .json(&json!({"model": "m", "input": "hello"}))
        .send()
        .await
        .unwrap();
    drop(resp);
    expect_count(&gw, "none", 1).await;
}
