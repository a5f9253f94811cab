//! Per-worker-thread copies of what a shared cache (moka's) holds for a caller: the API keys'
//! verifiers and the JWTs' principals.
//!
//! A hit in moka's cache writes shared memory (its read log, the entry's reference count, the
//! principal's), which every worker thread does on every request: on many cores those cache
//! lines move from core to core and the per-core rate falls as threads are added (issue 33).
//! So each thread keeps what it looked up lately in a map of its own, holding its own copy,
//! and only a miss there goes to moka.
//!
//! A copy never outlives what moka would serve: it carries the instant moka's entry expires
//! at the latest, and every invalidation bumps an epoch that all copies made before it fail
//! (one load of a line written only then).

use std::any::Any;
use std::cell::RefCell;
use std::collections::HashMap;
use std::marker::PhantomData;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Instant;

/// Entries one thread keeps, all caches together; past this its map is emptied (a flood of
/// distinct valid callers then costs moka lookups, as before, never memory).
const CAPACITY: usize = 4096;

/// Tells caches apart in a thread's map (tests run several in one process).
static NEXT_ID: AtomicU64 = AtomicU64::new(0);

struct Held {
    value: Box<dyn Any>,
    epoch: u64,
    until: Instant,
}

thread_local! {
    static COPIES: RefCell<HashMap<(u64, [u8; 32]), Held>> = RefCell::new(HashMap::new());
}

/// One cache's copies of values `V`, keyed by 32 bytes (a key id, a token's digest).
pub(crate) struct ThreadCopies<V> {
    id: u64,
    /// Bumped by every invalidation of the shared cache.
    epoch: Arc<AtomicU64>,
    _values: PhantomData<fn() -> V>,
}

impl<V> Clone for ThreadCopies<V> {
    fn clone(&self) -> Self {
        ThreadCopies {
            id: self.id,
            epoch: self.epoch.clone(),
            _values: PhantomData,
        }
    }
}

impl<V: Clone + 'static> ThreadCopies<V> {
    pub(crate) fn new() -> ThreadCopies<V> {
        ThreadCopies {
            id: NEXT_ID.fetch_add(1, Ordering::Relaxed),
            epoch: Arc::default(),
            _values: PhantomData,
        }
    }

    /// This thread's copy for `key`, if it has a valid one.
    pub(crate) fn get(&self, key: &[u8; 32]) -> Option<V> {
        let epoch = self.epoch.load(Ordering::Acquire);
        COPIES.with(|copies| {
            let mut copies = copies.borrow_mut();
            let copy = copies.get(&(self.id, *key))?;
            if copy.epoch == epoch && Instant::now() < copy.until {
                return copy.value.downcast_ref::<V>().cloned();
            }
            copies.remove(&(self.id, *key));
            None
        })
    }

    /// The epoch to give `keep`: read before the shared cache is, so an invalidation after
    /// that read fails the copy made from what it returned.
    pub(crate) fn epoch(&self) -> u64 {
        self.epoch.load(Ordering::Acquire)
    }

    /// Keeps `value` as this thread's copy for `key` until `until` (no later than the shared
    /// entry it copies expires).
    pub(crate) fn keep(&self, key: [u8; 32], value: V, epoch: u64, until: Instant) {
        COPIES.with(|copies| {
            let mut copies = copies.borrow_mut();
            if copies.len() >= CAPACITY {
                copies.clear();
            }
            let value = Box::new(value);
            copies.insert(
                (self.id, key),
                Held {
                    value,
                    epoch,
                    until,
                },
            );
        });
    }

    /// Fails every copy made so far. Called on both sides of the shared cache's invalidation:
    /// a copy made between the first call and the invalidation fails by the second.
    pub(crate) fn invalidate(&self) {
        self.epoch.fetch_add(1, Ordering::AcqRel);
    }
}
