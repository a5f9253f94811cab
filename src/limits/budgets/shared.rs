//! Budget counters shared by a fleet through Redis: one Lua script per request checks every
//! limited counter of the caller's key, owner and team and reserves on all of them, or on none, so
//! however many gateways share the Redis, admitted reservations never add up past a limit.
//!
//! A counter is a plain integer under `portcullis:budget:<k|o|t>:<escaped id>:<kind>:<window
//! start>`, expiring an hour after its window ends. A counter that does not exist (a new
//! window, or a Redis that was flushed or lost its data) is never taken as zero: the script
//! answers which ones are missing, the gateway reads the ledger for them, and asks again with
//! those values as seeds (`SET` only where still missing, so concurrent seeds agree).
//!
//! Settling is split by sign. A refund (the request used less than it reserved, or was never
//! forwarded) is added to a pending sum per counter in this worker thread's own batch and sent
//! by the flusher (`Budgets::start_flusher`), one ADJUST for every counter, every `PERIOD`: no
//! round trip on the request path. Until it goes the shared counter holds the reservation's
//! surplus, so it over-counts: a caller near its limit may be refused up to `PERIOD` early,
//! never admitted past it. A charge above the reservation (a prompt longer in tokens than its
//! estimate, a cost above the priced worst case) is sent at once and awaited, as before: held
//! back, it would let the fleet admit against a counter that is already short.
//!
//! A failed ADJUST (an error or a timeout) is dropped, as the request path's was: Redis may
//! have run it before the answer was lost, and a refund sent twice would let the counter
//! under-count, which is the one error a budget must not make; a dropped refund only
//! over-counts until the window ends. While Redis is known to be down, a batch is dropped
//! unsent (the counters are raised to the ledger's values when it is back).

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{mpsc, Mutex};
use std::time::Duration;

use redis::Script;

use super::window::{Kind, Windows};
use super::Who;
use crate::limits::{escape_id, SharedRedis};
use crate::observe::thread_shards::{self, Padded};

/// How often pending refunds are sent. Short enough that a refund reaches the fleet well
/// within the second a budget change takes (and that a caller near its limit is refused early
/// for at most this long); long enough that under load one script carries the refunds of
/// hundreds of requests (at 5,000 req/s, 250 per call instead of 250 calls).
pub(crate) const PERIOD: Duration = Duration::from_millis(50);
/// A thread's batch with this many counters wakes the flusher before its period is over, so
/// a batch (and its one script) stays small however many callers are settled.
const LARGE: usize = 256;
/// At most this many counters per ADJUST call.
const CHUNK: usize = 256;

