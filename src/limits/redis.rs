//! Limits shared by a fleet through Redis: GCRA (the generic cell rate algorithm) in one Lua
//! script, run with EVALSHA, so each limited request costs one round trip and is counted
//! atomically however many gateways share the Redis.
//!
//! GCRA keeps one number per caller: its theoretical arrival time (TAT), when its next request
//! would be due had it always gone at exactly the limit. Each allowed request moves the TAT on
//! by `60 s / limit`; a request is refused (and not counted) while it would move the TAT more
//! than 60 s past now. So a caller idle for a minute may send `limit` requests at once, then
//! one every `60 s / limit`: in any span of `L` seconds at most `limit + ⌊L × limit / 60⌋`
//! requests pass, so `limit` at once at most, where a fixed window lets `2 × limit` through
//! around its edge. Redis's clock (`TIME`) is the only clock: gateways' clocks need not
//! agree. The key expires when the TAT passes, so idle callers cost nothing.
//!
//! Every worker thread keeps one multiplexed, self-reconnecting connection
//! (`ConnectionManager`) per process's Redis, made on its first use there; the thread's
//! requests share it without a lock, and its task runs on their own runtime. A call gets `TIMEOUT`; on an error or
//! a timeout the request is decided by the per-process limiter instead, Redis is marked down
//! (one warning) and asked again by at most one request per `RETRY_INTERVAL`; the first answer
//! ends the outage (one warning). Every request decided alone because of Redis is counted in
//! `portcullis_rate_limit_backend_errors_total{reason}`.

use std::fmt;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use ::redis::aio::{ConnectionManager, ConnectionManagerConfig};
use ::redis::{RedisResult, Script};
use prometheus::{IntCounter, IntCounterVec};

use super::rate::local::Limiter;
use crate::auth::Principal;
use crate::config::RedisServer;

/// The longest a request waits on Redis before it is decided per process.
pub(crate) const TIMEOUT: Duration = Duration::from_millis(50);
/// While Redis is down, at most one request per this interval asks it again.
pub(crate) const RETRY_INTERVAL: Duration = Duration::from_secs(1);
/// The period `rate_limit_per_minute` counts over, in the script's unit (microseconds).
const PERIOD_US: u64 = 60_000_000;

/// KEYS[1]: the caller's key. ARGV[1]: requests per period; ARGV[2]: the period in µs.
/// Returns `{1, 0}` for an allowed request (counted), `{0, µs until one would be allowed}` for
/// a refused one (not counted). Numbers are doubles in Lua: exact for integers below 2^53 µs.
pub(crate) const SCRIPT: &str = r#"
if redis.replicate_commands then redis.replicate_commands() end
local limit = tonumber(ARGV[1])
local period = tonumber(ARGV[2])
local clock = redis.call('TIME')
local now = tonumber(clock[1]) * 1000000 + tonumber(clock[2])
local tat = tonumber(redis.call('GET', KEYS[1])) or now
if tat < now then tat = now end
local next_tat = tat + period / limit
local wait = next_tat - period - now
if wait > 0 then
  return {0, math.ceil(wait)}
end
redis.call('SET', KEYS[1], string.format('%.0f', next_tat), 'PX', math.ceil((next_tat - now) / 1000))
return {1, 0}
"#;

/// One per process, shared by every service's rate limit and by the budgets: the connection
/// (and its health), and the rate limits' script.
pub(crate) struct SharedRedis {
    client: ::redis::Client,
    /// For logs: the URL without user name or password.
    shown: String,
    /// Which of a thread's `CONNECTIONS` is this backend's.
    id: u64,
    script: Script,
    health: Health,
    errors: ErrorCounters,
    recoveries: AtomicU64,
}

struct ErrorCounters {
    /// Redis answered with an error, or the connection failed.
    error: IntCounter,
    /// No answer within `TIMEOUT`.
    timeout: IntCounter,
    /// Not asked: Redis failed less than `RETRY_INTERVAL` ago.
    unavailable: IntCounter,
}

impl SharedRedis {
    /// No connection yet: it is made on first use, so a Redis that is down at start-up delays
    /// nothing. `errors` is `portcullis_rate_limit_backend_errors_total`.
    pub(crate) fn new(server: &RedisServer, errors: &IntCounterVec) -> SharedRedis {
        log::info!(
            "rate limits are shared through Redis at {} (GCRA; per process while it fails)",
            server.shown
        );
        SharedRedis {
            client: server.client.clone(),
            shown: server.shown.clone(),
            id: NEXT_ID.fetch_add(1, Ordering::Relaxed),
            script: Script::new(SCRIPT),
            health: Health::default(),
            recoveries: AtomicU64::new(0),
            // Present from the start at 0, so a rate() over them is defined before any failure.
            errors: ErrorCounters {
                error: errors.with_label_values(&["error"]),
                timeout: errors.with_label_values(&["timeout"]),
                unavailable: errors.with_label_values(&["unavailable"]),
            },
        }
    }

