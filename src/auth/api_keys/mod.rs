//! API keys `ak_<keyid>.<secret>`: creation, and verification through a cache in front of
//! the store. The cache holds verifiers by key id, never secrets; its TTL is the revocation bound.

mod cache;
mod lookup;
mod outage;
mod push;

use std::sync::Arc;
use std::time::{Duration, Instant};

use base64::Engine;
use moka::future::Cache;
use moka::Expiry;
use rand::RngCore;
use sha2::{Digest, Sha256};
use subtle::ConstantTimeEq;

use super::token::{KeyId, API_KEY_PREFIX};
use super::Principal;
use crate::store::{Budget, KeyRecord, KeyStore, StoreError, StoredKey};
use crate::time::unix_now;
use cache::KeyCache;
use lookup::Lookup;
pub(crate) use push::RevocationPush;

#[derive(Clone)]
enum Entry {
    Known(Arc<KnownKey>),
    /// No such key id: cached briefly so floods of random ids stay off the store.
    Unknown,
}

struct KnownKey {
    verifier: [u8; 32],
    expires_at: Option<i64>,
    revoked: bool,
    principal: Arc<Principal>,
    /// When the store was read: the shared cache keeps the entry no longer than its TTL
    /// from (just after) then, and so does a thread's copy.
    loaded: Instant,
}

impl KnownKey {
    /// A copy sharing nothing written per request with the original (`cache.rs`).
    fn copy(&self) -> KnownKey {
        KnownKey {
            principal: Arc::new(Principal::clone(&self.principal)),
            ..*self
        }
    }
}

struct EntryExpiry {
    positive: Duration,
    negative: Duration,
}

impl Expiry<KeyId, Entry> for EntryExpiry {
    fn expire_after_create(&self, _: &KeyId, entry: &Entry, _: Instant) -> Option<Duration> {
        Some(match entry {
            Entry::Unknown => self.negative,
            Entry::Known(k) => match k.expires_at {
                // Never cache a key past its own expiry.
                Some(at) => self.positive.min(Duration::from_secs(
                    at.saturating_sub(unix_now()).max(0) as u64,
                )),
                None => self.positive,
            },
        })
    }
}

pub struct ApiKeyVerifier {
    cache: KeyCache,
    /// Shared with the evictor and the revocation push, which look a revoked key up again.
    lookup: Arc<Lookup>,
}

/// What the gateway compares an unknown id's secret against, so that a miss costs the same.
const DUMMY_VERIFIER: [u8; 32] = [0u8; 32];

impl ApiKeyVerifier {
    pub fn new(store: Arc<dyn KeyStore>, positive: Duration, negative: Duration) -> Self {
        let shared = Cache::builder()
            .max_capacity(100_000)
            .expire_after(EntryExpiry { positive, negative })
            .build();
        ApiKeyVerifier {
            cache: KeyCache::new(shared, positive),
            lookup: Arc::new(Lookup::new(store)),
        }
    }

    pub fn with_lookup_counter(self, lookups: prometheus::IntCounterVec) -> Self {
        let _ = self.lookup.lookups.set(lookups);
        self
    }

    /// The principal the key stands for, or `None` for every kind of failure.
    pub async fn verify(&self, key_id: KeyId, secret: &str) -> Option<Arc<Principal>> {
        // Hashed before the lookup and whatever it finds: no timing tells whether an id exists.
        let digest: [u8; 32] = Sha256::digest(secret.as_bytes()).into();
        let entry = match self.cache.local(key_id) {
            Some(key) => Entry::Known(key),
            None => self
                .cache
                .get_with(key_id, self.lookup.load(key_id))
                .await
                // The outage itself is logged once, by `StoreHealth`; not once per request.
                .map_err(|e| log::debug!("api key lookup failed: {e}"))
                .ok()?,
        };
        match entry {
            Entry::Unknown => {
                let _ = digest.ct_eq(&DUMMY_VERIFIER);
                None
            }
            Entry::Known(key) => {
                let secret_ok: bool = digest.ct_eq(&key.verifier).into();
                let live = !key.revoked && key.expires_at.is_none_or(|at| unix_now() < at);
                (secret_ok && live).then(|| key.principal.clone())
            }
        }
    }

