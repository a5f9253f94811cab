//! Nothing recorded is lost or counted twice: across a clean stop and start, a graceful
//! upgrade with a stream still running in the old process, `kill -9` after `flush_seconds`,
//! a Postgres restart, and three gateways writing one ledger at full load.

use std::thread;
use std::time::{Duration, Instant};

use serde_json::{json, Value};
use testkit::postgres::{Postgres, PASSWORD};
use testkit::{raw, Gateway};

use super::{chat, key, metric, post, total, usage_cli, wait_for, Fixture, CHAT};

/// The ledger's totals by key, from the store, through the CLI.
fn by_key(gw: &Gateway) -> Vec<Value> {
    usage_cli(&gw.config, &["--group-by", "key"])
}

fn requests_of(rows: &[Value], key_id: &str) -> (u64, u64, u64) {
    rows.iter()
        .find(|r| r["key"] == json!(key_id))
        .map_or((0, 0, 0), |r| {
            (
                r["requests"].as_u64().unwrap(),
                r["prompt_tokens"].as_u64().unwrap(),
                r["completion_tokens"].as_u64().unwrap(),
            )
        })
}

/// Waits for the data plane of whatever process now serves `port`.
fn wait_serving(port: u16) {
    let deadline = Instant::now() + Duration::from_secs(20);
    let health = b"GET /healthz HTTP/1.1\r\nHost: t\r\nConnection: close\r\n\r\n";
    while !testkit::try_raw(port, health).is_ok_and(|r| r.0 == 200) {
        assert!(Instant::now() < deadline, "nothing serves port {port}");
        thread::sleep(Duration::from_millis(50));
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn usage_survives_a_restart_and_kill_9_loses_nothing_older_than_flush_seconds() {
    let fx = Fixture::start().await;
    // Flushing hourly: only the last flush of the stop can have written anything.
    let mut gw = fx.gateway_flushing(None, None, 5, 3600);
    let (k, id) = key(&gw, None);
    for _ in 0..4 {
        assert_eq!(chat(gw.port, &k, "m1", false), 200);
    }
    assert_eq!(
        requests_of(&by_key(&gw), &id),
        (0, 0, 0),
        "nothing written yet"
    );
    gw.signal("TERM");
    tokio::task::block_in_place(|| gw.wait_exit(Duration::from_secs(20)))
        .expect("no exit after SIGTERM");
    assert_eq!(requests_of(&by_key(&gw), &id), (4, 44, 20), "{}", gw.log());

    // Started again on the same store, flushing every second: the totals carry on.
    let config = gw.dir.path().join("second.toml");
    let text = std::fs::read_to_string(&gw.config).unwrap();
    std::fs::write(
        &config,
        text.replace("flush_seconds = 3600", "flush_seconds = 1"),
    )
    .unwrap();
    let mut second = gw.spawn_serve(&config, &[], "second.log");
    tokio::task::block_in_place(|| wait_serving(gw.port));
    for _ in 0..3 {
        assert_eq!(chat(gw.port, &k, "m1", false), 200);
    }
    // flush_seconds is 1: two seconds after the last response its usage is stored, so a
    // kill -9 now loses none of it.
    thread::sleep(Duration::from_secs(2));
    second.signal("KILL");
    tokio::task::block_in_place(|| second.wait_exit(Duration::from_secs(5)));
    assert_eq!(
        requests_of(&by_key(&gw), &id),
        (7, 77, 35),
        "{}",
        second.log()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_upgrade_counts_the_stream_the_old_process_finishes_in_its_grace_period() {
    let fx = Fixture::start().await;
    // Flushing hourly: what is written, the stops' last flushes wrote.
    let mut gw = fx.gateway_flushing(None, None, 30, 3600);
    let (streamer, stream_id) = key(&gw, None);
    let (other, other_id) = key(&gw, None);
    // A 3-second stream, still running in the old process when it hands its sockets over.
    let port = gw.port;
    let body =
        json!({"model": "m1", "stream": true, "messages": [{"role": "user", "content": "x"}]});
    let stream = thread::spawn(move || {
        let path = format!("{CHAT}?n=30&gap_ms=100&split_ms=5");
        let body = body.to_string();
        let req = format!(
            "POST {path} HTTP/1.1\r\nHost: gw\r\nAuthorization: Bearer {streamer}\r\n\
             Content-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
            body.len()
        );
        raw(port, req.as_bytes())
    });
    thread::sleep(Duration::from_millis(500));
    let mut new = tokio::task::block_in_place(|| gw.spawn_upgrade(&gw.config));
    gw.signal("QUIT");
    let (status, _, streamed) = stream.join().unwrap();
    assert_eq!(status, 200);
    assert!(
        String::from_utf8_lossy(&streamed).contains("[DONE]"),
        "the stream was cut"
    );
    tokio::task::block_in_place(|| gw.wait_exit(Duration::from_secs(30)))
        .expect("the old process is still running");
    // The old process flushed after its stream ended.
    let rows = by_key(&gw);
    assert_eq!(
        requests_of(&rows, &stream_id),
        (1, 21, 9),
        "old log:\n{}",
        gw.log()
    );
    for _ in 0..2 {
        assert_eq!(chat(gw.port, &other, "m1", false), 200);
    }
    assert!(new.wait_exit(Duration::ZERO).is_none(), "{}", new.log());
    // SIGINT, the fast stop, flushes too.
    new.signal("INT");
    tokio::task::block_in_place(|| new.wait_exit(Duration::from_secs(10)))
        .expect("no exit after SIGINT");
    let rows = by_key(&gw);
    assert_eq!(
        requests_of(&rows, &other_id),
        (2, 22, 10),
        "new log:\n{}",
        new.log()
    );
    assert_eq!(requests_of(&rows, &stream_id), (1, 21, 9));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_postgres_restart_loses_no_usage_the_writes_are_retried() {
    let mut pg = tokio::task::block_in_place(Postgres::start);
    let fx = Fixture::start().await;
    let gw = fx.gateway(Some(&pg.url), None, 5);
    let (k, id) = key(&gw, None);
    for _ in 0..3 {
        assert_eq!(chat(gw.port, &k, "m1", false), 200);
    }
    wait_for(
        Duration::from_secs(5),
        || by_key(&gw),
        |rows| total(rows, "requests") >= 3,
    );
    if !pg.is_local() {
        eprintln!("an external Postgres cannot be restarted here: skipping the outage");
        return;
    }
    tokio::task::block_in_place(|| pg.stop());
    // The key is cached: requests go on while the store is down, and are metered.
    for _ in 0..4 {
        assert_eq!(chat(gw.port, &k, "m1", false), 200);
    }
    thread::sleep(Duration::from_millis(2500));
    assert!(metric(&gw, "portcullis_ledger_flushes_total{result=\"error\"} ") >= 1);
    assert!(metric(&gw, "portcullis_ledger_pending_rows ") >= 1);
    tokio::task::block_in_place(|| pg.restart());
    let rows = wait_for(
        Duration::from_secs(10),
        || by_key(&gw),
        |rows| total(rows, "requests") >= 7,
    );
    assert_eq!(requests_of(&rows, &id), (7, 77, 35), "{}", gw.log());
    thread::sleep(Duration::from_millis(1500));
    assert_eq!(metric(&gw, "portcullis_ledger_pending_rows "), 0);
    let log = gw.log();
    assert!(log.contains("usage ledger: cannot write"), "{log}");
    assert!(!log.contains(PASSWORD), "the database password was logged");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_gateways_on_one_postgres_write_one_ledger_at_most_one_write_per_flush_each() {
    let pg = tokio::task::block_in_place(Postgres::start);
    let fx = Fixture::start().await;
    let started = Instant::now();
    let fleet: Vec<Gateway> = (0..3).map(|_| fx.gateway(Some(&pg.url), None, 5)).collect();
    let (k, id) = key(&fleet[0], None);
    let carol = fx.token("carol", "chat");
    // Two clients per gateway, as fast as they go, for 4 s: one with the key, one with a JWT.
    let load = Duration::from_secs(4);
    let clients: Vec<_> = fleet
        .iter()
        .flat_map(|gw| [(gw.port, k.clone()), (gw.port, carol.clone())])
        .map(|(port, token)| {
            thread::spawn(move || {
                let until = Instant::now() + load;
                let mut ok = 0u64;
                while Instant::now() < until {
                    let body = r#"{"model":"m1","messages":[{"role":"user","content":"hi"}]}"#;
                    if post(port, &token, CHAT, body) == 200 {
                        ok += 1;
                    }
                }
                ok
            })
        })
        .collect();
    let ok: Vec<u64> = clients.into_iter().map(|c| c.join().unwrap()).collect();
    let (by_key_ok, by_jwt_ok): (u64, u64) = (
        ok.iter().step_by(2).sum(),
        ok.iter().skip(1).step_by(2).sum(),
    );
    let sent = by_key_ok + by_jwt_ok;
    let rows = wait_for(
        Duration::from_secs(5),
        || by_key(&fleet[0]),
        |rows| total(rows, "requests") >= sent,
    );
    let jwt = rows
        .iter()
        .find(|r| r["key"].is_null() && r["owner"] == "carol");
    eprintln!(
        "3 gateways, {load:?} of load: {sent} requests answered, ledger {} requests",
        total(&rows, "requests")
    );
    assert_eq!(
        requests_of(&rows, &id),
        (by_key_ok, 11 * by_key_ok, 5 * by_key_ok)
    );
    assert_eq!(jwt.unwrap()["requests"], json!(by_jwt_ok));
    assert_eq!(
        total(&rows, "requests"),
        sent,
        "nothing lost, nothing twice"
    );
    // Writes: at most one per flush interval (1 s) per gateway, however many requests.
    let uptime = started.elapsed().as_secs() + 1;
    for gw in &fleet {
        let writes = metric(gw, "portcullis_ledger_flushes_total{result=\"ok\"} ")
            + metric(gw, "portcullis_ledger_flushes_total{result=\"error\"} ");
        eprintln!(
            "gateway {}: {writes} ledger writes in about {uptime} s",
            gw.port
        );
        assert!(
            writes >= 1 && writes <= uptime,
            "{writes} writes in {uptime} s"
        );
    }
    assert!(sent > 50, "too little load to mean anything: {sent}");
}
