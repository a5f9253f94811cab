//! The soak: one gateway (Postgres key store, Redis rate limits, JWTs from the test kit's IdP,
//! two services over three least_requests replicas with a health check, one of them
//! `api = "openai"`) under a paced mix of traffic for `SOAK_MINUTES` (60 for `make soak`, 3 in
//! `make test`), with faults on a schedule (`faults.rs`: upgrades, revocations, Postgres, Redis
//! and a replica restarted, the JWKS rotated). The serving process's RSS, fds and connections
//! are sampled every 10 s into `target/soak/soak.csv` (or `$SOAK_OUT/`) and plotted
//! (`scripts/soak-plot.sh`); the run ends with one line of figures.
//!
//! It fails on a request failed other than the faults must cause, an answered request without
//! its access-log line, a fault that did not heal as documented, fds above the baseline after a
//! fault, and (for runs of 30 minutes or more) RSS grown over 5 % after the first 5 minutes.

mod faults;
mod procfs;
mod traffic;
mod verdict;

use std::fmt::Write as _;
use std::path::PathBuf;
use std::sync::Arc;
use std::thread;
use std::time::Duration;

use testkit::idp::{Idp, TestKey};
use testkit::postgres::Postgres;
use testkit::redis::RedisServer;
use testkit::{Gateway, HitLog, Service, Upstream};

use faults::{Fault, Findings, World};
use procfs::{Events, Sampler};
use traffic::{Clients, Traffic};

const SAMPLE_EVERY: Duration = Duration::from_secs(10);
/// Above the warm-up's fd count, what may be open at any moment without a leak: the requests
/// in flight (four clients, each with its upstream connection) and a key-store pool grown by a
/// couple of connections.
const FD_SLACK: usize = 10;
const RSS_GROWTH_LIMIT: f64 = 5.0;
/// Shorter runs report the RSS growth without asserting it: their processes are too young.
const RSS_ASSERTED_FROM: Duration = Duration::from_secs(30 * 60);
/// High enough never to refuse the soak's traffic: the limit is there to make every request
/// ask Redis.
const RATE_LIMIT: u64 = 1_000_000;
const HEALTH: &str = "balance = \"least_requests\"\n\
    health_check = { path = \"/health\", interval_seconds = 1, timeout_seconds = 1 }";

fn out_dir() -> PathBuf {
    std::env::var_os("SOAK_OUT").map_or_else(
        || PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("target/soak"),
        PathBuf::from,
    )
}

fn gateway(replicas: &[Upstream], pg: &Postgres, redis: &RedisServer, idp: &Idp) -> Gateway {
    let urls = |base: &str| replicas.iter().map(|r| r.url(base)).collect::<Vec<_>>();
    let extra = format!(
        "[auth.jwt]\nissuer = \"{}\"\naudience = \"portcullis\"\njwks_refresh_seconds = {}\n\
         [rate_limits]\nredis = \"{}\"\n\
         [access_log]\ndestination = \"{{dir}}/access.log\"\n",
        idp.issuer,
        faults::JWKS_REFRESH,
        redis.url()
    );
    Gateway::builder()
        .service(
            Service::replicas("infer", &urls(""))
                .rate_limit_per_minute(RATE_LIMIT)
                .lines(HEALTH),
        )
        .service(
            Service::replicas("oa", &urls("/oa"))
                .openai()
                .rate_limit_per_minute(RATE_LIMIT)
                .lines(HEALTH),
        )
        .key_store(&pg.url)
        .cache_ttl(faults::CACHE_TTL)
        .extra(&extra)
        .start()
}

