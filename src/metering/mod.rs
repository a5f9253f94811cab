//! Metering: usage you can bill from. The proxy hands every routed, forwarded request of an
//! authenticated caller to `Meter::record` (in memory, a short lock, no I/O); the ledger's
//! flusher (`flush.rs`) takes the totals every `[metering] flush_seconds` and adds them to the
//! key store's `usage_hourly` and `usage_daily` in one transaction. `query.rs` reads the
//! parameters of `GET /v1/usage` and `portcullis usage`.

mod flush;
pub(crate) mod query;

use std::collections::hash_map::RandomState;
use std::collections::HashMap;
use std::hash::{BuildHasher, BuildHasherDefault, Hasher};
use std::sync::Mutex;

pub(crate) use flush::{Ledger, LedgerService, FINAL_FLUSH};

use crate::observe::thread_shards::{self, Padded};
use crate::store::{UsageCounts, UsageRow};

/// The most (caller, model) pairs a thread remembers as kept in the current hour.
const KEPT_PER_THREAD: usize = 256;

/// (the meter and hour they are of, the (caller, model) hashes a thread saw kept): a model
/// once kept for a caller stays kept all hour, so the shared list is asked once per thread.
type KeptHere = ((usize, i64), Vec<(u64, u64)>);

thread_local! {
    static KEPT: std::cell::RefCell<KeptHere> = const { std::cell::RefCell::new(((0, 0), Vec::new())) };
}

/// What a request cost, as the price table has it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Cost {
    /// The gateway has no price table: nothing is costed, nothing counted unpriced.
    NoTable,
    /// No price applied to its model: counted unpriced, never costed 0.
    Unpriced,
    /// Its cost in micros of the table's currency.
    Micros(u64),
}

impl Cost {
    /// The micros a budget is charged (0 unpriced).
    pub(crate) fn micros(self) -> u64 {
        match self {
            Cost::Micros(n) => n,
            _ => 0,
        }
    }
}

/// One request's usage, as the proxy's record step knows it.
pub(crate) struct Charge<'a> {
    /// None for a JWT caller.
    pub key_id: Option<&'a str>,
    pub owner: Option<&'a str>,
    /// The owner's team when the request was made.
    pub team: Option<&'a str>,
    pub service: &'a str,
    /// The model after the policy; None when unknown.
    pub model: Option<&'a str>,
    pub prompt_tokens: u64,
    pub completion_tokens: u64,
    pub reasoning_tokens: u64,
    pub cached_tokens: u64,
    /// The usage was estimated (an abandoned stream).
    pub estimated: bool,
    pub cost: Cost,
}

/// Locks the record step spreads over: each worker thread records into its own shard (rows are
/// merged when taken), so threads charging the same row never share a lock or its cache line.
const SHARDS: usize = thread_shards::SHARDS;

/// The model recorded for a caller's requests beyond its `max_models_per_key_hour`.
pub(crate) const OTHER_MODELS: &str = "(other)";

/// Totals per (UTC hour, key, owner, service, model, team) since the last flush.
pub(crate) struct Meter {
    /// False without a ledger (no `[auth.api_keys]`): recording is then a no-op.
    enabled: bool,
    shards: [Padded<Mutex<Shard>>; SHARDS],
    hasher: RandomState,
    /// `[metering] max_models_per_key_hour`: a caller naming more models than this in one
    /// hour (the model is whatever it sends) gets one row for the rest, not a row each.
    max_models: usize,
    /// Per caller (key, else JWT subject), the models given rows of their own this hour.
    models: [Mutex<ModelsKept>; SHARDS],
}

/// Caller (by the hash of its name) → (the hour, the models it has rows for in that hour).
type ModelsKept = HashMap<u64, (i64, Vec<Box<str>>), BuildHasherDefault<Prehashed>>;

/// Rows by the hash of their key: a request whose row exists finds it through borrowed
/// strings, with no allocation.
type Shard = HashMap<u64, Vec<Entry>, BuildHasherDefault<Prehashed>>;

struct Entry {
    hour: i64,
    key_id: Box<str>,
    owner: Box<str>,
    service: Box<str>,
    model: Box<str>,
    /// The owner's team when the requests were made (`""`: none).
    team: Box<str>,
    counts: UsageCounts,
}

impl Entry {
    fn is(&self, hour: i64, parts: [&str; 5]) -> bool {
        self.hour == hour
            && *self.key_id == *parts[0]
            && *self.owner == *parts[1]
            && *self.service == *parts[2]
            && *self.model == *parts[3]
            && *self.team == *parts[4]
    }
}

/// For maps whose keys are hashes already (a shard's rows, a caller's name hashed once).
#[derive(Default)]
pub(crate) struct Prehashed(u64);

impl Hasher for Prehashed {
    fn finish(&self) -> u64 {
        self.0
    }
    fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.0 = self.0.rotate_left(8) ^ u64::from(b);
        }
    }
    fn write_u64(&mut self, n: u64) {
        self.0 = n;
    }
}

impl Meter {
    pub(crate) fn new() -> Meter {
        Meter::keeping_models(32)
    }

    /// A meter keeping at most `max_models` models per caller and hour.
    pub(crate) fn keeping_models(max_models: usize) -> Meter {
        Meter {
            enabled: true,
            shards: Default::default(),
            hasher: RandomState::new(),
            max_models,
            models: Default::default(),
        }
    }

