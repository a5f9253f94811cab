//! The soak's faults, made with the test kit's own launchers, and what each may cost:
//!
//! | fault | what is done | requests it may fail |
//! |---|---|---|
//! | upgrade | `serve -u` started, SIGQUIT to the serving process, which must drain and exit 0 | none |
//! | revoke | a key made with the CLI, used (so cached), revoked with the CLI | none; the key must get 401 within `cache_ttl_seconds` |
//! | postgres | the key store stopped for a few seconds, then started again | API-key requests answered 401 from the stop until a key the gateway never saw works again (keys not cached); nothing else |
//! | replica | one replica killed (listener closed, every connection reset), restarted a few seconds later | at most the requests in flight on it when it died (`Upstream::kill` counts them); it must be healthy again within 10 s |
//! | redis | the rate-limit Redis killed for a few seconds, then started again | none (the gateway counts locally meanwhile); the fallback must stop once it is back |
//! | jwks | a new key published beside the old, tokens signed with it, the old one withdrawn | none; a token of the withdrawn key must get 401 within `jwks_refresh_seconds` |

use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;
use std::thread;
use std::time::{Duration, Instant};

use testkit::idp::{Idp, TestKey};
use testkit::postgres::Postgres;
use testkit::redis::RedisServer;
use testkit::{try_raw, Gateway, HitLog, Proc, Upstream};

use super::procfs::{self, Events};
use super::traffic::Clients;

/// `cache_ttl_seconds`: the documented bound on how long a revoked key keeps working.
pub const CACHE_TTL: u64 = 15;
/// `jwks_refresh_seconds`: how soon a withdrawn signing key is noticed.
pub const JWKS_REFRESH: u64 = 10;
/// How long Postgres, Redis and a replica stay down.
const OUTAGE: Duration = Duration::from_secs(5);
/// After a fault, before its file descriptors are counted.
const SETTLE: Duration = Duration::from_secs(3);
/// Pingora's fixed 5 s hand-over, `grace_period_seconds` (5) and the shutdown timeout (1), with
/// room to spare: the old process of an upgrade must be gone by then.
const DRAIN_BOUND: Duration = Duration::from_secs(20);
/// Before the first fault; also when the fd baseline is taken.
pub const WARMUP: Duration = Duration::from_secs(20);
/// Without faults at the end, so the last one's effects are over before the final checks.
pub const TAIL: Duration = Duration::from_secs(15);

#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Fault {
    Upgrade,
    Revoke,
    Postgres,
    Replica,
    Redis,
    Jwks,
}

pub const ALL: [Fault; 6] = [
    Fault::Upgrade,
    Fault::Revoke,
    Fault::Postgres,
    Fault::Replica,
    Fault::Redis,
    Fault::Jwks,
];

impl Fault {
    pub fn name(self) -> &'static str {
        match self {
            Fault::Upgrade => "upgrade",
            Fault::Revoke => "revoke",
            Fault::Postgres => "postgres",
            Fault::Replica => "replica",
            Fault::Redis => "redis",
            Fault::Jwks => "jwks",
        }
    }
}

/// When each fault happens in a run of `total`: an upgrade every `upgrades` (5 minutes by
/// default; every half run when that is shorter; never when zero), the other faults in turn
/// every minute after the warm-up (closer together in a short run, so that a 3-minute one still
/// has each of them once).
pub fn plan(total: Duration, upgrades: Duration) -> Vec<(Duration, Fault)> {
    let end = total.saturating_sub(TAIL);
    let mut events = Vec::new();
    let upgrade_every = upgrades.min(total / 2);
    let mut t = upgrade_every;
    while t <= end && !upgrade_every.is_zero() {
        events.push((t, Fault::Upgrade));
        t += upgrade_every;
    }
    let others = &ALL[1..];
    let every = Duration::from_secs(60).min(end.saturating_sub(WARMUP) / others.len() as u32);
    let mut t = WARMUP;
    let mut i = 0;
    while t < end && !every.is_zero() {
        events.push((t, others[i % others.len()]));
        i += 1;
        t += every;
    }
    events.sort();
    events
}

/// Requests a fault may fail.
#[derive(Debug)]
pub enum Excuse {
    /// Proxied requests in flight between `from` and `to` (the kill), at most `cut` of them.
    ReplicaKill {
        from: Duration,
        to: Duration,
        cut: usize,
    },
    /// API-key requests answered 401 between `from` and `to`.
    StoreOutage { from: Duration, to: Duration },
}

/// What the faults found, beyond the traffic's own outcomes.
#[derive(Default)]
pub struct Findings {
    pub excuses: Vec<Excuse>,
    /// A fault that did not go as it must (a drain too slow, a revoked key still working…).
    pub problems: Vec<String>,
    /// The steady fd count after each fault.
    pub fds_after: Vec<(Fault, usize)>,
    pub revocations: Vec<Duration>,
    pub withdrawals: Vec<Duration>,
    pub drains: Vec<Duration>,
}