#[test]
#[ignore = "long: `make soak` runs it for SOAK_MINUTES (60), `make test` for 3"]
fn only_what_faults_cause_fails_no_log_line_is_lost_and_fds_and_memory_stay_flat() {
    let minutes: f64 = std::env::var("SOAK_MINUTES")
        .map(|m| m.parse().expect("SOAK_MINUTES: a number of minutes"))
        .unwrap_or(60.0);
    assert!(
        minutes >= 2.0,
        "SOAK_MINUTES: at least 2, for every fault to fit"
    );
    let total = Duration::from_secs_f64(minutes * 60.0);
    // 0 watches one process for the whole run, which the upgrades otherwise replace.
    let upgrades: f64 = std::env::var("SOAK_UPGRADE_MINUTES")
        .map(|m| {
            m.parse()
                .expect("SOAK_UPGRADE_MINUTES: a number of minutes")
        })
        .unwrap_or(5.0);
    let upgrades = Duration::from_secs_f64(upgrades * 60.0);
    let out = out_dir();
    std::fs::create_dir_all(&out).unwrap();
    let (csv, png) = (out.join("soak.csv"), out.join("soak.png"));

    // The IdP answers on this runtime's worker threads; everything else here blocks.
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .unwrap();
    let first_key = Arc::new(TestKey::ec("soak-0"));
    let idp = rt.block_on(Idp::start(&[&first_key]));
    let pg = Postgres::start();
    assert!(
        pg.is_local(),
        "the soak stops and starts Postgres: unset PORTCULLIS_TEST_POSTGRES_URL"
    );
    let redis = RedisServer::start_own();
    let hits = HitLog::new();
    let replicas: Vec<Upstream> = ["A", "B", "C"]
        .iter()
        .map(|name| Upstream::local(name, &hits))
        .collect();
    let gw = gateway(&replicas, &pg, &redis, &idp);
    let (key, _) = gw.create_key("infer,oa", &[]);
    let clients = Arc::new(Clients::new(gw.port, key, idp.issuer.clone(), first_key));
    let events = Arc::new(Events::default());
    let mut world = World::new(
        gw,
        pg,
        redis,
        replicas,
        hits,
        idp,
        clients.clone(),
        events.clone(),
    );
    let sampler = Sampler::start(
        &csv,
        world.pid.clone(),
        clients.clone(),
        events,
        SAMPLE_EVERY,
    );
    let traffic = Traffic::start(&clients);
    eprintln!(
        "soak: {minutes} min on 127.0.0.1:{}, gateway dir {}, CSV {}",
        world.gw.port,
        world.gw.dir.path().display(),
        csv.display()
    );

    let mut findings = Findings::default();
    sleep_until(&clients, faults::WARMUP);
    let baseline = procfs::steady_fds(world.pid(), world.gw.port).expect("the gateway is gone");
    for (at, fault) in faults::plan(total, upgrades) {
        sleep_until(&clients, at);
        eprintln!(
            "soak: {:>6.1} s  {} ({} requests so far)",
            clients.now().as_secs_f64(),
            fault.name(),
            clients.sent()
        );
        world.run(fault, &mut findings);
    }
    sleep_until(&clients, total);
    traffic.finish();
    let rows = sampler.finish();
    world.terminate(&mut findings);

    let outcomes = std::mem::take(&mut *clients.outcomes.lock().unwrap());
    let failures = verdict::failures(&outcomes, &findings.excuses);
    let (lost, mismatched, _) = verdict::access_log(world.gw.dir.path(), &outcomes);
    let rss = verdict::rss_growth(&rows, total);
    let high_fds: Vec<String> = findings
        .fds_after
        .iter()
        .filter(|(_, n)| *n > baseline + FD_SLACK)
        .map(|(f, n)| format!("{} {n}", f.name()))
        .collect();

    let line = figures(
        minutes,
        &outcomes,
        &failures,
        lost.len(),
        rss,
        &rows,
        baseline,
        &findings,
        clients
            .keepalive_retries
            .load(std::sync::atomic::Ordering::Relaxed),
    );
    println!("{line}");
    std::fs::write(out.join("summary.txt"), format!("{line}\n")).unwrap();
    let plot =
        std::process::Command::new(concat!(env!("CARGO_MANIFEST_DIR"), "/scripts/soak-plot.sh"))
            .arg(&csv)
            .arg(&png)
            .arg(&line)
            .status();
    if !plot.as_ref().is_ok_and(|s| s.success()) {
        findings
            .problems
            .push(format!("scripts/soak-plot.sh failed: {plot:?}"));
    }

    let report: Vec<String> = failures
        .unexpected
        .iter()
        .take(20)
        .map(|o| {
            format!(
                "{} {:?} at {:.1}-{:.1} s: {}",
                traffic::request_id(o.id),
                o.kind,
                o.start.as_secs_f64(),
                o.end.as_secs_f64(),
                o.problem.as_deref().unwrap_or_default()
            )
        })
        .collect();
    let tail = {
        let log = world.log();
        log[log.len().saturating_sub(3000)..].to_string()
    };
    assert!(
        failures.unexpected.is_empty(),
        "{} requests failed that no fault excuses (first 20):\n{}\nserving process's log tail:\n{tail}",
        failures.unexpected.len(),
        report.join("\n")
    );
    assert!(
        lost.is_empty(),
        "{} answered requests have no access-log line: {:?}",
        lost.len(),
        &lost[..lost.len().min(20)]
    );
    assert!(
        mismatched.is_empty(),
        "access-log lines with another status: {mismatched:?}"
    );
    assert!(findings.problems.is_empty(), "{:#?}", findings.problems);
    assert!(
        high_fds.is_empty(),
        "fds above the baseline {baseline} + {FD_SLACK} after: {high_fds:?}"
    );
    if total >= RSS_ASSERTED_FROM {
        let (_, _, growth) = rss.expect("no RSS samples");
        assert!(
            growth <= RSS_GROWTH_LIMIT,
            "RSS grew {growth:.1} % after the first 5 minutes"
        );
    }
}