    /// The fleet's decision for one request under `key`; `None` when Redis failed, timed out
    /// or is known to be down: the caller then decides alone.
    pub(crate) async fn decide(&self, key: &str, limit: u32) -> Option<Result<(), u64>> {
        let (allowed, wait_us) = self
            .invoke::<(i64, i64)>(
                &self.script,
                &[key],
                &[limit as i64, PERIOD_US as i64],
                TIMEOUT,
            )
            .await?;
        Some(if allowed == 1 {
            Ok(())
        } else {
            Err(retry_after(wait_us))
        })
    }

    /// Runs `script` on `keys` and `args` within `timeout`; `None` when Redis failed, timed
    /// out or is known to be down (counted, warned once per outage).
    pub(crate) async fn invoke<T: ::redis::FromRedisValue>(
        &self,
        script: &Script,
        keys: &[&str],
        args: &[i64],
        timeout: Duration,
    ) -> Option<T> {
        let attempt = self.health.attempt();
        if attempt == Attempt::Skip {
            self.errors.unavailable.inc();
            return None;
        }
        let reply = match self.connection() {
            Ok(mut connection) => {
                let mut invocation = script.prepare_invoke();
                for key in keys {
                    invocation.key(*key);
                }
                for arg in args {
                    invocation.arg(*arg);
                }
                let call = async {
                    match invocation.invoke_async::<T>(&mut connection).await {
                        // A connection Redis dropped (a restart, an idle timeout) is made
                        // again by the manager: one more try on it before deciding alone.
                        Err(e) if e.is_connection_dropped() || e.is_io_error() => {
                            invocation.invoke_async::<T>(&mut connection).await
                        }
                        done => done,
                    }
                };
                tokio::time::timeout(timeout, call).await
            }
            Err(e) => Ok(Err(e)),
        };
        match reply {
            Ok(Ok(value)) => {
                if self.health.answered(attempt) {
                    self.recoveries.fetch_add(1, Ordering::Release);
                    log::warn!(
                        "Redis at {} answers again: limits and budgets are shared by the fleet again",
                        self.shown
                    );
                }
                Some(value)
            }
            Ok(Err(e)) => {
                self.failed(&self.errors.error, &e);
                None
            }
            Err(_) => {
                let why = format!("no answer within {} ms", timeout.as_millis());
                self.failed(&self.errors.timeout, &why);
                None
            }
        }
    }

    /// How many outages have ended since start-up: budgets re-seed the shared counters from
    /// the ledger after each.
    pub(crate) fn recoveries(&self) -> u64 {
        self.recoveries.load(Ordering::Acquire)
    }

    /// Whether Redis is known to be down now.
    pub(crate) fn is_down(&self) -> bool {
        self.health.down.load(Ordering::Acquire)
    }

    fn failed(&self, counter: &IntCounter, error: &dyn fmt::Display) {
        counter.inc();
        if self.health.failed() {
            log::warn!(
                "Redis at {} unavailable ({error}): each gateway counts rate limits and budgets \
                 on its own until it answers; asking again at most once a second",
                self.shown
            );
        }
    }

    /// This thread's connection, made (without connecting) on its first use here. One per
    /// thread, not per process: a connection's task runs on the runtime of the thread that
    /// first used it, and Pingora runs one single-threaded runtime per worker thread, so a
    /// shared connection would make every other worker's calls hop threads twice (about
    /// 20 µs of CPU per call in `make bench`). The first use on a thread spawns the loading of
    /// the script: requests wait on the connection only up to their timeout, and this keeps
    /// the attempt going meanwhile.
    fn connection(&self) -> RedisResult<ConnectionManager> {
        let found = CONNECTIONS.with_borrow(|all| {
            (all.iter())
                .find(|(id, _)| *id == self.id)
                .map(|(_, c)| c.clone())
        });
        if let Some(connection) = found {
            return Ok(connection);
        }
        let config = ConnectionManagerConfig::new()
            .set_connection_timeout(Some(Duration::from_secs(1)))
            .set_response_timeout(Some(Duration::from_secs(1)))
            .set_max_delay(Duration::from_secs(1));
        let made = ConnectionManager::new_lazy_with_config(self.client.clone(), config)?;
        CONNECTIONS.with_borrow_mut(|all| all.push((self.id, made.clone())));
        let mut warm = made.clone();
        tokio::spawn(async move {
            if let Err(e) = Script::new(SCRIPT).load_async(&mut warm).await {
                log::debug!("rate limits: loading the Redis script failed: {e}");
            }
        });
        Ok(made)
    }
}

