//! A replica dies and comes back: killed mid-load, restarted on the same address.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use testkit::HitLog;

use super::{
    drain, gateway, get_ok, only, send, sse_path, three_replicas, urls, wait_healthy, HEALTH_1S,
};

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
