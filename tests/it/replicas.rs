//! Replicas end to end: the real gateway binary in front of several recording
//! replicas on real TCP; load balancing, connect failover, health checks, passive ejection,
//! no replay after a request reached a replica, live DNS, and what metrics and the access log
//! say about it. The replicas are `testkit::upstream`, the DNS server `testkit::dns`.
//!
//! Config under test, per service: `upstream = [..]` (or one string), `balance`,
//! `health_check = { path, interval_seconds, timeout_seconds }`, `dns_refresh_seconds`,
//! `eject_after_connect_failures`, `eject_seconds`, `connect_timeout_seconds`; and `[dns] servers`.

use std::collections::HashMap;
use std::net::{Ipv4Addr, SocketAddr};
use std::path::Path;
use std::time::{Duration, Instant};

use testkit::dns::Dns;
use testkit::{free_port_on, Blackhole, HitLog, Upstream};
use testkit::{Gateway, Service};

const HEALTH_1S: &str =
    "health_check = { path = \"/health\", interval_seconds = 1, timeout_seconds = 1 }";
const DNS_NAME: &str = "replica.test";

/// Replicas A, B and C, running, recording into `log`.
fn three_replicas(log: &HitLog) -> [Upstream; 3] {
    ["A", "B", "C"].map(|name| Upstream::local(name, log))
}

fn urls(replicas: &[&Upstream]) -> Vec<String> {
    replicas.iter().map(|r| r.url("")).collect()
}

/// The gateway with one service `infer` over `upstreams`; `service_extra` goes into the
/// service's table, `extra` after it (e.g. `[dns]`, `[access_log]`).
fn gateway(upstreams: &[String], service_extra: &str, extra: &str) -> Gateway {
    Gateway::builder()
        .service(Service::replicas("infer", upstreams).lines(service_extra))
        .extra(extra)
        .start()
}

/// One authorised request; Ok((status, JSON body or Null)) or Err(what went wrong).
async fn send(
    gw: &Gateway,
    key: &str,
    method: &str,
    path: &str,
    body: Option<&str>,
) -> Result<(u16, serde_json::Value), String> {
    let method = reqwest::Method::from_bytes(method.as_bytes()).unwrap();
    let mut req = testkit::client()
        .request(method, gw.url(path))
        .bearer_auth(key)
        .timeout(Duration::from_secs(15));
    if let Some(body) = body {
        req = req
            .header("content-type", "application/json")
            .body(body.to_string());
    }
    let resp = req.send().await.map_err(|e| format!("{path}: {e}"))?;
    let status = resp.status().as_u16();
    let bytes = resp.bytes().await.map_err(|e| format!("{path}: {e}"))?;
    Ok((
        status,
        serde_json::from_slice(&bytes).unwrap_or(serde_json::Value::Null),
    ))
}

/// A GET that must succeed; returns the name of the replica that answered.
async fn get_ok(gw: &Gateway, key: &str, path: &str) -> String {
    let (status, body) = send(gw, key, "GET", path, None)
        .await
        .unwrap_or_else(|e| panic!("{e}\n{}", gw.log()));
    assert_eq!(status, 200, "{path}: {body}");
    body["replica"]
        .as_str()
        .unwrap_or_else(|| panic!("{path}: no replica in {body}"))
        .to_string()
}

/// Between sequential requests in least_requests tests: a request counts as in flight until the
/// gateway has finished with it (access log included), which can be a moment after the client
/// read the last byte; without a pause the next pick may still see it.
async fn settle() {
    tokio::time::sleep(Duration::from_millis(100)).await;
}

/// `portcullis_upstream_healthy{service="infer",replica=…}` as the metrics listener says now.
fn healthy(gw: &Gateway, replica: &str) -> Option<f64> {
    let text = gw.metrics();
    text.lines()
        .filter_map(|l| l.strip_prefix("portcullis_upstream_healthy{"))
        .find_map(|rest| {
            let (labels, value) = rest.split_once('}')?;
            let labels: HashMap<&str, &str> = labels
                .split(',')
                .filter_map(|kv| {
                    let (k, v) = kv.split_once('=')?;
                    Some((k.trim(), v.trim().trim_matches('"')))
                })
                .collect();
            (labels.get("service") == Some(&"infer") && labels.get("replica") == Some(&replica))
                .then(|| value.trim().parse().ok())
                .flatten()
        })
}