/// KEYS: counters. ARGV, four per counter: limit, amount, time to live (s), seed (-1: none).
/// Returns `{-1, i…}`: counters missing without a seed; `{0, i, used}`: counter `i` refused
/// (nothing changed); `{1, used…}`: reserved, with each counter's new value.
const RESERVE: &str = r#"
local used = {}
local missing = {}
for i = 1, #KEYS do
  local v = redis.call('GET', KEYS[i])
  if v then
    used[i] = tonumber(v)
  else
    local seed = tonumber(ARGV[(i - 1) * 4 + 4])
    if seed < 0 then
      missing[#missing + 1] = i
    else
      used[i] = seed
    end
  end
end
if #missing > 0 then
  table.insert(missing, 1, -1)
  return missing
end
for i = 1, #KEYS do
  local limit = tonumber(ARGV[(i - 1) * 4 + 1])
  local amount = tonumber(ARGV[(i - 1) * 4 + 2])
  if limit >= 0 and (used[i] >= limit or used[i] + amount > limit) then
    return {0, i, used[i]}
  end
end
local out = {1}
for i = 1, #KEYS do
  local v = used[i] + tonumber(ARGV[(i - 1) * 4 + 2])
  redis.call('SET', KEYS[i], string.format('%.0f', v), 'EX', ARGV[(i - 1) * 4 + 3])
  out[#out + 1] = v
end
return out
"#;

/// KEYS: counters; ARGV: one delta per counter. Adds each delta to a counter that exists
/// (a missing one will be seeded from the ledger, which has the real usage), never below 0.
const ADJUST: &str = r#"
for i = 1, #KEYS do
  local d = tonumber(ARGV[i])
  if d ~= 0 and redis.call('EXISTS', KEYS[i]) == 1 then
    if redis.call('INCRBY', KEYS[i], d) < 0 then
      redis.call('SET', KEYS[i], 0, 'KEEPTTL')
    end
  end
end
return 0
"#;

/// KEYS: counters; ARGV, two per counter: a floor (the ledger's value), time to live (s).
/// Raises each counter to its floor: after an outage, usage counted per process reaches the
/// shared counters through the ledger.
const RAISE: &str = r#"
for i = 1, #KEYS do
  local floor = tonumber(ARGV[(i - 1) * 2 + 1])
  local v = tonumber(redis.call('GET', KEYS[i]) or '-1')
  if v < floor then
    redis.call('SET', KEYS[i], string.format('%.0f', floor), 'EX', ARGV[(i - 1) * 2 + 2])
  end
end
return 0
"#;

/// The longest a budget call waits on Redis before the process decides alone. Far longer
/// than a rate limit's 50 ms: a budget decided alone can let a fleet overshoot, so a slow
/// answer is worth waiting for; a Redis that refuses connections is known at once, and one
/// that is down is asked by one request a second.
const TIMEOUT: Duration = Duration::from_secs(1);

/// Counters outlive their window by this much, so a late refund still finds its counter.
const GRACE: i64 = 3600;

pub(crate) struct Shared {
    backend: std::sync::Arc<SharedRedis>,
    reserve: Script,
    adjust: Script,
    raise: Script,
    pending: Pending,
    /// Asks the flusher's thread for a flush now; the answer says whether it all went.
    pub(super) now: Mutex<Option<tokio::sync::mpsc::UnboundedSender<mpsc::Sender<bool>>>>,
}

/// One thread's refunds not yet sent: the sum per counter key.
type Batch = HashMap<String, i64>;

/// Refunds not yet sent, per counter key: one map per worker thread (`thread_shards`), each
/// behind a lock that only its thread and the flusher take.
struct Pending {
    shards: Box<[Padded<Mutex<Batch>>]>,
    /// Wakes the flusher when a thread's batch is large.
    large: tokio::sync::Notify,
    /// ADJUST calls the flusher made (tests).
    sent: AtomicU64,
}

impl Pending {
    fn new() -> Pending {
        Pending {
            shards: (0..thread_shards::SHARDS)
                .map(|_| Padded(Mutex::new(HashMap::new())))
                .collect(),
            large: tokio::sync::Notify::new(),
            sent: AtomicU64::new(0),
        }
    }

    fn add(&self, refunds: impl Iterator<Item = (String, i64)>) {
        let shard = &self.shards[thread_shards::shard()];
        let mut batch = shard.lock().unwrap_or_else(|e| e.into_inner());
        let before = batch.len();
        for (key, delta) in refunds {
            *batch.entry(key).or_insert(0) += delta;
        }
        let woken = before < LARGE && batch.len() >= LARGE;
        drop(batch);
        if woken {
            self.large.notify_one();
        }
    }

    /// Every thread's batch, summed per counter, zero sums left out.
    fn take(&self) -> HashMap<String, i64> {
        let mut all: HashMap<String, i64> = HashMap::new();
        for shard in self.shards.iter() {
            let mut batch = shard.lock().unwrap_or_else(|e| e.into_inner());
            if batch.is_empty() {
                continue;
            }
            let taken = std::mem::take(&mut *batch);
            drop(batch);
            if all.is_empty() {
                all = taken;
            } else {
                for (key, delta) in taken {
                    *all.entry(key).or_insert(0) += delta;
                }
            }
        }
        all.retain(|_, d| *d != 0);
        all
    }
}

/// One shared counter of a request.
pub(crate) struct Counter {
    pub key: String,
    pub subject: usize,
    pub kind: Kind,
    pub limit: Option<u64>,
}

/// The shared counters' answer to a reservation.
pub(crate) enum Reply {
    /// Reserved; each counter's new value.
    Reserved(Vec<u64>),
    /// Counter `i` has no room; its value.
    Refused(usize, u64),
    /// These counters do not exist: seed them.
    Missing(Vec<usize>),
}

impl Shared {
    pub(crate) fn new(backend: std::sync::Arc<SharedRedis>) -> Shared {
        Shared {
            backend,
            reserve: Script::new(RESERVE),
            adjust: Script::new(ADJUST),
            raise: Script::new(RAISE),
            pending: Pending::new(),
            now: Mutex::new(None),
        }
    }

    pub(crate) fn backend(&self) -> &SharedRedis {
        &self.backend
    }

    /// Reserves `amount(kind)` on every counter; `seeds[i]`, when known, is counter `i`'s
    /// value should it be missing. `None`: Redis did not answer.
    pub(crate) async fn reserve(
        &self,
        counters: &[Counter],
        amounts: &[u64],
        seeds: &[Option<u64>],
        windows: &Windows,
    ) -> Option<Reply> {
        let keys: Vec<&str> = counters.iter().map(|c| c.key.as_str()).collect();
        let mut args = Vec::with_capacity(counters.len() * 4);
        for (i, c) in counters.iter().enumerate() {
            args.push(c.limit.map_or(-1, clamp));
            args.push(clamp(amounts[i]));
            args.push(expiry(c.kind, windows));
            args.push(seeds[i].map_or(-1, clamp));
        }
        let reply: Vec<i64> = self
            .backend
            .invoke(&self.reserve, &keys, &args, TIMEOUT)
            .await?;
        Some(match reply.first() {
            Some(1) => Reply::Reserved(reply[1..].iter().map(|&v| v.max(0) as u64).collect()),
            Some(0) if reply.len() == 3 => {
                Reply::Refused((reply[1] - 1).max(0) as usize, reply[2].max(0) as u64)
            }
            _ => Reply::Missing(
                reply[1..]
                    .iter()
                    .map(|&i| (i - 1).max(0) as usize)
                    .collect(),
            ),
        })
    }

    /// Connects and loads the scripts, off any request's clock; whether Redis answered.
    pub(crate) async fn warm(&self) -> bool {
        let loaded: Option<i64> = self.backend.invoke(&self.adjust, &[], &[], TIMEOUT).await;
        let _: Option<i64> = self.backend.invoke(&self.raise, &[], &[], TIMEOUT).await;
        let reserve: Option<Vec<i64>> = self.backend.invoke(&self.reserve, &[], &[], TIMEOUT).await;
        loaded.is_some() && reserve.is_some()
    }

    /// Adds `deltas` to the counters now; whether Redis answered.
    pub(crate) async fn adjust(&self, keys: &[&str], deltas: &[i64]) -> bool {
        let done: Option<i64> = self
            .backend
            .invoke(&self.adjust, keys, deltas, TIMEOUT)
            .await;
        done.is_some()
    }

    /// Adds refunds to this thread's batch, for the flusher to send.
    pub(crate) fn refund(&self, refunds: impl Iterator<Item = (String, i64)>) {
        self.pending.add(refunds);
    }

    /// Sends every pending refund, summed per counter, in as few ADJUST calls as `CHUNK`
    /// allows. False when some were dropped (Redis failed or is down; see the module).
    pub(crate) async fn flush(&self) -> bool {
        let batch = self.pending.take();
        if batch.is_empty() {
            return true;
        }
        if self.backend.is_down() {
            return false;
        }
        let (keys, deltas): (Vec<&str>, Vec<i64>) =
            batch.iter().map(|(k, d)| (k.as_str(), *d)).unzip();
        let mut all = true;
        for (keys, deltas) in keys.chunks(CHUNK).zip(deltas.chunks(CHUNK)) {
            self.pending.sent.fetch_add(1, Ordering::Relaxed);
            all &= self.adjust(keys, deltas).await;
        }
        all
    }

    /// The ADJUST calls flushes have made so far.
    #[cfg(test)]
    pub(crate) fn flushes_sent(&self) -> u64 {
        self.pending.sent.load(Ordering::Relaxed)
    }

    /// Waits for the flusher to be woken by a large batch.
    pub(super) async fn large(&self) {
        self.pending.large.notified().await
    }

    /// Raises counters to the ledger's values.
    pub(crate) async fn raise(&self, keys: &[&str], floors: &[(u64, i64)]) -> bool {
        let args: Vec<i64> = floors.iter().flat_map(|&(f, e)| [clamp(f), e]).collect();
        let done: Option<i64> = self.backend.invoke(&self.raise, keys, &args, TIMEOUT).await;
        done.is_some()
    }
}

/// The key of `who`'s counter of `kind` in the window starting at `start`.
pub(crate) fn counter_key(who: Who<'_>, kind: Kind, start: i64) -> String {
    let (tag, id) = match who {
        Who::Key(id) => ("k", id),
        Who::Owner(id) => ("o", id),
        Who::Team(id) => ("t", id),
    };
    let mut key = String::with_capacity(40 + id.len());
    key.push_str("portcullis:budget:");
    key.push_str(tag);
    key.push(':');
    escape_id(id, &mut key);
    key.push(':');
    key.push_str(kind.tag());
    key.push(':');
    key.push_str(&start.to_string());
    key
}

/// How long a counter of `kind` lives: until an hour after its window ends. Relative, so a
/// gateway's clock (or a test's) need not agree with Redis's.
pub(crate) fn expiry(kind: Kind, windows: &Windows) -> i64 {
    windows.seconds_left(kind) as i64 + GRACE
}

fn clamp(n: u64) -> i64 {
    // Lua numbers are doubles: exact up to 2^53, far past any budget.
    n.min(1 << 53) as i64
}
