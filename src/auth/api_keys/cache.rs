//! The key cache: moka's, shared by the process, behind a small copy per worker thread.
//!
//! A hit in moka's cache writes shared memory (its read log, the entry's reference count, the
//! principal's), which every worker thread does on every request: on many cores those cache
//! lines move from core to core and the per-core rate falls as threads are added (issue 33).
//! So each thread keeps the keys it verified lately in a map of its own, holding its own copy
//! of each key and principal, and only a miss there goes to moka.
//!
//! A copy never outlives what moka would serve: it is dropped when the entry moka holds would
//! expire (its load time + the positive TTL), and every invalidation bumps an epoch that all
//! copies made before it fail, read with one load of a line that is written only then.

use std::cell::RefCell;
use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use moka::future::Cache;

use super::{Entry, KnownKey};
use crate::auth::token::KeyId;

/// Keys one thread keeps; past this the thread's map is emptied (a flood of distinct valid
/// keys then costs moka lookups, as before, never memory).
const FRONT_CAPACITY: usize = 4096;

/// Tells caches apart in a thread's map (tests run several in one process).
static NEXT_ID: AtomicU64 = AtomicU64::new(0);

struct Copy {
    key: Arc<KnownKey>,
    epoch: u64,
    until: Instant,
}

thread_local! {
    static FRONT: RefCell<HashMap<(u64, KeyId), Copy>> = RefCell::new(HashMap::new());
}

#[derive(Clone)]
pub(crate) struct KeyCache {
    shared: Cache<KeyId, Entry>,
    /// Bumped by every invalidation.
    epoch: Arc<AtomicU64>,
    id: u64,
    /// How long moka keeps a known key.
    positive: Duration,
}

impl KeyCache {
    pub(crate) fn new(shared: Cache<KeyId, Entry>, positive: Duration) -> KeyCache {
        KeyCache {
            shared,
            epoch: Arc::default(),
            id: NEXT_ID.fetch_add(1, Ordering::Relaxed),
            positive,
        }
    }

    /// This thread's copy of a known key, if it has a valid one.
    pub(crate) fn local(&self, key_id: KeyId) -> Option<Arc<KnownKey>> {
        let epoch = self.epoch.load(Ordering::Acquire);
        FRONT.with(|front| {
            let mut front = front.borrow_mut();
            let copy = front.get(&(self.id, key_id))?;
            if copy.epoch == epoch && Instant::now() < copy.until {
                return Some(copy.key.clone());
            }
            front.remove(&(self.id, key_id));
            None
        })
    }

    /// The entry from the shared cache, loading it on a miss; a known key comes as this
    /// thread's new copy.
    pub(crate) async fn get_with<E>(
        &self,
        key_id: KeyId,
        load: impl std::future::Future<Output = Result<Entry, E>>,
    ) -> Result<Entry, Arc<E>>
    where
        E: Send + Sync + 'static,
    {
        // Read before the entry: an invalidation after this fails the copy made from it.
        let epoch = self.epoch.load(Ordering::Acquire);
        let entry = self.shared.try_get_with(key_id, load).await?;
        let Entry::Known(key) = entry else {
            return Ok(entry);
        };
        let mine = Arc::new(key.copy());
        let copy = Copy {
            key: mine.clone(),
            epoch,
            until: key.loaded + self.positive,
        };
        FRONT.with(|front| {
            let mut front = front.borrow_mut();
            if front.len() >= FRONT_CAPACITY {
                front.clear();
            }
            front.insert((self.id, key_id), copy);
        });
        Ok(Entry::Known(mine))
    }

    pub(crate) async fn invalidate(&self, key_id: &KeyId) {
        self.epoch.fetch_add(1, Ordering::AcqRel);
        self.shared.invalidate(key_id).await;
        // Again after: a copy made meanwhile from the entry just dropped fails too.
        self.epoch.fetch_add(1, Ordering::AcqRel);
    }

    pub(crate) fn invalidate_all(&self) {
        self.epoch.fetch_add(1, Ordering::AcqRel);
        self.shared.invalidate_all();
        self.epoch.fetch_add(1, Ordering::AcqRel);
    }
}
