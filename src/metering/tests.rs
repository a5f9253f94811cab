//! The meter's totals, and the flusher against a real SQLite file and an unreachable server.

use std::sync::Arc;
use std::time::Duration;

use super::{Charge, Ledger, Meter};
use crate::observe::metrics::Metrics;
use crate::store::{open_store, Grouping, UsageCounts, UsageQuery, UsageRow};

fn charge<'a>(key: Option<&'a str>, owner: Option<&'a str>, model: Option<&'a str>) -> Charge<'a> {
    Charge {
        key_id: key,
        owner,
        service: "infer",
        model,
        prompt_tokens: 11,
        completion_tokens: 5,
        reasoning_tokens: 2,
        cached_tokens: 3,
        estimated: false,
        team: None,
        cost: crate::metering::Cost::NoTable,
    }
}

#[test]
fn requests_before_and_after_joining_a_team_are_rows_of_their_own() {
    let meter = Meter::new();
    let before = charge(Some("k1"), Some("alice"), Some("m"));
    let after = Charge {
        team: Some("red"),
        ..charge(Some("k1"), Some("alice"), Some("m"))
    };
    meter.record_at(&before, 7200);
    meter.record_at(&before, 7201);
    meter.record_at(&after, 7202);
    let mut rows = meter.take();
    rows.sort_by(|a, b| a.team.cmp(&b.team));
    let teams: Vec<(&str, u64)> = (rows.iter())
        .map(|r| (r.team.as_str(), r.counts.requests))
        .collect();
    assert_eq!(teams, [("", 2), ("red", 1)]);
}

#[test]
fn rows_recorded_by_many_threads_are_taken_as_one_and_the_model_limit_holds_across_them() {
    let meter = Meter::keeping_models(3);
    std::thread::scope(|scope| {
        for t in 0..6 {
            let meter = &meter;
            scope.spawn(move || {
                for i in 0..50u64 {
                    let model = ["m0", "m1", "m2", "m3", "m4", "m5"][((i + t) % 6) as usize];
                    meter.record_at(&charge(Some("k1"), Some("alice"), Some(model)), 7200);
                }
            });
        }
    });
    let rows = meter.take();
    let total: u64 = rows.iter().map(|r| r.counts.requests).sum();
    assert_eq!(total, 300);
    // Three models of their own, the rest as one (other) row: each row once.
    let mut models: Vec<&str> = rows.iter().map(|r| r.model.as_str()).collect();
    models.sort();
    assert_eq!(models.len(), 4, "{models:?}");
    assert!(models.contains(&super::OTHER_MODELS));
    assert!(meter.is_empty());
}

fn text(metrics: &Metrics) -> String {
    String::from_utf8(metrics.render()).unwrap()
}

fn sorted(mut rows: Vec<UsageRow>) -> Vec<UsageRow> {
    rows.sort_by(|a, b| (a.hour, &a.key_id, &a.owner).cmp(&(b.hour, &b.key_id, &b.owner)));
    rows
}

#[test]
fn requests_add_up_per_hour_key_owner_service_and_model() {
    let meter = Meter::new();
    let hour = 1_795_000_000 / 3600 * 3600;
    for _ in 0..3 {
        meter.record_at(&charge(Some("k1"), Some("alice"), Some("m")), hour + 10);
    }
    meter.record_at(
        &Charge {
            estimated: true,
            ..charge(Some("k1"), Some("alice"), Some("m"))
        },
        hour + 3599,
    );
    meter.record_at(&charge(None, Some("alice"), None), hour + 20);
    // The next hour is a row of its own.
    meter.record_at(&charge(Some("k1"), Some("alice"), Some("m")), hour + 3600);
    let rows = sorted(meter.take());
    assert_eq!(rows.len(), 3, "{rows:?}");
    assert_eq!(
        (rows[0].key_id.as_str(), rows[0].model.as_str()),
        ("", ""),
        "a JWT call with no model"
    );
    assert_eq!(rows[0].counts.requests, 1);
    assert_eq!(rows[1].hour, hour);
    assert_eq!(
        rows[1].counts,
        UsageCounts {
            requests: 4,
            prompt_tokens: 44,
            completion_tokens: 20,
            reasoning_tokens: 8,
            cached_tokens: 12,
            estimated_requests: 1,
            ..Default::default()
        }
    );
    assert_eq!((rows[2].hour, rows[2].counts.requests), (hour + 3600, 1));
    assert!(meter.take().is_empty(), "take empties the meter");
}

#[test]
fn a_disabled_meter_records_nothing() {
    let meter = Meter::new();
    assert!(meter.is_empty());
    meter.record_at(&charge(Some("k1"), None, Some("m")), 7200);
    assert!(!meter.is_empty());

    let off = Meter::disabled();
    off.record(&charge(Some("k1"), None, None));
    assert!(off.take().is_empty());
}

