//! The key cache: moka's, shared by the process, behind a copy per worker thread
//! (`auth::thread_copies` says why). A thread's copy of a known key is its own `KnownKey` and
//! `Principal`, so verifying from it writes nothing another thread reads.

use std::sync::Arc;
use std::time::Duration;

use moka::future::Cache;

use super::{Entry, KnownKey};
use crate::auth::thread_copies::ThreadCopies;
use crate::auth::token::KeyId;

#[derive(Clone)]
pub(crate) struct KeyCache {
    shared: Cache<KeyId, Entry>,
    copies: ThreadCopies<Arc<KnownKey>>,
    /// How long moka keeps a known key.
    positive: Duration,
}

/// A key id as the copies' key.
fn slot(key_id: KeyId) -> [u8; 32] {
    let mut slot = [0; 32];
    slot[..key_id.0.len()].copy_from_slice(&key_id.0);
    slot
}

impl KeyCache {
    pub(crate) fn new(shared: Cache<KeyId, Entry>, positive: Duration) -> KeyCache {
        KeyCache {
            shared,
            copies: ThreadCopies::new(),
            positive,
        }
    }

    /// This thread's copy of a known key, if it has a valid one.
    pub(crate) fn local(&self, key_id: KeyId) -> Option<Arc<KnownKey>> {
        self.copies.get(&slot(key_id))
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
        let epoch = self.copies.epoch();
        let entry = self.shared.try_get_with(key_id, load).await?;
        let Entry::Known(key) = entry else {
            return Ok(entry);
        };
        let mine = Arc::new(key.copy());
        // Moka's entry expires no sooner: it was made after the load.
        let until = key.loaded + self.positive;
        self.copies.keep(slot(key_id), mine.clone(), epoch, until);
        Ok(Entry::Known(mine))
    }

    pub(crate) async fn invalidate(&self, key_id: &KeyId) {
        self.copies.invalidate();
        self.shared.invalidate(key_id).await;
        self.copies.invalidate();
    }

    pub(crate) fn invalidate_all(&self) {
        self.copies.invalidate();
        self.shared.invalidate_all();
        self.copies.invalidate();
    }
}
