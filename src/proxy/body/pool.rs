//! The memory bound of every body the gateway holds whole at once (`buffered_bodies_max_bytes`):
//! one atomic count of reserved bytes shared by all requests, and per caller (owner, else key:
//! `buffered_bytes_per_caller`) so that one caller's uploads cannot take everyone's room. A
//! request reserves as its bytes arrive, before it allocates, and gives its bytes back when
//! its `Claim` drops, so an upload that aborts, times out or is refused returns its
//! share at once, whatever path it ends by.

use std::collections::hash_map::RandomState;
use std::collections::HashMap;
use std::hash::{BuildHasher, BuildHasherDefault};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use crate::auth::Principal;
use crate::metering::Prehashed;

/// Locks the per-caller counts spread over.
const SHARDS: usize = 16;

pub(crate) struct MemoryPool {
    limit: u64,
    used: AtomicU64,
    per_caller: u64,
    /// Bytes held per caller, by the hash of its name; a caller holding nothing has no entry.
    callers: [Mutex<HashMap<u64, u64, BuildHasherDefault<Prehashed>>>; SHARDS],
    hasher: RandomState,
}

impl MemoryPool {
    #[cfg(test)]
    pub(crate) fn new(limit: u64) -> Arc<MemoryPool> {
        MemoryPool::with_caller_limit(limit, limit)
    }

    /// All bodies within `limit`, one caller's within `per_caller`.
    pub(crate) fn with_caller_limit(limit: u64, per_caller: u64) -> Arc<MemoryPool> {
        Arc::new(MemoryPool {
            limit,
            used: AtomicU64::new(0),
            per_caller,
            callers: Default::default(),
            hasher: RandomState::new(),
        })
    }

    /// `bytes` of the pool for `caller`, or None when they would take the total or the
    /// caller's share past its limit.
    pub(crate) fn reserve(
        self: &Arc<MemoryPool>,
        caller: Option<&Arc<Principal>>,
        bytes: u64,
    ) -> Option<Claim> {
        let caller = caller.map(|p| self.hasher.hash_one(p.owner.as_deref().unwrap_or(&p.id)));
        self.take(caller, bytes).then(|| Claim {
            pool: Arc::clone(self),
            caller,
            bytes,
        })
    }

    /// Bytes reserved now.
    #[cfg(test)]
    pub(crate) fn used(&self) -> u64 {
        self.used.load(Ordering::Relaxed)
    }

    fn take(&self, caller: Option<u64>, bytes: u64) -> bool {
        if let Some(caller) = caller {
            let mut held = self.callers[caller as usize % SHARDS]
                .lock()
                .unwrap_or_else(|e| e.into_inner());
            let mine = held.entry(caller).or_insert(0);
            match mine.checked_add(bytes).filter(|&n| n <= self.per_caller) {
                Some(n) => *mine = n,
                None => {
                    if *mine == 0 {
                        held.remove(&caller);
                    }
                    return false;
                }
            }
        }
        // A plain counter: nothing else is published through it, so Relaxed is enough.
        let taken = self
            .used
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |used| {
                used.checked_add(bytes).filter(|&total| total <= self.limit)
            })
            .is_ok();
        if !taken {
            self.give_back_caller(caller, bytes);
        }
        taken
    }

    fn give(&self, caller: Option<u64>, bytes: u64) {
        self.used.fetch_sub(bytes, Ordering::Relaxed);
        self.give_back_caller(caller, bytes);
    }

    fn give_back_caller(&self, caller: Option<u64>, bytes: u64) {
        let Some(caller) = caller else { return };
        let mut held = self.callers[caller as usize % SHARDS]
            .lock()
            .unwrap_or_else(|e| e.into_inner());
        if let Some(mine) = held.get_mut(&caller) {
            *mine = mine.saturating_sub(bytes);
            if *mine == 0 {
                held.remove(&caller);
            }
        }
    }
}

/// Bytes held from the pool until dropped.
pub(crate) struct Claim {
    pool: Arc<MemoryPool>,
    caller: Option<u64>,
    bytes: u64,
}

impl Claim {
    #[cfg(test)]
    pub(crate) fn bytes(&self) -> u64 {
        self.bytes
    }

    /// Reserves `more` bytes besides; false, and nothing taken, when the pool is spent.
    pub(crate) fn grow(&mut self, more: u64) -> bool {
        let taken = self.pool.take(self.caller, more);
        if taken {
            self.bytes += more;
        }
        taken
    }

    /// Gives back what is held beyond `bytes`.
    pub(crate) fn shrink_to(&mut self, bytes: u64) {
        if bytes < self.bytes {
            self.pool.give(self.caller, self.bytes - bytes);
            self.bytes = bytes;
        }
    }
}

impl Drop for Claim {
    fn drop(&mut self) {
        self.shrink_to(0);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reservations_stay_within_the_limit_and_are_given_back_when_dropped() {
        let pool = MemoryPool::new(100);
        let mut a = pool.reserve(None, 60).unwrap();
        assert!(pool.reserve(None, 41).is_none());
        let b = pool.reserve(None, 40).unwrap();
        assert_eq!(pool.used(), 100);
        assert!(!a.grow(1));
        assert_eq!(a.bytes(), 60);
        drop(b);
        assert!(a.grow(40));
        assert_eq!(pool.used(), 100);
        a.shrink_to(10);
        assert_eq!(pool.used(), 10);
        a.shrink_to(50);
        assert_eq!(a.bytes(), 10, "shrink_to never grows");
        drop(a);
        assert_eq!(pool.used(), 0);
        // A request as large as the whole pool still fits alone; an overflow never wraps.
        let all = pool.reserve(None, 100).unwrap();
        assert!(pool.reserve(None, u64::MAX).is_none());
        drop(all);
        assert_eq!(pool.used(), 0);
    }

    #[test]
    fn concurrent_reservations_never_pass_the_limit() {
        let pool = MemoryPool::new(1000);
        let peak = AtomicU64::new(0);
        std::thread::scope(|s| {
            for _ in 0..4 {
                s.spawn(|| {
                    for _ in 0..10_000 {
                        if let Some(r) = pool.reserve(None, 300) {
                            peak.fetch_max(pool.used(), Ordering::Relaxed);
                            drop(r);
                        }
                    }
                });
            }
        });
        assert!(peak.load(Ordering::Relaxed) <= 1000);
        assert_eq!(pool.used(), 0);
    }

    #[test]
    fn one_caller_holds_at_most_its_share_and_others_still_fit() {
        let pool = MemoryPool::with_caller_limit(1000, 300);
        let caller = |id: &str| {
            Arc::new(Principal {
                kind: crate::auth::PrincipalKind::ApiKey,
                id: id.into(),
                scopes: Box::new([]),
                owner: None,
                budget: Default::default(),
            })
        };
        let (a, b) = (caller("a"), caller("b"));
        let mut held = pool.reserve(Some(&a), 200).unwrap();
        assert!(pool.reserve(Some(&a), 101).is_none(), "over a's share");
        assert!(!held.grow(101));
        assert!(held.grow(100));
        let other = pool.reserve(Some(&b), 300).unwrap();
        assert_eq!(pool.used(), 600);
        drop(held);
        assert!(pool.reserve(Some(&a), 300).is_some(), "a's share came back");
        drop(other);
        assert_eq!(pool.used(), 0);
        assert!(pool.callers.iter().all(|c| c.lock().unwrap().is_empty()));
    }
}