    /// The listener that evicts keys revoked anywhere in the fleet, for `database` (Postgres).
    pub fn revocation_push(&self, database: &str) -> RevocationPush {
        RevocationPush::new(
            database.to_string(),
            self.cache.clone(),
            self.lookup.clone(),
        )
    }

    /// A handle that drops keys from this verifier's cache, for the key API's revokes.
    pub fn evictor(&self) -> KeyEvictor {
        KeyEvictor(self.cache.clone(), self.lookup.clone())
    }

    /// Whether the store is known to be down right now.
    #[cfg(test)]
    pub fn store_down(&self) -> bool {
        self.lookup.health.is_down()
    }
}

/// Drops a revoked key from one gateway's cache, so that gateway refuses it at once, and
/// keeps a lookup in flight from caching it again (`lookup::evict`).
#[derive(Clone)]
pub struct KeyEvictor(KeyCache, Arc<Lookup>);

impl KeyEvictor {
    pub async fn evict(&self, key_id: KeyId) {
        lookup::evict(&self.0, &self.1, key_id).await;
    }
}

/// A freshly created key: the full bearer value is shown once and never stored.
pub struct NewKey {
    pub token: String,
    pub record: KeyRecord,
}

/// Creates a key with a 64-bit id and a 256-bit secret from the OS CSPRNG.
pub async fn create_key(
    store: &dyn KeyStore,
    name: &str,
    scopes: Vec<String>,
    expires_in: Option<Duration>,
) -> Result<NewKey, StoreError> {
    let spec = KeySpec {
        name: name.to_string(),
        scopes,
        expires_in,
        owner: None,
        budget: Default::default(),
    };
    create_owned_key(store, spec, None)
        .await
        .map(|made| made.expect("no cap, so always made"))
}

/// What a new key is for.
#[derive(Debug)]
pub(crate) struct KeySpec {
    pub name: String,
    pub scopes: Vec<String>,
    pub expires_in: Option<Duration>,
    pub owner: Option<String>,
    /// Empty: none.
    pub budget: Budget,
}

/// Creates a key, or `None` when `cap` is given and the owner already has that many active
/// keys (counted and inserted atomically by the store).
pub(crate) async fn create_owned_key(
    store: &dyn KeyStore,
    spec: KeySpec,
    cap: Option<u32>,
) -> Result<Option<NewKey>, StoreError> {
    let mut rng = rand::rngs::OsRng;
    let mut id = [0u8; 8];
    let mut secret = [0u8; 32];
    rng.fill_bytes(&mut id);
    rng.fill_bytes(&mut secret);
    let key_id: String = id.iter().map(|b| format!("{b:02x}")).collect();
    let secret = base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(secret);
    let now = unix_now();
    let record = KeyRecord {
        key_id: key_id.clone(),
        name: spec.name,
        scopes: spec.scopes,
        created_at: now,
        expires_at: spec
            .expires_in
            .map(|d| now.saturating_add(d.as_secs() as i64)),
        revoked_at: None,
        owner: spec.owner,
        budget: spec.budget,
    };
    let stored = StoredKey {
        record: record.clone(),
        verifier: Sha256::digest(secret.as_bytes()).into(),
    };
    match cap {
        Some(cap) => {
            if !store.insert_capped(&stored, cap, now).await? {
                return Ok(None);
            }
        }
        None => store.insert(&stored).await?,
    }
    Ok(Some(NewKey {
        token: format!("{API_KEY_PREFIX}{key_id}.{secret}"),
        record,
    }))
}

#[cfg(test)]
mod race_tests;
#[cfg(test)]
mod tests;
