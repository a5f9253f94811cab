//! The store lookup behind every cache miss, and the eviction of revoked keys, which must
//! reckon with lookups still in flight.
//!
//! The race: a lookup reads a key's row just before a revoke commits, the revoke is announced
//! (NOTIFY, or the key API's own eviction) and the key dropped from the cache, then the lookup
//! ends and caches the row it read, unrevoked, for `cache_ttl_seconds`. Measured on a real
//! PostgreSQL server (`race_tests.rs`): about one race in 150 ended so, on either path.
//!
//! So an eviction looks again: moka runs one load per key at a time and inserts its result
//! before it wakes the callers waiting on it, so a `try_get_with` after the eviction either
//! joins the lookup in flight (and sees what it cached) or loads afresh (after the commit, so
//! the revoke shows). What it finds stays cached only if it shows the revoke.

use std::sync::{Arc, OnceLock};
use std::time::Instant;

use super::cache::KeyCache;
use super::outage::StoreHealth;
use super::{Entry, KnownKey};
use crate::auth::token::KeyId;
use crate::auth::{Principal, PrincipalKind};
use crate::store::{KeyStore, StoreError};

pub(crate) struct Lookup {
    pub store: Arc<dyn KeyStore>,
    pub health: Arc<StoreHealth>,
    /// `portcullis_key_store_lookups_total{result}`, when metrics are on.
    pub lookups: OnceLock<prometheus::IntCounterVec>,
}

impl Lookup {
    pub(crate) fn new(store: Arc<dyn KeyStore>) -> Lookup {
        Lookup {
            store,
            health: Arc::default(),
            lookups: OnceLock::new(),
        }
    }

    fn count(&self, result: &str) {
        if let Some(lookups) = self.lookups.get() {
            lookups.with_label_values(&[result]).inc();
        }
    }

    /// One store lookup per id, shared by every concurrent miss for it (moka coalesces).
    /// A store known to be down is not asked (but once a second): the miss fails at once.
    pub(crate) async fn load(&self, key_id: KeyId) -> Result<Entry, StoreError> {
        if !self.health.may_try() {
            self.count("unavailable");
            return Err("the key store is down".into());
        }
        let found = self.store.find(key_id.as_str()).await;
        match &found {
            Ok(_) => self.health.succeeded(),
            Err(e) => self.health.failed(e),
        }
        self.count(match &found {
            Ok(Some(_)) => "found",
            Ok(None) => "unknown",
            Err(_) => "error",
        });
        Ok(match found? {
            None => Entry::Unknown,
            Some(stored) => Entry::Known(Arc::new(KnownKey {
                verifier: stored.verifier,
                expires_at: stored.record.expires_at,
                revoked: stored.record.revoked_at.is_some(),
                principal: Arc::new(Principal {
                    kind: PrincipalKind::ApiKey,
                    id: stored.record.key_id.into(),
                    scopes: stored.record.scopes.into_iter().map(Into::into).collect(),
                    owner: stored.record.owner.map(Into::into),
                    budget: stored.record.budget,
                }),
                loaded: Instant::now(),
            })),
        })
    }
}

/// Drops a revoked key from `cache` at once, then looks again (`recheck`).
pub(crate) async fn evict(cache: &KeyCache, lookup: &Arc<Lookup>, key_id: KeyId) {
    cache.invalidate(&key_id).await;
    recheck(cache, lookup, key_id).await;
}

/// Called after `key_id` was invalidated: what a lookup in flight cached, or a fresh one, is
/// kept only if it shows the key revoked. Costs one store query per revoke per gateway.
pub(crate) async fn recheck(cache: &KeyCache, lookup: &Arc<Lookup>, key_id: KeyId) {
    let now = cache.get_with(key_id, lookup.load(key_id)).await;
    if !matches!(now, Ok(Entry::Known(key)) if key.revoked) {
        cache.invalidate(&key_id).await;
    }
}