/// Waits until every (replica, value) pair holds in the metrics at once.
async fn wait_healthy(gw: &Gateway, want: &[(&str, f64)], within: Duration) {
    let deadline = Instant::now() + within;
    loop {
        if want.iter().all(|(r, v)| healthy(gw, r) == Some(*v)) {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "portcullis_upstream_healthy never became {want:?} within {within:?}:\n{}",
            gw.metrics()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// The single replica that got a request whose target contains `needle`.
fn only(log: &HitLog, needle: &str) -> String {
    let who = log.replicas_for(needle);
    assert_eq!(
        who.len(),
        1,
        "{needle} should have reached exactly one replica: {who:?}"
    );
    who[0].clone()
}

/// Reads a stream to its end: Ok(body) if it ended cleanly, Err(what arrived, the error).
async fn drain(mut resp: reqwest::Response) -> Result<String, (String, String)> {
    let mut got = Vec::new();
    loop {
        match resp.chunk().await {
            Ok(Some(chunk)) => got.extend_from_slice(&chunk),
            Ok(None) => return Ok(String::from_utf8_lossy(&got).into_owned()),
            Err(e) => return Err((String::from_utf8_lossy(&got).into_owned(), e.to_string())),
        }
    }
}

fn sse_path(id: &str, n: u32, gap_ms: u32) -> String {
    format!("/v1/infer/sse?id={id}&n={n}&gap_ms={gap_ms}")
}

// ---------------------------------------------------------------------------------------
// Balancing
// ---------------------------------------------------------------------------------------

#[tokio::test]
async fn least_requests_by_default_sends_short_requests_to_the_replica_without_an_open_stream() {
    let log = HitLog::new();
    let [a, b, c] = three_replicas(&log);
    // No `balance`: least_requests is the default.
    let gw = gateway(&urls(&[&a, &b, &c]), "", "");
    let (key, _) = gw.create_key("infer", &[]);

    let _s1 = gw.open_sse(&key, &sse_path("s1", 300, 100)).await;
    let first = only(&log, "id=s1&");
    let _s2 = gw.open_sse(&key, &sse_path("s2", 300, 100)).await;
    let second = only(&log, "id=s2&");
    assert_ne!(
        first, second,
        "the second stream went to the replica already holding one while others had none"
    );
    let free: String = ["A", "B", "C"]
        .into_iter()
        .find(|r| *r != first && *r != second)
        .unwrap()
        .into();
    for i in 0..9 {
        settle().await;
        let who = get_ok(&gw, &key, &format!("/v1/infer/short?i={i}")).await;
        assert_eq!(
            who, free,
            "request {i}: {first} and {second} each hold a stream, {free} holds nothing"
        );
    }
}

#[tokio::test]
async fn least_requests_keeps_new_requests_off_a_replica_holding_two_streams_and_rotates_ties() {
    let log = HitLog::new();
    let a = Upstream::local("A", &log);
    let b = Upstream::stopped_local("B", &log);
    let c = Upstream::stopped_local("C", &log);
    let service = format!("balance = \"least_requests\"\n{HEALTH_1S}");
    let gw = gateway(&urls(&[&a, &b, &c]), &service, "");
    let (key, _) = gw.create_key("infer", &[]);
    // Only A is up: both streams land there.
    wait_healthy(
        &gw,
        &[(&b.host_port(), 0.0), (&c.host_port(), 0.0)],
        Duration::from_secs(15),
    )
    .await;
    let _s1 = gw.open_sse(&key, &sse_path("s1", 300, 100)).await;
    let _s2 = gw.open_sse(&key, &sse_path("s2", 300, 100)).await;
    assert_eq!(only(&log, "id=s1&"), "A");
    assert_eq!(only(&log, "id=s2&"), "A");
    // B and C come up and pass their health checks.
    b.restart();
    c.restart();
    wait_healthy(
        &gw,
        &[(&b.host_port(), 1.0), (&c.host_port(), 1.0)],
        Duration::from_secs(15),
    )
    .await;
    let mut count: HashMap<String, usize> = HashMap::new();
    for i in 0..12 {
        settle().await;
        let who = get_ok(&gw, &key, &format!("/v1/infer/short?i={i}")).await;
        *count.entry(who).or_default() += 1;
    }
    assert_eq!(
        count.get("A"),
        None,
        "A holds two streams, B and C none: {count:?}"
    );
    assert!(
        count.get("B").copied().unwrap_or(0) >= 3 && count.get("C").copied().unwrap_or(0) >= 3,
        "B and C tie at zero in flight: ties should rotate between them, got {count:?}"
    );
}

#[tokio::test]
async fn round_robin_spreads_thirty_requests_ten_to_each_of_three_replicas() {
    let log = HitLog::new();
    let [a, b, c] = three_replicas(&log);
    let gw = gateway(&urls(&[&a, &b, &c]), "balance = \"round_robin\"", "");
    let (key, _) = gw.create_key("infer", &[]);
    let mut count: HashMap<String, usize> = HashMap::new();
    for i in 0..30 {
        let who = get_ok(&gw, &key, &format!("/v1/infer/rr?i={i}")).await;
        *count.entry(who).or_default() += 1;
    }
    for r in ["A", "B", "C"] {
        let n = count.get(r).copied().unwrap_or(0);
        assert!((9..=11).contains(&n), "{r} got {n} of 30: {count:?}");
        assert_eq!(log.count(r), n, "the replica's own log agrees");
    }
}

// ---------------------------------------------------------------------------------------
// A replica dies and comes back
// ---------------------------------------------------------------------------------------

#[derive(Debug)]
struct Outcome {
    started: Instant,
    result: Result<(u16, serde_json::Value), String>,
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn killing_a_replica_mid_load_fails_at_most_its_in_flight_requests_and_cuts_only_its_streams()
{
    let log = HitLog::new();
    let reps = three_replicas(&log);
    let gw = gateway(&urls(&[&reps[0], &reps[1], &reps[2]]), HEALTH_1S, "");
    let (key, _) = gw.create_key("infer", &[]);
    let gw = std::sync::Arc::new(gw);

    // Long streams (8 s) opened one after the other: least_requests spreads them.
    const EVENTS: u32 = 80;
    let mut streams = Vec::new();
    for i in 0..3 {
        let id = format!("st{i}");
        let resp = gw.open_sse(&key, &sse_path(&id, EVENTS, 100)).await;
        let who = only(&log, &format!("id={id}&"));
        let reader = tokio::spawn(async move {
            let r = tokio::time::timeout(Duration::from_secs(25), drain(resp)).await;
            (r, Instant::now())
        });
        streams.push((who, reader));
    }
    // The victim: whoever holds the second stream.
    let victim_name = streams[1].0.clone();
    let victim = reps.iter().find(|r| r.name == victim_name).unwrap();

    // Continuous load for 5 s from four clients.
    let start = Instant::now();
    let mut clients = Vec::new();
    for t in 0..4 {
        let (gw, key) = (gw.clone(), key.clone());
        clients.push(tokio::spawn(async move {
            let mut outcomes = Vec::new();
            let mut j = 0;
            while start.elapsed() < Duration::from_secs(5) {
                let path = format!("/v1/infer/work?ms=20&c={t}&j={j}");
                let started = Instant::now();
                let result = send(&gw, &key, "GET", &path, None).await;
                outcomes.push(Outcome { started, result });
                j += 1;
            }
            outcomes
        }));
    }
    tokio::time::sleep(Duration::from_secs(1)).await;
    let killed_at = Instant::now();
    let cut = tokio::task::block_in_place(|| victim.kill());

    let mut outcomes = Vec::new();
    for c in clients {
        outcomes.extend(c.await.unwrap());
    }
    let victim_load_before = log
        .requests()
        .iter()
        .filter(|h| h.replica == victim_name && h.path().ends_with("/work") && h.at < killed_at)
        .count();
    assert!(
        victim_load_before > 0,
        "the victim {victim_name} got no load before the kill: nothing was tested"
    );
    assert!(outcomes.len() >= 40, "too little load: {}", outcomes.len());
    let streams_on_victim = streams.iter().filter(|(w, _)| *w == victim_name).count();
    // `cut` counts the victim's streams too; the rest were load requests in flight there.
    let allowed = cut.saturating_sub(streams_on_victim);
    let failures: Vec<String> = outcomes
        .iter()
        .filter(|o| !matches!(o.result, Ok((200, _))))
        .map(|o| {
            let at = o.started.saturating_duration_since(killed_at);
            let before = killed_at.saturating_duration_since(o.started);
            format!(
                "started {}: {:?}",
                if before > Duration::ZERO {
                    format!("{before:?} before the kill")
                } else {
                    format!("{at:?} after the kill")
                },
                o.result
            )
        })
        .collect();
    // A request the victim received must not be answered by another replica as well: not
    // even an idempotent GET whose pooled connection died under it (it reached the replica).
    let mut seen_by: HashMap<String, Vec<String>> = HashMap::new();
    for h in log
        .requests()
        .iter()
        .filter(|h| h.path().ends_with("/work"))
    {
        seen_by
            .entry(h.target.clone())
            .or_default()
            .push(h.replica.clone());
    }
    let replayed: Vec<(&String, &Vec<String>)> =
        seen_by.iter().filter(|(_, who)| who.len() > 1).collect();
    eprintln!(
        "{} requests, {} failed; {cut} in flight on {victim_name} when killed \
         ({streams_on_victim} of them streams); replayed GETs: {replayed:?}",
        outcomes.len(),
        failures.len()
    );
    assert!(
        replayed.is_empty(),
        "replayed on another replica: {replayed:?}"
    );
    assert!(
        failures.len() <= allowed,
        "{} of {} requests failed; only the {allowed} in flight on {victim_name} when it died may:\n{}\n{}",
        failures.len(),
        outcomes.len(),
        failures.join("\n"),
        gw.log()
    );
    // Once the gateway noticed (well within a second with refused connects), nothing fails.
    let late_failures: Vec<&Outcome> = outcomes
        .iter()
        .filter(|o| {
            o.started > killed_at + Duration::from_secs(1) && !matches!(o.result, Ok((200, _)))
        })
        .collect();
    assert!(
        late_failures.is_empty(),
        "failures a second after the kill: {late_failures:?}"
    );
    for o in &outcomes {
        if let (true, Ok((200, body))) = (o.started > killed_at, &o.result) {
            assert_ne!(
                body["replica"],
                victim_name.as_str(),
                "answered by a dead replica?"
            );
        }
    }

    // Streams: the survivors' complete untouched, the victim's end with a cut, not a hang.
    for (who, reader) in streams {
        let (result, ended) = reader.await.unwrap();
        let result = result.unwrap_or_else(|_| panic!("a stream on {who} hung"));
        if who == victim_name {
            let cut_short = match &result {
                Err(_) => true,
                Ok(body) => !body.contains("[DONE]"),
            };
            assert!(
                cut_short,
                "the stream on the killed replica {who} ended as if complete: {result:?}"
            );
            assert!(
                ended.duration_since(killed_at) < Duration::from_secs(5),
                "the stream on the killed replica ended {:?} after the kill: a hang, not a cut",
                ended.duration_since(killed_at)
            );
        } else {
            let body = result.unwrap_or_else(|(got, e)| {
                panic!("the stream on surviving replica {who} broke: {e}; got {got}")
            });
            assert!(body.contains("[DONE]"), "stream on {who}: {body}");
            // `open_sse` consumed the first chunk (event 0, perhaps more): the rest must be
            // every later event, in order, up to the last.
            let seen: Vec<u64> = body
                .lines()
                .filter_map(|l| l.strip_prefix("data: "))
                .filter_map(|d| serde_json::from_str::<serde_json::Value>(d).ok())
                .filter_map(|v| v["i"].as_u64())
                .collect();
            let from = seen.first().copied().unwrap_or(u64::MAX);
            assert!(
                from <= 2 && seen == (from..EVENTS as u64).collect::<Vec<_>>(),
                "stream on {who} lost events: {seen:?}"
            );
        }
    }
}

#[tokio::test]
async fn a_killed_replica_restarted_on_the_same_address_rejoins_within_a_health_interval() {
    let log = HitLog::new();
    let [a, b, c] = three_replicas(&log);
    let gw = gateway(&urls(&[&a, &b, &c]), HEALTH_1S, "");
    let (key, _) = gw.create_key("infer", &[]);
    let all_up = [
        (a.host_port(), 1.0),
        (b.host_port(), 1.0),
        (c.host_port(), 1.0),
    ];
    let all_up: Vec<(&str, f64)> = all_up.iter().map(|(r, v)| (r.as_str(), *v)).collect();
    wait_healthy(&gw, &all_up, Duration::from_secs(15)).await;

    b.kill();
    wait_healthy(&gw, &[(&b.host_port(), 0.0)], Duration::from_secs(10)).await;
    for i in 0..6 {
        let who = get_ok(&gw, &key, &format!("/v1/infer/down?i={i}")).await;
        assert_ne!(who, "B");
    }

    b.restart();
    let restarted = Instant::now();
    let mut i = 0;
    loop {
        let who = get_ok(&gw, &key, &format!("/v1/infer/back?i={i}")).await;
        if who == "B" {
            break;
        }
        assert!(
            restarted.elapsed() < Duration::from_secs(4),
            "B was restarted {:?} ago (health interval 1 s) and still gets nothing",
            restarted.elapsed()
        );
        i += 1;
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    wait_healthy(&gw, &all_up, Duration::from_secs(5)).await;
}

// ---------------------------------------------------------------------------------------
// No replay once a request reached a replica
// ---------------------------------------------------------------------------------------

/// POSTs distinct requests until `a_hits_wanted` of them reached A (which resets each after
/// reading it): each of those must be a 502 and appear in no other replica's log; every other
/// POST is a 200 from the one replica that logged it.
async fn posts_reset_by_a_are_not_replayed(gw: &Gateway, key: &str, log: &HitLog, tag: &str) {
    let mut a_hits = 0;
    for k in 0..15 {
        let id = format!("{tag}{k}");
        let body = format!("{{\"prompt\":\"generate {id}\",\"max_tokens\":500}}");
        let path = format!("/v1/infer/generate?id={id}&");
        let (status, answer) = send(gw, key, "POST", &path, Some(&body))
            .await
            .unwrap_or_else(|e| panic!("{e}"));
        let who = log.replicas_for(&format!("id={id}&"));
        if who.iter().any(|w| w == "A") {
            assert_eq!(
                who,
                ["A"],
                "POST {id} was reset by A after reaching it, then replayed elsewhere"
            );
            assert_eq!(status, 502, "POST {id}: {answer}");
            assert_eq!(answer["error"], "bad_gateway");
            a_hits += 1;
            if a_hits == 2 {
                break;
            }
        } else {
            assert_eq!(who.len(), 1, "POST {id} reached {who:?}");
            assert_eq!(
                (status, answer["replica"].as_str()),
                (200, Some(who[0].as_str()))
            );
            assert_eq!(log.matching(&format!("id={id}&"))[0].body, body.as_bytes());
        }
    }
    assert!(
        a_hits >= 1,
        "no POST reached A in 15 tries: nothing was tested"
    );
    // Nothing arrives late either.
    tokio::time::sleep(Duration::from_millis(500)).await;
    for h in log.matching(&format!("id={tag}")) {
        let id = h.target.split("id=").nth(1).unwrap_or_default();
        assert_eq!(
            log.replicas_for(&format!("id={id}")).len(),
            1,
            "{} reached more than one replica",
            h.target
        );
    }
}

#[tokio::test]
async fn a_post_reset_by_a_replica_after_reading_it_is_not_replayed_and_the_client_gets_502() {
    let log = HitLog::new();
    let [a, b, c] = three_replicas(&log);
    a.set_reset_before_answer(true);
    let gw = gateway(&urls(&[&a, &b, &c]), "balance = \"round_robin\"", "");
    let (key, _) = gw.create_key("infer", &[]);
    posts_reset_by_a_are_not_replayed(&gw, &key, &log, "fresh").await;
}

#[tokio::test]
async fn a_post_reset_on_a_reused_upstream_connection_is_not_replayed_either() {
    let log = HitLog::new();
    let [a, b, c] = three_replicas(&log);
    let gw = gateway(&urls(&[&a, &b, &c]), "balance = \"round_robin\"", "");
    let (key, _) = gw.create_key("infer", &[]);
    // Warm a kept-alive connection to each replica, then A starts resetting: the next request
    // to A goes out on a pooled connection (where Pingora would retry an idempotent request).
    for i in 0..6 {
        get_ok(&gw, &key, &format!("/v1/infer/warm?i={i}")).await;
    }
    assert!(log.count("A") >= 1);
    a.set_reset_before_answer(true);
    posts_reset_by_a_are_not_replayed(&gw, &key, &log, "reused").await;
}

// ---------------------------------------------------------------------------------------
// Connect failures, health, ejection
// ---------------------------------------------------------------------------------------

#[tokio::test]
async fn a_refused_replica_is_skipped_so_every_request_succeeds_on_the_others() {
    let log = HitLog::new();
    let a = Upstream::local("A", &log);
    let dead = Upstream::stopped_local("DEAD", &log);
    let c = Upstream::local("C", &log);
    // No health check: only connect failover (then passive ejection) keeps DEAD out.
    let gw = gateway(&urls(&[&a, &dead, &c]), "balance = \"round_robin\"", "");
    let (key, _) = gw.create_key("infer", &[]);
    let mut count: HashMap<String, usize> = HashMap::new();
    for i in 0..12 {
        let t = Instant::now();
        let who = get_ok(&gw, &key, &format!("/v1/infer/x?i={i}")).await;
        assert!(
            t.elapsed() < Duration::from_secs(1),
            "refused connects are instant"
        );
        *count.entry(who).or_default() += 1;
    }
    assert!(
        count.get("A").is_some_and(|n| *n >= 3) && count.get("C").is_some_and(|n| *n >= 3),
        "{count:?}"
    );
}

#[tokio::test]
async fn a_connect_timeout_fails_over_and_three_timeouts_eject_the_replica_until_its_cool_down_ends(
) {
    let log = HitLog::new();
    let hole = Blackhole::start();
    let good = Upstream::local("G", &log);
    let service = "balance = \"round_robin\"\nconnect_timeout_seconds = 1\n\
                   eject_after_connect_failures = 3\neject_seconds = 4";
    let gw = gateway(&[hole.url(), good.url("")], service, "");
    let (key, _) = gw.create_key("infer", &[]);

    let mut slow = Vec::new();
    for i in 0..10 {
        let t = Instant::now();
        let who = get_ok(&gw, &key, &format!("/v1/infer/t?i={i}")).await;
        assert_eq!(
            who, "G",
            "a connect timeout moves the request on, it is not a 504"
        );
        slow.push(t.elapsed() >= Duration::from_millis(900));
    }
    let n_slow = slow.iter().filter(|s| **s).count();
    assert!(
        (1..=3).contains(&n_slow),
        "round robin over [blackhole, good]: the blackhole costs a connect timeout at most 3 \
         times before it is ejected, got {n_slow} slow requests: {slow:?}"
    );
    assert!(
        slow[6..].iter().all(|s| !s),
        "after 3 consecutive connect timeouts the blackhole should be out: {slow:?}"
    );

    // After eject_seconds it is tried again (and fails over again).
    tokio::time::sleep(Duration::from_secs(6)).await;
    let mut again = Vec::new();
    for i in 0..4 {
        let t = Instant::now();
        let who = get_ok(&gw, &key, &format!("/v1/infer/again?i={i}")).await;
        assert_eq!(who, "G");
        again.push(t.elapsed() >= Duration::from_millis(900));
    }
    assert!(
        again.iter().any(|s| *s),
        "the ejection should end after eject_seconds = 4: {again:?}"
    );
}

#[tokio::test]
async fn every_replica_down_answers_502_promptly_while_healthz_stays_200_and_all_report_unhealthy()
{
    let log = HitLog::new();
    let reps = [
        Upstream::stopped_local("A", &log),
        Upstream::stopped_local("B", &log),
        Upstream::stopped_local("C", &log),
    ];
    let service = format!("connect_timeout_seconds = 1\n{HEALTH_1S}");
    let gw = gateway(&urls(&[&reps[0], &reps[1], &reps[2]]), &service, "");
    let (key, _) = gw.create_key("infer", &[]);

    let check_502 = |round: &'static str| {
        let gw = &gw;
        let key = &key;
        async move {
            for i in 0..4 {
                let t = Instant::now();
                let (status, body) = send(gw, key, "GET", &format!("/v1/infer/x?i={i}"), None)
                    .await
                    .unwrap_or_else(|e| panic!("{round}: {e}"));
                assert_eq!(
                    (status, &body["error"]),
                    (502, &serde_json::json!("bad_gateway"))
                );
                assert!(
                    t.elapsed() < Duration::from_secs(2),
                    "{round}: 502 after {:?}",
                    t.elapsed()
                );
                let (status, _, body) =
                    gw.raw(b"GET /healthz HTTP/1.1\r\nHost: gw\r\nConnection: close\r\n\r\n");
                assert_eq!(
                    status,
                    200,
                    "{round}: /healthz {}",
                    String::from_utf8_lossy(&body)
                );
            }
        }
    };
    check_502("before any health check").await;
    let down: Vec<(String, f64)> = reps.iter().map(|r| (r.host_port(), 0.0)).collect();
    let down: Vec<(&str, f64)> = down.iter().map(|(r, v)| (r.as_str(), *v)).collect();
    wait_healthy(&gw, &down, Duration::from_secs(10)).await;
    // Every replica out: tried anyway, refused, still a prompt 502.
    check_502("all ejected").await;

    // One comes back: it passes its check, reports 1, and serves.
    reps[1].restart();
    wait_healthy(&gw, &[(&reps[1].host_port(), 1.0)], Duration::from_secs(5)).await;
    assert_eq!(get_ok(&gw, &key, "/v1/infer/back").await, "B");
    assert!(log.health_checks("B") >= 1);
}

#[tokio::test]
async fn a_replica_failing_its_health_check_gets_no_requests_until_it_passes_again() {
    let log = HitLog::new();
    let (a, b, c) = (
        Upstream::local("A", &log),
        Upstream::stopped_local("B", &log),
        Upstream::local("C", &log),
    );
    // A answers requests fine but its health check says 503; B refuses everything.
    a.set_healthy(false);
    let service = format!("balance = \"round_robin\"\n{HEALTH_1S}");
    let gw = gateway(&urls(&[&a, &b, &c]), &service, "");
    let (key, _) = gw.create_key("infer", &[]);
    wait_healthy(
        &gw,
        &[
            (&a.host_port(), 0.0),
            (&b.host_port(), 0.0),
            (&c.host_port(), 1.0),
        ],
        Duration::from_secs(10),
    )
    .await;
    for i in 0..6 {
        assert_eq!(get_ok(&gw, &key, &format!("/v1/infer/x?i={i}")).await, "C");
    }
    assert!(log.health_checks("A") >= 1, "A was never health-checked");
    assert!(
        log.requests().iter().all(|h| h.replica != "A"),
        "an unhealthy replica got traffic"
    );

    a.set_healthy(true);
    wait_healthy(&gw, &[(&a.host_port(), 1.0)], Duration::from_secs(5)).await;
    let mut count: HashMap<String, usize> = HashMap::new();
    for i in 0..6 {
        let who = get_ok(&gw, &key, &format!("/v1/infer/y?i={i}")).await;
        *count.entry(who).or_default() += 1;
    }
    assert!(
        count.get("A").is_some_and(|n| *n >= 2),
        "A passes again and should be back in the rotation: {count:?}"
    );
    assert_eq!(count.get("B"), None);
}

// ---------------------------------------------------------------------------------------
// Live DNS
// ---------------------------------------------------------------------------------------

const P_IP: Ipv4Addr = Ipv4Addr::new(127, 0, 0, 2);
const Q_IP: Ipv4Addr = Ipv4Addr::new(127, 0, 0, 3);

/// P on 127.0.0.2:PORT and Q on 127.0.0.3:PORT; the DNS name points at P.
fn dns_setup(log: &HitLog) -> (Dns, Upstream, Upstream, u16) {
    let port = free_port_on(&[P_IP, Q_IP]);
    let p = Upstream::replica("P", SocketAddr::from((P_IP, port)), log);
    let q = Upstream::replica("Q", SocketAddr::from((Q_IP, port)), log);
    let dns = Dns::start();
    dns.set(DNS_NAME, &[P_IP]);
    (dns, p, q, port)
}

async fn wait_answered_by(gw: &Gateway, key: &str, want: &str, within: Duration) {
    let t = Instant::now();
    let mut i = 0;
    loop {
        let who = get_ok(gw, key, &format!("/v1/infer/move?i={i}")).await;
        if who == want {
            return;
        }
        assert!(
            t.elapsed() < within,
            "traffic still on {who} {within:?} after the DNS change:\n{}",
            gw.log()
        );
        i += 1;
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

#[tokio::test]
async fn a_changed_dns_answer_moves_traffic_to_the_new_address_without_a_restart() {
    let log = HitLog::new();
    let (dns, _p, _q, port) = dns_setup(&log);
    // The single-string form of `upstream`, a host name instead of an address.
    let gw = Gateway::builder()
        .service(Service::new("infer", format!("http://{DNS_NAME}:{port}")).dns_refresh(1))
        .extra(&format!("[dns]\nservers = [\"{}\"]\n", dns.addr()))
        .start();
    let (key, _) = gw.create_key("infer", &[]);
    for i in 0..3 {
        assert_eq!(get_ok(&gw, &key, &format!("/v1/infer/x?i={i}")).await, "P");
    }
    let asked = dns.queries_for(DNS_NAME);
    assert!(
        asked >= 1,
        "the gateway never asked the configured DNS server"
    );

    dns.set(DNS_NAME, &[Q_IP]);
    // P stays up: only a re-resolution can move the traffic.
    wait_answered_by(&gw, &key, "Q", Duration::from_secs(6)).await;
    for i in 0..5 {
        assert_eq!(
            get_ok(&gw, &key, &format!("/v1/infer/after?i={i}")).await,
            "Q"
        );
    }
    assert!(dns.queries_for(DNS_NAME) > asked);
}

#[tokio::test]
async fn dns_failures_keep_the_last_good_address_off_the_request_path_and_a_later_answer_still_counts(
) {
    let log = HitLog::new();
    let (dns, _p, _q, port) = dns_setup(&log);
    // The list form of `upstream`, one replica named by DNS.
    let gw = Gateway::builder()
        .service(Service::replicas("infer", &[format!("http://{DNS_NAME}:{port}")]).dns_refresh(1))
        .extra(&format!("[dns]\nservers = [\"{}\"]\n", dns.addr()))
        .start();
    let (key, _) = gw.create_key("infer", &[]);
    assert_eq!(get_ok(&gw, &key, "/v1/infer/first").await, "P");

    // NXDOMAIN, then a server that answers nothing: traffic stays on P, at full speed.
    for (what, fail) in [
        (
            "nxdomain",
            Box::new(|d: &Dns| d.remove(DNS_NAME)) as Box<dyn Fn(&Dns)>,
        ),
        ("silent", Box::new(|d: &Dns| d.set_silent(true))),
    ] {
        let asked = dns.queries_for(DNS_NAME);
        fail(&dns);
        let t = Instant::now();
        let mut i = 0;
        while t.elapsed() < Duration::from_secs(4) {
            let sent = Instant::now();
            let who = get_ok(&gw, &key, &format!("/v1/infer/{what}?i={i}")).await;
            assert_eq!(who, "P", "{what}: the last good address must be kept");
            assert!(
                sent.elapsed() < Duration::from_secs(1),
                "{what}: a request took {:?}: a resolver call on the request path?",
                sent.elapsed()
            );
            i += 1;
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
        assert!(
            dns.queries_for(DNS_NAME) > asked,
            "{what}: the gateway stopped re-resolving"
        );
    }
    assert!(
        log.requests().iter().all(|h| h.replica == "P"),
        "nothing may have reached Q yet"
    );

    // The server recovers with a new address: the refresher is still alive and moves traffic.
    // (A lookup begun while the server was silent may take its resolver's full timeout, e.g.
    // hickory with 2 s x 2 attempts over UDP and TCP ~ 12 s, before the next one starts.)
    dns.set(DNS_NAME, &[Q_IP]);
    dns.set_silent(false);
    wait_answered_by(&gw, &key, "Q", Duration::from_secs(20)).await;
}

// ---------------------------------------------------------------------------------------
// Access log
// ---------------------------------------------------------------------------------------

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

// ---------------------------------------------------------------------------------------
// The test helpers themselves (no gateway): so a failure above is not the harness's fault
// ---------------------------------------------------------------------------------------

#[test]
fn helper_dns_server_answers_a_records_nxdomain_and_nodata_over_udp_and_tcp() {
    use std::io::{Read, Write};
    use testkit::dns::{a_query, parse_a_answer};
    let dns = Dns::start();
    dns.set("replica.test", &[P_IP, Q_IP]);
    let udp = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
    udp.set_read_timeout(Some(Duration::from_secs(2))).unwrap();
    let ask = |id: u16, name: &str, qtype: u16| {
        udp.send_to(&a_query(id, name, qtype), dns.addr()).unwrap();
        let mut buf = [0u8; 1500];
        let (n, _) = udp.recv_from(&mut buf).unwrap();
        assert_eq!(&buf[..2], &id.to_be_bytes(), "the id is echoed");
        parse_a_answer(&buf[..n]).unwrap()
    };
    assert_eq!(ask(7, "Replica.Test.", 1), (0, vec![P_IP, Q_IP]));
    assert_eq!(ask(8, "replica.test", 28), (0, vec![]));
    assert_eq!(ask(9, "other.test", 1), (3, vec![]));
    dns.set("replica.test", &[Q_IP]);
    assert_eq!(ask(10, "replica.test", 1), (0, vec![Q_IP]));
    dns.remove("replica.test");
    assert_eq!(ask(11, "replica.test", 1), (3, vec![]));

    dns.set("replica.test", &[P_IP]);
    let mut tcp = std::net::TcpStream::connect(dns.addr()).unwrap();
    tcp.set_read_timeout(Some(Duration::from_secs(2))).unwrap();
    let q = a_query(12, "replica.test", 1);
    tcp.write_all(&(q.len() as u16).to_be_bytes()).unwrap();
    tcp.write_all(&q).unwrap();
    let mut len = [0u8; 2];
    tcp.read_exact(&mut len).unwrap();
    let mut msg = vec![0u8; u16::from_be_bytes(len) as usize];
    tcp.read_exact(&mut msg).unwrap();
    assert_eq!(parse_a_answer(&msg).unwrap(), (0, vec![P_IP]));

    dns.set_silent(true);
    let before = dns.queries();
    udp.send_to(&a_query(13, "replica.test", 1), dns.addr())
        .unwrap();
    let mut buf = [0u8; 1500];
    assert!(
        udp.recv_from(&mut buf).is_err(),
        "a silent server answers nothing"
    );
    assert_eq!(dns.queries(), before + 1);
    assert_eq!(dns.queries_for("replica.test"), 6);
}

#[test]
fn helper_blackhole_times_out_connects_instead_of_refusing_them() {
    let hole = Blackhole::start();
    let t = Instant::now();
    let r = std::net::TcpStream::connect_timeout(&hole.addr, Duration::from_millis(700));
    assert!(r.is_err(), "a blackhole connect should not succeed");
    assert!(
        t.elapsed() >= Duration::from_millis(600),
        "refused rather than timed out: {r:?} after {:?}",
        t.elapsed()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn helper_replica_kill_resets_open_streams_refuses_connects_and_restarts_on_the_same_address()
{
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let log = HitLog::new();
    let port = free_port_on(&[P_IP, Q_IP]);
    let p = Upstream::replica("P", SocketAddr::from((P_IP, port)), &log);
    let q = Upstream::replica("Q", SocketAddr::from((Q_IP, port)), &log);
    let ask = |addr: SocketAddr, req: &'static str| async move {
        let mut s = tokio::net::TcpStream::connect(addr).await?;
        s.write_all(req.as_bytes()).await?;
        let mut out = Vec::new();
        let r = s.read_to_end(&mut out).await;
        Ok::<_, std::io::Error>((String::from_utf8_lossy(&out).into_owned(), r.err()))
    };
    let get = "GET /x HTTP/1.1\r\nHost: r\r\nConnection: close\r\n\r\n";
    // Connection: close is not honoured by the replica (it keeps the connection): read with
    // a deadline instead of to the end.
    let first_response_to = |addr: SocketAddr, req: &'static str| async move {
        let mut s = tokio::net::TcpStream::connect(addr).await.unwrap();
        s.write_all(req.as_bytes()).await.unwrap();
        let mut buf = vec![0u8; 4096];
        let n = s.read(&mut buf).await.unwrap();
        String::from_utf8_lossy(&buf[..n]).into_owned()
    };
    let first_response = |addr: SocketAddr| first_response_to(addr, get);
    assert!(first_response(p.addr).await.contains("\"replica\":\"P\""));
    assert!(first_response(q.addr).await.contains("\"replica\":\"Q\""));

    // A stream in flight on P: the kill cuts it with a reset and counts it.
    let mut s = tokio::net::TcpStream::connect(p.addr).await.unwrap();
    s.write_all(b"GET /sse?n=100&gap_ms=100 HTTP/1.1\r\nHost: r\r\n\r\n")
        .await
        .unwrap();
    let mut buf = vec![0u8; 4096];
    let n = s.read(&mut buf).await.unwrap();
    assert!(String::from_utf8_lossy(&buf[..n]).contains("event-stream"));
    assert_eq!(p.in_flight(), 1);
    let cut = tokio::task::block_in_place(|| p.kill());
    assert_eq!(cut, 1);
    let ended = tokio::time::timeout(Duration::from_secs(3), async {
        loop {
            match s.read(&mut buf).await {
                Ok(0) => return "eof",
                Ok(_) => continue,
                Err(_) => return "reset",
            }
        }
    })
    .await
    .expect("the stream hung after the kill");
    assert_eq!(ended, "reset");
    let refused = tokio::net::TcpStream::connect(p.addr).await;
    assert!(refused.is_err(), "a killed replica refuses connections");
    assert!(first_response(q.addr).await.contains("\"replica\":\"Q\""));

    p.restart();
    assert!(first_response(p.addr).await.contains("\"replica\":\"P\""));

    // Reset before answering: the request is logged, the client sees a reset and no response.
    p.set_reset_before_answer(true);
    let (got, err) = ask(
        p.addr,
        "POST /gen?id=r1& HTTP/1.1\r\nHost: r\r\ncontent-length: 2\r\n\r\n{}",
    )
    .await
    .unwrap();
    assert!(got.is_empty(), "{got}");
    assert!(err.is_some(), "a reset, not a clean close");
    assert_eq!(log.replicas_for("id=r1&"), ["P"]);
    assert_eq!(log.matching("id=r1&")[0].body, b"{}");
    // Health checks still answer; unhealthy is a 503.
    p.set_healthy(false);
    let health = "GET /health HTTP/1.1\r\nHost: r\r\n\r\n";
    assert!(first_response_to(p.addr, health)
        .await
        .starts_with("HTTP/1.1 503"));
    p.set_healthy(true);
    assert!(first_response_to(p.addr, health)
        .await
        .starts_with("HTTP/1.1 200"));
    assert_eq!(log.health_checks("P"), 2);
}
