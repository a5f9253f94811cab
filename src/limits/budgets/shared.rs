//! Budget counters shared by a fleet through Redis: one Lua script per request checks every
//! limited counter of the caller's key, owner and team and reserves on all of them, or on none, so
//! however many gateways share the Redis, admitted reservations never add up past a limit.
//!
//! A counter is a plain integer under `portcullis:budget:<k|o|t>:<escaped id>:<kind>:<window
//! start>`, expiring an hour after its window ends. A counter that does not exist (a new
//! window, or a Redis that was flushed or lost its data) is never taken as zero: the script
//! answers which ones are missing, the gateway reads the ledger for them, and asks again with
//! those values as seeds (`SET` only where still missing, so concurrent seeds agree).

use std::time::Duration;

use redis::Script;

use super::window::{Kind, Windows};
use super::Who;
use crate::limits::{escape_id, SharedRedis};

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

    /// Adds `deltas` to the counters (a settled reservation).
    pub(crate) async fn adjust(&self, keys: &[&str], deltas: &[i64]) {
        let _: Option<i64> = self
            .backend
            .invoke(&self.adjust, keys, deltas, TIMEOUT)
            .await;
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