thread_local! {
    /// Each thread's connections, by `SharedRedis::id` (one per process outside tests).
    static CONNECTIONS: std::cell::RefCell<Vec<(u64, ConnectionManager)>> =
        const { std::cell::RefCell::new(Vec::new()) };
}

/// Tells backends apart in `CONNECTIONS`.
static NEXT_ID: AtomicU64 = AtomicU64::new(0);

/// One service's limit shared through Redis, with the per-process limiter as its fallback.
pub(crate) struct Shared {
    backend: Arc<SharedRedis>,
    service: Box<str>,
    limit: u32,
    local: Limiter,
}

impl Shared {
    pub(crate) fn new(backend: Arc<SharedRedis>, service: &str, limit: u32) -> Shared {
        Shared {
            backend,
            service: service.into(),
            limit,
            local: Limiter::per_minute(limit),
        }
    }

    pub(crate) async fn check(&self, principal: &Principal) -> Result<(), u64> {
        // Counted per process on every request, so that a fallback starts from this process's
        // recent traffic rather than from nothing.
        let local = self.local.check(principal);
        let (kind, id) = principal.rate_subject();
        let key = caller_key(&self.service, kind, id);
        self.backend.decide(&key, self.limit).await.unwrap_or(local)
    }
}

/// `portcullis:ratelimit:<service>:<kind>:<escaped id>`. Service names (`a-z0-9-_`) and kinds
/// hold no `:`, and the id is escaped, so two callers never share a key.
pub(crate) fn caller_key(service: &str, kind: &str, id: &str) -> String {
    let mut key = String::with_capacity(24 + service.len() + kind.len() + id.len());
    key.push_str("portcullis:ratelimit:");
    key.push_str(service);
    key.push(':');
    key.push_str(kind);
    key.push(':');
    escape_id(id, &mut key);
    key
}

/// A principal id (a key id, or a JWT `sub`, which may hold anything) as a key segment: bytes
/// other than `A-Za-z0-9-._~` become `%XX` (`%` included), so the mapping is one-to-one and
/// the segment holds no `:`, space, control character or `{…}` (a Redis Cluster hash tag).
pub(crate) fn escape_id(id: &str, out: &mut String) {
    const HEX: &[u8; 16] = b"0123456789ABCDEF";
    for &b in id.as_bytes() {
        if b.is_ascii_alphanumeric() || matches!(b, b'-' | b'.' | b'_' | b'~') {
            out.push(b as char);
        } else {
            out.push('%');
            out.push(HEX[(b >> 4) as usize] as char);
            out.push(HEX[(b & 15) as usize] as char);
        }
    }
}

/// Whole seconds until a request would be allowed, as Retry-After: at least 1, at most 60.
fn retry_after(wait_us: i64) -> u64 {
    (wait_us.max(0) as u64)
        .div_ceil(1_000_000)
        .clamp(1, PERIOD_US / 1_000_000)
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Attempt {
    /// Redis is up: ask it.
    Up,
    /// Redis is down and this request is the one that asks again.
    Probe,
    /// Redis is down: decide alone.
    Skip,
}

/// Whether Redis is down, so that a dead Redis costs one attempt a second instead of a wait
/// and a warning per request.
struct Health {
    down: AtomicBool,
    /// Milliseconds since `epoch` before which no new attempt is made while down.
    next_attempt_ms: AtomicU64,
    epoch: Instant,
}

impl Default for Health {
    fn default() -> Health {
        Health {
            down: AtomicBool::new(false),
            next_attempt_ms: AtomicU64::new(0),
            epoch: Instant::now(),
        }
    }
}

impl Health {
    fn attempt(&self) -> Attempt {
        if !self.down.load(Ordering::Acquire) {
            return Attempt::Up;
        }
        let now = self.now_ms();
        let at = self.next_attempt_ms.load(Ordering::Acquire);
        let claimed = now >= at
            && self
                .next_attempt_ms
                .compare_exchange(at, now + retry_ms(), Ordering::AcqRel, Ordering::Acquire)
                .is_ok();
        if claimed {
            Attempt::Probe
        } else {
            Attempt::Skip
        }
    }

    /// Whether this answer ends an outage. Only a probe can: an answer to a request sent
    /// before the failure says nothing about Redis now.
    fn answered(&self, attempt: Attempt) -> bool {
        attempt == Attempt::Probe && self.down.swap(false, Ordering::AcqRel)
    }

    /// Whether this failure starts an outage.
    fn failed(&self) -> bool {
        self.next_attempt_ms
            .store(self.now_ms() + retry_ms(), Ordering::Release);
        !self.down.swap(true, Ordering::AcqRel)
    }

    fn now_ms(&self) -> u64 {
        self.epoch.elapsed().as_millis() as u64
    }
}

fn retry_ms() -> u64 {
    RETRY_INTERVAL.as_millis() as u64
}
