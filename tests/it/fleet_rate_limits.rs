//! Fleet rate limits: three gateway processes sharing one key store and one real Redis
//! (`testkit::redis`; no mocks) enforce `rate_limit_per_minute` together; with Redis
//! stopped each falls back to its own count, fast and without a 5xx; with Redis back, the
//! shared count returns without a restart.

use std::time::{Duration, Instant};

use testkit::redis::RedisServer;
use testkit::Upstream;
use testkit::{free_port, header, raw, Gateway, Service};

/// Per caller per minute on `infer`. GCRA lets `LIMIT` through at once, then one every
/// `60 s / LIMIT` (2 s).
const LIMIT: u32 = 30;

struct Fleet {
    gateways: Vec<Gateway>,
    /// The one SQLite key store the three share.
    _keys: tempfile::TempDir,
}

fn fleet(up: &Upstream, redis_url: &str) -> Fleet {
    let keys = tempfile::tempdir().unwrap();
    let database = format!("sqlite://{}/keys.db", keys.path().display());
    let rate_limits = format!("[rate_limits]\nredis = \"{redis_url}\"\n");
    let gateways = (0..3)
        .map(|_| {
            Gateway::builder()
                .key_store(&database)
                .service(Service::new("infer", up.url("")).rate_limit_per_minute(30))
                .extra(&rate_limits)
                .start()
        })
        .collect();
    Fleet {
        gateways,
        _keys: keys,
    }
}

impl Fleet {
    /// A new key, made through the CLI of the first gateway; valid on all three.
    fn key(&self) -> String {
        self.gateways[0].create_key("infer", &[]).0
    }

    /// `n` requests sent one after another, round-robin across the gateways.
    fn round_robin(&self, key: &str, n: usize) -> Tally {
        let mut tally = Tally::default();
        let start = Instant::now();
        for i in 0..n {
            let g = i % self.gateways.len();
            let request = format!(
                "GET /v1/infer/x HTTP/1.1\r\nHost: t\r\nAuthorization: Bearer {key}\r\n\
                 Connection: close\r\n\r\n"
            );
            let t = Instant::now();
            let (status, headers, _) = raw(self.gateways[g].port, request.as_bytes());
            tally.worst = tally.worst.max(t.elapsed());
            match status {
                200 => tally.allowed[g] += 1,
                429 => {
                    let retry: u64 = header(&headers, "retry-after")
                        .expect("a 429 without Retry-After")
                        .parse()
                        .unwrap();
                    assert!((1..=60).contains(&retry), "Retry-After {retry}");
                    tally.refused[g] += 1;
                }
                other => tally.other.push(other),
            }
        }
        tally.elapsed = start.elapsed();
        tally
    }

    /// `portcullis_rate_limit_backend_errors_total`, all reasons, per gateway.
    fn backend_errors(&self) -> Vec<f64> {
        self.gateways
            .iter()
            .map(|g| backend_errors(&g.metrics()))
            .collect()
    }
}

#[derive(Default, Debug)]
struct Tally {
    allowed: [u32; 3],
    refused: [u32; 3],
    /// Any other status: there must be none.
    other: Vec<u16>,
    worst: Duration,
    elapsed: Duration,
}

impl Tally {
    fn allowed(&self) -> u32 {
        self.allowed.iter().sum()
    }

    /// The most GCRA lets through over the tally's span: the burst, plus one per interval.
    fn shared_bound(&self) -> u32 {
        LIMIT + (self.elapsed.as_secs_f64() * LIMIT as f64 / 60.0).ceil() as u32
    }
}

fn backend_errors(metrics: &str) -> f64 {
    metrics
        .lines()
        .filter(|l| l.starts_with("portcullis_rate_limit_backend_errors_total{"))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}

const DOWN: &str = "Redis at";
fn warnings(gw: &Gateway, what: &str) -> usize {
    gw.log()
        .lines()
        .filter(|l| l.contains(DOWN) && l.contains(what))
        .count()
}

#[test]
fn three_gateways_share_one_limit() {
    let redis = RedisServer::start();
    let up = Upstream::start();
    let fleet = fleet(&up, redis.url());
    let key = fleet.key();
    let tally = fleet.round_robin(&key, 3 * LIMIT as usize);
    eprintln!(
        "shared: {} of {} allowed across 3 gateways in {:?} (limit {LIMIT}/min; per gateway {:?} \
         allowed, {:?} refused; slowest request {:?})",
        tally.allowed(),
        3 * LIMIT,
        tally.elapsed,
        tally.allowed,
        tally.refused,
        tally.worst
    );
    assert!(tally.other.is_empty(), "{:?}", tally.other);
    assert!(
        (LIMIT..=tally.shared_bound()).contains(&tally.allowed()),
        "{} allowed, expected {LIMIT}..={}",
        tally.allowed(),
        tally.shared_bound()
    );
    // Each gateway alone would have allowed all 30 it was sent: each refused some.
    assert!(tally.refused.iter().all(|&r| r > 0), "{tally:?}");
    assert_eq!(up.requests().len() as u32, tally.allowed());
    assert_eq!(fleet.backend_errors(), [0.0; 3]);
}