fn sleep_until(clients: &Clients, at: Duration) {
    let now = clients.now();
    if at > now {
        thread::sleep(at - now);
    }
}

/// The run in one line.
#[allow(clippy::too_many_arguments)]
fn figures(
    minutes: f64,
    outcomes: &[traffic::Outcome],
    failures: &verdict::Failures,
    lost: usize,
    rss: Option<(u64, u64, f64)>,
    rows: &[procfs::Row],
    baseline: usize,
    f: &Findings,
    keepalive_retries: u64,
) -> String {
    let cut: usize = f
        .excuses
        .iter()
        .map(|e| match e {
            faults::Excuse::ReplicaKill { cut, .. } => *cut,
            faults::Excuse::StoreOutage { .. } => 0,
        })
        .sum();
    let mut line = format!(
        "soak {minutes} min: {} requests, {} failed unexpectedly, {} as the faults allow ({} of \
         the {cut} in flight on killed replicas, {} API-key 401s during key-store outages), \
         {lost} access-log lines lost, {keepalive_retries} keep-alive resends; ",
        outcomes.len(),
        failures.unexpected.len(),
        failures.replica_kills + failures.store_outages,
        failures.replica_kills,
        failures.store_outages,
    );
    match rss {
        Some((base, end, growth)) => {
            let warm = verdict::warm(Duration::from_secs_f64(minutes * 60.0)).as_secs() / 60;
            let _ = write!(
                line,
                "RSS {:.1} -> {:.1} MiB ({growth:+.1} % after the first {warm} min); ",
                base as f64 / 1024.0,
                end as f64 / 1024.0
            );
        }
        None => line.push_str("RSS: no sample; "),
    }
    if let Some((kb, pct)) = verdict::rss_growth_per_process(rows) {
        let _ = write!(
            line,
            "one process's RSS grew at most {:+.1} MiB ({pct:+.1} %) after its first minute; ",
            kb as f64 / 1024.0
        );
    }
    let _ = write!(line, "fds baseline {baseline}, after");
    for fault in faults::ALL {
        let after: Vec<usize> = f
            .fds_after
            .iter()
            .filter(|(k, _)| *k == fault)
            .map(|(_, n)| *n)
            .collect();
        if let Some(max) = after.iter().max() {
            let _ = write!(line, " {} x{} max {max},", fault.name(), after.len());
        }
    }
    line.pop();
    // Only what happened: a run without upgrades has no drain to report.
    for (what, took) in [
        ("revoked keys refused", &f.revocations),
        ("withdrawn JWKS keys refused", &f.withdrawals),
        ("old processes drained", &f.drains),
    ] {
        match took.iter().max() {
            Some(max) if max.as_secs() == 0 => {
                let _ = write!(line, "; {what} within {} ms", max.as_millis());
            }
            Some(max) => {
                let _ = write!(line, "; {what} within {:.1} s", max.as_secs_f64());
            }
            None => {}
        }
    }
    line
}

#[test]
fn a_three_minute_soak_meets_every_fault_an_hour_upgrades_every_five_minutes_and_zero_never() {
    let five = Duration::from_secs(300);
    let short = faults::plan(Duration::from_secs(180), five);
    for fault in faults::ALL {
        assert!(
            short.iter().any(|(_, f)| *f == fault),
            "{fault:?} missing from {short:?}"
        );
    }
    assert!(short.iter().all(|(at, _)| *at >= faults::WARMUP));
    let hour = faults::plan(Duration::from_secs(3600), five);
    let upgrades: Vec<u64> = hour
        .iter()
        .filter(|(_, f)| *f == Fault::Upgrade)
        .map(|(at, _)| at.as_secs())
        .collect();
    assert_eq!(upgrades, (1..=11).map(|k| k * 300).collect::<Vec<_>>());
    let last = hour.last().unwrap().0;
    assert!(last + faults::TAIL <= Duration::from_secs(3600), "{last:?}");
    let no_upgrade = faults::plan(Duration::from_secs(1200), Duration::ZERO);
    assert!(!no_upgrade.iter().any(|(_, f)| *f == Fault::Upgrade));
    assert!(no_upgrade.len() >= 19, "{no_upgrade:?}");
}