    /// A meter that records nothing: the gateway has no key store, so no ledger.
    pub(crate) fn disabled() -> Meter {
        Meter {
            enabled: false,
            ..Meter::new()
        }
    }

    /// Adds one request to its row of the current UTC hour. No I/O, no await: a short lock.
    pub(crate) fn record(&self, charge: &Charge<'_>) {
        if self.enabled {
            self.record_at(charge, crate::time::unix_now());
        }
    }

    fn record_at(&self, c: &Charge<'_>, now: i64) {
        let counts = UsageCounts {
            requests: 1,
            prompt_tokens: c.prompt_tokens,
            completion_tokens: c.completion_tokens,
            reasoning_tokens: c.reasoning_tokens,
            cached_tokens: c.cached_tokens,
            estimated_requests: u64::from(c.estimated),
            cost_micros: c.cost.micros(),
            priced_requests: u64::from(matches!(c.cost, Cost::Micros(_))),
            unpriced_requests: u64::from(c.cost == Cost::Unpriced),
        };
        let hour = now - now.rem_euclid(3600);
        let model = self.model_kept(hour, c, c.model.unwrap_or(""));
        let parts = [
            c.key_id.unwrap_or(""),
            c.owner.unwrap_or(""),
            c.service,
            model,
            c.team.unwrap_or(""),
        ];
        self.add(hour, parts, counts);
    }

    /// `model`, or `(other)` once the caller has had `max_models` others this hour.
    fn model_kept<'m>(&self, hour: i64, c: &Charge<'_>, model: &'m str) -> &'m str {
        if model.is_empty() {
            return model;
        }
        let caller = self.hasher.hash_one(c.key_id.or(c.owner).unwrap_or(""));
        let model_hash = self.hasher.hash_one(model);
        let this = (self as *const Meter as usize, hour);
        // Kept by this thread already this hour: kept for good, no shared lock needed.
        let known = KEPT.with_borrow(|k| k.0 == this && k.1.contains(&(caller, model_hash)));
        if known {
            return model;
        }
        let mut callers = self.models[caller as usize % SHARDS]
            .lock()
            .unwrap_or_else(|e| e.into_inner());
        let kept = callers.entry(caller).or_insert((hour, Vec::new()));
        if kept.0 != hour {
            *kept = (hour, Vec::new());
        }
        let is_kept = kept.1.iter().any(|m| **m == *model) || {
            let room = kept.1.len() < self.max_models;
            if room {
                kept.1.push(model.into());
            }
            room
        };
        drop(callers);
        if !is_kept {
            return OTHER_MODELS;
        }
        KEPT.with_borrow_mut(|k| {
            if k.0 != this || k.1.len() >= KEPT_PER_THREAD {
                *k = (this, Vec::new());
            }
            k.1.push((caller, model_hash));
        });
        model
    }

    /// Forgets the models of hours before `hour` (called by the flusher, so callers gone
    /// quiet do not keep their lists).
    pub(crate) fn forget_models_before(&self, hour: i64) {
        for shard in &self.models {
            let mut callers = shard.lock().unwrap_or_else(|e| e.into_inner());
            callers.retain(|_, (h, _)| *h >= hour);
        }
    }

    fn add(&self, hour: i64, parts: [&str; 5], counts: UsageCounts) {
        let hash = self.hasher.hash_one((hour, parts));
        let shard = &self.shards[thread_shards::shard()];
        let mut rows = shard.lock().unwrap_or_else(|e| e.into_inner());
        let bucket = rows.entry(hash).or_default();
        match bucket.iter_mut().find(|e| e.is(hour, parts)) {
            Some(entry) => entry.counts += counts,
            None => bucket.push(Entry {
                hour,
                key_id: parts[0].into(),
                owner: parts[1].into(),
                service: parts[2].into(),
                model: parts[3].into(),
                team: parts[4].into(),
                counts,
            }),
        }
    }

    /// Everything recorded since the last take, leaving the meter empty: one row per (hour,
    /// key, owner, service, model, team), the shards' rows of it added up.
    pub(crate) fn take(&self) -> Vec<UsageRow> {
        let mut merged: HashMap<(i64, [Box<str>; 5]), UsageCounts> = HashMap::new();
        for shard in &self.shards {
            let rows = std::mem::take(&mut *shard.lock().unwrap_or_else(|e| e.into_inner()));
            for e in rows.into_values().flatten() {
                let key = (e.hour, [e.key_id, e.owner, e.service, e.model, e.team]);
                *merged.entry(key).or_default() += e.counts;
            }
        }
        let mut out = Vec::with_capacity(merged.len());
        for ((hour, [key_id, owner, service, model, team]), counts) in merged {
            out.push(UsageRow {
                hour,
                key_id: key_id.into(),
                owner: owner.into(),
                service: service.into(),
                model: model.into(),
                team: team.into(),
                counts,
            });
        }
        out
    }

    /// Whether nothing was recorded since the last take.
    #[cfg(test)]
    pub(crate) fn is_empty(&self) -> bool {
        (self.shards.iter()).all(|s| s.lock().unwrap_or_else(|e| e.into_inner()).is_empty())
    }
}

impl Default for Meter {
    fn default() -> Meter {
        Meter::new()
    }
}

#[cfg(test)]
mod tests;
