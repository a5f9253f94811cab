//! Replicas end to end: the real gateway binary in front of several recording
//! replicas on real TCP; load balancing, connect failover, health checks, passive ejection,
//! no replay after a request reached a replica, live DNS, and what metrics and the access log
//! say about it. The replicas are `testkit::upstream`, the DNS server `testkit::dns`.
//!
//! Config under test, per service: `upstream = [..]` (or one string), `balance`,
//! `health_check = { path, interval_seconds, timeout_seconds }`, `dns_refresh_seconds`,
//! `eject_after_connect_failures`, `eject_seconds`, `connect_timeout_seconds`; and `[dns] servers`.
//!
//! By theme: `balancing` (least_requests, round_robin), `restarts` (a replica killed mid-load
//! and restarted), `no_replay` (a POST reset after reading), `health` (connect failures, health
//! checks, ejection), `dns` (live DNS), `access_log` (the replica named) and `helpers` (the test
//! kit's DNS server, blackhole and replica kill on their own). The helpers below are theirs.

mod access_log;
mod balancing;
mod dns;
mod health;
mod helpers;
mod no_replay;
mod restarts;

use std::collections::HashMap;
use std::net::Ipv4Addr;
use std::time::{Duration, Instant};

use testkit::{Gateway, HitLog, Service, Upstream};

const HEALTH_1S: &str =
    "health_check = { path = \"/health\", interval_seconds = 1, timeout_seconds = 1 }";
const DNS_NAME: &str = "replica.test";
/// The two loopback addresses of the DNS tests' replicas P and Q.
const P_IP: Ipv4Addr = Ipv4Addr::new(127, 0, 0, 2);
const Q_IP: Ipv4Addr = Ipv4Addr::new(127, 0, 0, 3);

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