/// Everything the faults act on.
pub struct World {
    pub gw: Gateway,
    /// The serving process once an upgrade has replaced the first one.
    pub current: Option<Proc>,
    pub generation: u32,
    /// The serving process's pid, which the sampler follows.
    pub pid: Arc<AtomicU32>,
    pub pg: Postgres,
    pub redis: RedisServer,
    pub replicas: Vec<Upstream>,
    pub hits: HitLog,
    pub idp: Arc<Idp>,
    pub clients: Arc<Clients>,
    pub events: Arc<Events>,
    /// How many of each kind have run, so each picks its own victim or key.
    runs: [u32; 6],
}

impl World {
    #[allow(clippy::too_many_arguments)]
    pub fn new(
        gw: Gateway,
        pg: Postgres,
        redis: RedisServer,
        replicas: Vec<Upstream>,
        hits: HitLog,
        idp: Arc<Idp>,
        clients: Arc<Clients>,
        events: Arc<Events>,
    ) -> World {
        World {
            pid: Arc::new(AtomicU32::new(gw.pid())),
            gw,
            current: None,
            generation: 0,
            pg,
            redis,
            replicas,
            hits,
            idp,
            clients,
            events,
            runs: [0; 6],
        }
    }

    pub fn pid(&self) -> u32 {
        self.pid.load(Ordering::Relaxed)
    }

    /// Runs one fault to its end, then counts the serving process's fds once it settled.
    pub fn run(&mut self, fault: Fault, f: &mut Findings) {
        let n = self.runs[fault as usize];
        self.runs[fault as usize] += 1;
        self.events.push(fault.name(), self.clients.now());
        match fault {
            Fault::Upgrade => self.upgrade(f),
            Fault::Revoke => self.revoke(f),
            Fault::Postgres => self.postgres(f),
            Fault::Replica => self.replica(f, n as usize),
            Fault::Redis => self.redis(f),
            Fault::Jwks => self.jwks(f, n),
        }
        thread::sleep(SETTLE);
        match procfs::steady_fds(self.pid(), self.gw.port) {
            Some(fds) => f.fds_after.push((fault, fds)),
            None => f
                .problems
                .push(format!("{}: the gateway is gone", fault.name())),
        }
        // The replicas' record of requests is not needed past a fault: keep the run bounded.
        self.hits.clear();
    }

    fn upgrade(&mut self, f: &mut Findings) {
        self.generation += 1;
        let log = format!("gen{}.log", self.generation);
        let new = self.gw.spawn_upgrade_logging_to(&self.gw.config, &log);
        let quit = Instant::now();
        let exit = match self.current.as_mut() {
            None => {
                self.gw.signal("QUIT");
                self.pid.store(new.pid(), Ordering::Relaxed);
                self.gw.wait_exit(DRAIN_BOUND)
            }
            Some(old) => {
                old.signal("QUIT");
                self.pid.store(new.pid(), Ordering::Relaxed);
                old.wait_exit(DRAIN_BOUND)
            }
        };
        match exit {
            Some(status) if status.success() => f.drains.push(quit.elapsed()),
            Some(status) => f
                .problems
                .push(format!("upgrade: the old process exited {status}")),
            None => f.problems.push(format!(
                "upgrade: the old process still ran {DRAIN_BOUND:?} after SIGQUIT"
            )),
        }
        self.current = Some(new);
    }

    fn revoke(&mut self, f: &mut Findings) {
        let (key, id) = self.gw.create_key("infer,oa", &[]);
        // Used first, so that the gateway holds it in its cache: the revoke must reach past it.
        for _ in 0..3 {
            let status = self.clients.probe("/v1/infer/work", &key);
            if status != 200 {
                f.problems.push(format!("revoke: a new key got {status}"));
                return;
            }
        }
        self.gw.revoke(&id);
        let revoked = Instant::now();
        let bound = Duration::from_secs(CACHE_TTL + 1);
        while self.clients.probe("/v1/infer/work", &key) != 401 {
            if revoked.elapsed() > bound {
                f.problems
                    .push(format!("revoke: the key still works {bound:?} later"));
                return;
            }
            thread::sleep(Duration::from_millis(20));
        }
        f.revocations.push(revoked.elapsed());
        self.clients.revoked.lock().unwrap().push(key);
    }