#[test]
fn many_threads_recording_at_once_lose_nothing() {
    let meter = Arc::new(Meter::new());
    let threads: Vec<_> = (0..4)
        .map(|t| {
            let meter = meter.clone();
            std::thread::spawn(move || {
                for i in 0..10_000u32 {
                    let key = format!("k{}", i % 50);
                    meter.record(&charge(Some(&key), Some(["a", "b"][t % 2]), Some("m")));
                }
            })
        })
        .collect();
    for t in threads {
        t.join().unwrap();
    }
    let rows = meter.take();
    assert!(rows.len() <= 200, "{}", rows.len());
    let requests: u64 = rows.iter().map(|r| r.counts.requests).sum();
    let prompt: u64 = rows.iter().map(|r| r.counts.prompt_tokens).sum();
    assert_eq!((requests, prompt), (40_000, 440_000));
}

#[test]
fn the_flusher_writes_to_the_store_and_keeps_rows_it_cannot_write() {
    let dir = tempfile::tempdir().unwrap();
    let database = format!("sqlite://{}/keys.db", dir.path().display());
    let metrics = Metrics::new();
    let meter = Arc::new(Meter::new());
    let ledger = Arc::new(Ledger::new(
        meter.clone(),
        &database,
        Duration::from_secs(3600),
        &metrics,
    ));
    ledger.start();
    meter.record(&charge(Some("k1"), Some("alice"), Some("m")));
    meter.record(&charge(Some("k1"), Some("alice"), Some("m")));
    // Generous bounds: the answer comes as soon as the write ends; a loaded CI machine once
    // took longer than 10 s to schedule the flusher's thread.
    assert!(ledger.final_flush(Duration::from_secs(60)));
    let runtime = tokio::runtime::Runtime::new().unwrap();
    let store = runtime.block_on(open_store(&database, false)).unwrap();
    let today = crate::time::unix_now() / 86_400 * 86_400;
    let query = UsageQuery {
        from_day: today,
        to_day: today,
        owner: Some("alice".into()),
        team: None,
        group: Grouping::default(),
    };
    let totals = runtime.block_on(store.usage(&query)).unwrap();
    assert_eq!(totals.len(), 1);
    assert_eq!(totals[0].counts.requests, 2);
    assert!(text(&metrics).contains("portcullis_ledger_flushes_total{result=\"ok\"} 1"));

    // A server nobody listens on: the write fails, the rows stay for the next flush.
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let meter = Arc::new(Meter::new());
    let metrics = Metrics::new();
    let down = Arc::new(Ledger::new(
        meter.clone(),
        &format!("postgres://u:secret@127.0.0.1:{port}/db"),
        Duration::from_secs(3600),
        &metrics,
    ));
    down.start();
    meter.record(&charge(Some("k1"), None, None));
    assert!(!down.final_flush(Duration::from_secs(60)));
    // Kept by the flusher, under its batch id, for the next write.
    assert!(meter.is_empty());
    let text = text(&metrics);
    assert!(text.contains("portcullis_ledger_flushes_total{result=\"error\"} 1"));
    assert!(text.contains("portcullis_ledger_pending_rows 1"));
}

#[test]
fn a_caller_naming_many_models_gets_a_bounded_number_of_rows_an_hour() {
    let meter = Meter::keeping_models(3);
    let hour = 1_795_000_000 / 3600 * 3600;
    let names: Vec<String> = (0..10).map(|i| format!("made-up-{i}")).collect();
    // Across flushes too: the models kept are the caller's of the hour, not of the batch.
    for (i, name) in names.iter().enumerate() {
        meter.record_at(&charge(Some("k1"), None, Some(name)), hour + i as i64);
        if i == 4 {
            let first = meter.take();
            assert_eq!(first.len(), 4, "three models and (other)");
        }
    }
    // A model kept before is still its own row; another caller has its own allowance.
    meter.record_at(&charge(Some("k1"), None, Some("made-up-0")), hour + 20);
    meter.record_at(&charge(Some("k2"), None, Some("made-up-9")), hour + 20);
    let rows = meter.take();
    let mine: Vec<&str> = (rows.iter())
        .filter(|r| r.key_id == "k1")
        .map(|r| r.model.as_str())
        .collect();
    assert_eq!(mine.len(), 2, "{mine:?}");
    assert!(
        mine.contains(&"(other)") && mine.contains(&"made-up-0"),
        "{mine:?}"
    );
    let other = rows.iter().find(|r| r.model == "(other)").unwrap();
    assert_eq!(other.counts.requests, 5);
    assert!(rows
        .iter()
        .any(|r| r.key_id == "k2" && r.model == "made-up-9"));
    // The next hour starts a new allowance.
    meter.forget_models_before(hour + 3600);
    meter.record_at(&charge(Some("k1"), None, Some("made-up-8")), hour + 3600);
    assert_eq!(meter.take()[0].model, "made-up-8");
}