#[test]
fn a_redis_outage_falls_back_per_process_and_sharing_resumes() {
    let Some(mut redis) = RedisServer::start_own_or_skip() else {
        return;
    };
    let up = Upstream::start();
    let fleet = fleet(&up, redis.url());
    let (before, during, after) = (fleet.key(), fleet.key(), fleet.key());
    let shared = fleet.round_robin(&before, 3 * LIMIT as usize);
    assert!(shared.allowed() <= shared.shared_bound(), "{shared:?}");

    redis.stop();
    let outage = fleet.round_robin(&during, 3 * (LIMIT as usize + 10));
    let errors = fleet.backend_errors();
    eprintln!(
        "Redis down: {} of {} allowed, per gateway {:?} (limit {LIMIT}/min per process); \
         slowest request {:?}; backend errors per gateway {errors:?}",
        outage.allowed(),
        3 * (LIMIT + 10),
        outage.allowed,
        outage.worst
    );
    assert!(
        outage.other.is_empty(),
        "non-200/429 during the outage: {:?}",
        outage.other
    );
    // Per process, never unlimited: each gateway allows its own LIMIT (a fresh key, and the
    // gateways' one-minute windows began at their start, seconds ago).
    assert_eq!(outage.allowed, [LIMIT; 3], "{outage:?}");
    // The 50 ms Redis timeout at most, with room for a machine busy with other tests (the
    // budget storms run beside this one): a dead Redis never costs a request seconds.
    assert!(
        outage.worst < Duration::from_millis(250),
        "a request took {:?}",
        outage.worst
    );
    assert!(errors.iter().all(|&e| e > 0.0), "{errors:?}");
    for gw in &fleet.gateways {
        assert_eq!(
            warnings(gw, "unavailable"),
            1,
            "one warning, not one per request"
        );
    }

    redis.start_again();
    let restarted = Instant::now();
    // Traffic brings the gateways back: one request each may ask Redis again every second.
    let deadline = restarted + Duration::from_secs(15);
    while fleet
        .gateways
        .iter()
        .any(|gw| warnings(gw, "answers again") == 0)
    {
        assert!(
            Instant::now() < deadline,
            "the gateways never used Redis again"
        );
        for gw in &fleet.gateways {
            let request = format!(
                "GET /v1/infer/x HTTP/1.1\r\nHost: t\r\nAuthorization: Bearer {during}\r\n\
                 Connection: close\r\n\r\n"
            );
            let status = raw(gw.port, request.as_bytes()).0;
            assert!(status == 200 || status == 429, "{status}");
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    let errors_before = fleet.backend_errors();
    let resumed = fleet.round_robin(&after, 3 * LIMIT as usize);
    eprintln!(
        "Redis back: all gateways sharing again {:?} after the restart; then {} of {} allowed \
         across the fleet, per gateway {:?}",
        restarted.elapsed(),
        resumed.allowed(),
        3 * LIMIT,
        resumed.allowed
    );
    assert!(resumed.other.is_empty(), "{:?}", resumed.other);
    assert!(
        (LIMIT..=resumed.shared_bound()).contains(&resumed.allowed()),
        "{resumed:?}"
    );
    assert!(resumed.refused.iter().all(|&r| r > 0), "{resumed:?}");
    assert_eq!(
        fleet.backend_errors(),
        errors_before,
        "no fallback once back"
    );
    for gw in &fleet.gateways {
        assert_eq!(warnings(gw, "unavailable"), 1);
        assert_eq!(warnings(gw, "answers again"), 1);
    }
}

#[test]
fn a_gateway_starts_and_limits_per_process_while_redis_is_down() {
    let up = Upstream::start();
    // Nothing listens there.
    let redis = format!("redis://127.0.0.1:{}", free_port());
    let gw = Gateway::builder()
        .service(Service::new("infer", up.url("")).rate_limit_per_minute(3))
        .extra(&format!("[rate_limits]\nredis = \"{redis}\"\n"))
        .start();
    let (key, _) = gw.create_key("infer", &[]);
    let request = format!(
        "GET /v1/infer/x HTTP/1.1\r\nHost: t\r\nAuthorization: Bearer {key}\r\n\
         Connection: close\r\n\r\n"
    );
    let statuses: Vec<u16> = (0..5).map(|_| gw.raw(request.as_bytes()).0).collect();
    assert_eq!(statuses, [200, 200, 200, 429, 429]);
    assert!(backend_errors(&gw.metrics()) >= 5.0);
    assert_eq!(warnings(&gw, "unavailable"), 1, "{}", gw.log());
}