    fn postgres(&mut self, f: &mut Findings) {
        // A key the gateway has never seen: it can only work once the store answers again.
        let (fresh, _) = self.gw.create_key("infer,oa", &[]);
        let from = self.clients.now();
        self.pg.stop();
        thread::sleep(OUTAGE);
        self.pg.restart();
        let back = Instant::now();
        while self.clients.probe("/v1/infer/work", &fresh) != 200 {
            if back.elapsed() > Duration::from_secs(20) {
                f.problems
                    .push("postgres: a new key still fails 20 s after the restart".into());
                break;
            }
            thread::sleep(Duration::from_millis(200));
        }
        let to = self.clients.now();
        f.excuses.push(Excuse::StoreOutage { from, to });
    }

    fn replica(&mut self, f: &mut Findings, n: usize) {
        let victim = &self.replicas[n % self.replicas.len()];
        let from = self.clients.now();
        let cut = victim.kill();
        let to = self.clients.now();
        f.excuses.push(Excuse::ReplicaKill { from, to, cut });
        thread::sleep(OUTAGE);
        victim.restart();
        let replica = format!("replica=\"{}\"", victim.host_port());
        let restarted = Instant::now();
        loop {
            let text = self.metrics();
            let mut lines = text
                .lines()
                .filter(|l| l.starts_with("portcullis_upstream_healthy{") && l.contains(&replica))
                .peekable();
            if lines.peek().is_some() && lines.all(|l| l.ends_with(" 1")) {
                break;
            }
            if restarted.elapsed() > Duration::from_secs(10) {
                f.problems.push(format!(
                    "replica: {} not healthy 10 s after its restart",
                    victim.name
                ));
                break;
            }
            thread::sleep(Duration::from_millis(200));
        }
    }

    fn redis(&mut self, f: &mut Findings) {
        let before = self.backend_errors();
        self.redis.stop();
        thread::sleep(OUTAGE);
        let during = self.backend_errors();
        self.redis.start_again();
        if during <= before {
            f.problems
                .push("redis: nothing fell back while it was down: unused?".into());
        }
        // Back: the fallback count stops growing (one try a second ends the outage).
        let back = Instant::now();
        loop {
            let a = self.backend_errors();
            thread::sleep(Duration::from_secs(2));
            if self.backend_errors() == a {
                break;
            }
            if back.elapsed() > Duration::from_secs(15) {
                f.problems
                    .push("redis: still deciding alone 15 s after it came back".into());
                break;
            }
        }
    }

    fn jwks(&mut self, f: &mut Findings, n: u32) {
        let old = self.clients.signer.read().unwrap().clone();
        let new = Arc::new(TestKey::ec(&format!("soak-{}", n + 1)));
        // As an issuer rotates: the new key published beside the old, then used, then the old
        // one withdrawn.
        self.idp.set_keys(&[&old, &new]);
        *self.clients.signer.write().unwrap() = new.clone();
        let old_token = self.clients.mint(&old);
        thread::sleep(Duration::from_secs(2));
        let status = self.clients.probe("/v1/infer/work", &old_token);
        if status != 200 {
            f.problems.push(format!(
                "jwks: a token of a still-published key got {status}"
            ));
        }
        self.idp.set_keys(&[&new]);
        let withdrawn = Instant::now();
        let bound = Duration::from_secs(JWKS_REFRESH + 5);
        while self.clients.probe("/v1/infer/work", &old_token) != 401 {
            if withdrawn.elapsed() > bound {
                f.problems.push(format!(
                    "jwks: a token of a withdrawn key still works {bound:?} later"
                ));
                return;
            }
            thread::sleep(Duration::from_millis(250));
        }
        f.withdrawals.push(withdrawn.elapsed());
    }

    /// SIGTERM to the serving process at the end: it must drain and exit 0 (and so flush its
    /// access log).
    pub fn terminate(&mut self, f: &mut Findings) {
        let exit = match self.current.as_mut() {
            None => {
                self.gw.signal("TERM");
                self.gw.wait_exit(DRAIN_BOUND)
            }
            Some(p) => {
                p.signal("TERM");
                p.wait_exit(DRAIN_BOUND)
            }
        };
        if !exit.is_some_and(|s| s.success()) {
            f.problems.push(format!(
                "the last process did not stop cleanly on SIGTERM: {exit:?}"
            ));
        }
    }

    /// The serving process's log, for a failure's report.
    pub fn log(&self) -> String {
        match &self.current {
            None => self.gw.log(),
            Some(p) => p.log(),
        }
    }

    /// `/metrics` of whichever process serves (the listener moves with an upgrade).
    fn metrics(&self) -> String {
        let req = b"GET /metrics HTTP/1.1\r\nHost: m\r\nConnection: close\r\n\r\n";
        try_raw(self.gw.metrics_port, req)
            .map(|(_, _, body)| String::from_utf8_lossy(&body).into_owned())
            .unwrap_or_default()
    }

    fn backend_errors(&self) -> f64 {
        self.metrics()
            .lines()
            .filter(|l| l.starts_with("portcullis_rate_limit_backend_errors_total{"))
            .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
            .sum()
    }
}
