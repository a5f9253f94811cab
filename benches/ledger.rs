//! The usage ledger's report query, `GET /v1/usage` and `portcullis usage` read it, on a
//! ledger of 100 keys × 90 days of hourly rows (216 000 rows in `usage_hourly`, 9 000 in
//! `usage_daily`) on SQLite and on a throwaway PostgreSQL server started for the run; and what
//! one flush of a busy gateway costs (500 rows added in one transaction).
//! Run with `make bench` (or `cargo bench --bench ledger`); figures go to stdout.

use std::sync::Arc;
use std::time::{Duration, Instant};

use criterion::{criterion_group, criterion_main, Criterion};
use portcullis::{open_store, Grouping, LedgerStore, UsageCounts, UsageQuery, UsageRow};
use testkit::postgres;

const KEYS: usize = 100;
/// Keys per owner: 20 owners of 5 keys each.
const KEYS_PER_OWNER: usize = 5;
const DAYS: i64 = 90;
const DAY: i64 = 86_400;
/// The last day of the ledger (2026-11-25), and so the `to` of every report.
const LAST: i64 = 1_795_564_800;

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .unwrap()
}

fn row(hour: i64, key: usize) -> UsageRow {
    UsageRow {
        hour,
        key_id: format!("{key:016x}"),
        owner: format!("owner-{}", key / KEYS_PER_OWNER),
        service: "chat".into(),
        model: format!("model-{}", key % 3),
        team: String::new(),
        counts: UsageCounts {
            requests: 10,
            prompt_tokens: 1_100,
            completion_tokens: 500,
            reasoning_tokens: 50,
            cached_tokens: 100,
            estimated_requests: 0,
            ..Default::default()
        },
    }
}

/// Every hour of the 90 days for every key, one day (2 400 rows) per flush.
fn fill(rt: &tokio::runtime::Runtime, store: &dyn LedgerStore) {
    let start = Instant::now();
    for day in 0..DAYS {
        let first = LAST - (DAYS - 1 - day) * DAY;
        let rows: Vec<UsageRow> = (0..24)
            .flat_map(|h| (0..KEYS).map(move |k| row(first + h * 3600, k)))
            .collect();
        rt.block_on(store.add_usage(&rows)).unwrap();
    }
    println!(
        "filled {} hourly rows in {:.1} s",
        KEYS as i64 * DAYS * 24,
        start.elapsed().as_secs_f64()
    );
}

fn all() -> Grouping {
    Grouping {
        day: true,
        key: true,
        service: true,
        model: true,
        team: false,
    }
}

fn ledger(c: &mut Criterion) {
    let rt = runtime();
    let dir = tempfile::tempdir().unwrap();
    let sqlite = format!("sqlite://{}/keys.db", dir.path().display());
    let pg = postgres::Postgres::start();
    for (name, url) in [("sqlite", sqlite.as_str()), ("postgres", pg.url.as_str())] {
        let store: Arc<dyn LedgerStore> = rt.block_on(open_store(url, false)).unwrap();
        fill(&rt, &*store);
        if name == "postgres" {
            // What autovacuum does soon after a fill of this size: the planner's statistics.
            pg.sql("ANALYZE");
        }
        let reports = [
            // An administrator's 90 days, every part: 9 000 rows.
            ("admin_90_days_by_day_key_service_model", None, DAYS, all()),
            // The default report: 30 days, every part: 3 000 rows.
            ("admin_30_days_by_day_key_service_model", None, 30, all()),
            // Aggregated: 90 days by day and key, every key (9 000 groups of one row each).
            (
                "admin_90_days_by_day_key",
                None,
                DAYS,
                Grouping {
                    day: true,
                    key: true,
                    ..Grouping::default()
                },
            ),
            // One owner (5 keys), 90 days by day and key (the console's key chart): 450 rows.
            (
                "owner_90_days_by_day_key",
                Some("owner-7"),
                DAYS,
                Grouping {
                    day: true,
                    key: true,
                    ..Grouping::default()
                },
            ),
            // Totals per owner over 90 days: 20 rows out of 9 000.
            ("admin_90_days_per_owner", None, DAYS, Grouping::default()),
        ];
        for (label, owner, days, group) in reports {
            let query = UsageQuery {
                from_day: LAST - (days - 1) * DAY,
                to_day: LAST,
                owner: owner.map(str::to_string),
                team: None,
                group,
            };
            let rows = rt.block_on(store.usage(&query)).unwrap().len();
            println!("{name} {label}: {rows} rows");
            c.bench_function(&format!("usage/{name}/{label}"), |b| {
                b.iter(|| rt.block_on(store.usage(&query)).unwrap())
            });
        }
        // One flush of a busy gateway: 500 distinct rows of the current hour, one transaction.
        let flush: Vec<UsageRow> = (0..500).map(|k| row(LAST + DAY, k)).collect();
        c.bench_function(&format!("usage/{name}/flush_500_rows"), |b| {
            b.iter(|| rt.block_on(store.add_usage(&flush)).unwrap())
        });
    }
}

criterion_group! {
    name = benches;
    config = Criterion::default()
        .warm_up_time(Duration::from_millis(500))
        .measurement_time(Duration::from_secs(3))
        .sample_size(20);
    targets = ledger
}
criterion_main!(benches);
