//! API keys as stored: one row of `api_keys` per key, with a verifier (SHA-256 of the secret)
//! and never the secret itself. Revocation marks a row, and the row is deleted only once it
//! has been revoked for `[admin] revoked_retention_days` (the access log keeps the audit trail
//! of its creation and revocation).

use async_trait::async_trait;

use super::{Budget, StoreError};

/// A key as stored, without any secret.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KeyRecord {
    pub key_id: String,
    pub name: String,
    pub scopes: Vec<String>,
    pub created_at: i64,
    pub expires_at: Option<i64>,
    pub revoked_at: Option<i64>,
    /// Who the key was made for: the JWT `sub` of its creator through the key API, or the
    /// CLI's `--owner`; none for keys made without one.
    pub owner: Option<String>,
    /// Limits on this key's usage; empty when none is set.
    pub budget: Budget,
}

impl KeyRecord {
    /// Neither revoked nor expired at `now`: what counts against `max_keys_per_owner`.
    pub fn is_active(&self, now: i64) -> bool {
        self.revoked_at.is_none() && self.expires_at.is_none_or(|at| at > now)
    }
}

/// Where a page of keys ends: the last key it holds, in the listing order (newest first by
/// `created_at`, then `key_id`). The next page starts right after it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PageEnd {
    pub created_at: i64,
    pub key_id: String,
}

impl PageEnd {
    pub fn of(record: &KeyRecord) -> PageEnd {
        PageEnd {
            created_at: record.created_at,
            key_id: record.key_id.clone(),
        }
    }

    /// Whether `record` comes after this end in the listing order.
    fn precedes(&self, record: &KeyRecord) -> bool {
        (record.created_at, record.key_id.as_str()) < (self.created_at, self.key_id.as_str())
    }
}

#[derive(Debug, Clone)]
pub struct StoredKey {
    pub record: KeyRecord,
    pub verifier: [u8; 32],
}

/// The keys the gateway looks up and the key API and the `keys` CLI manage.
#[async_trait]
pub trait KeyStore: Send + Sync {
    async fn find(&self, key_id: &str) -> Result<Option<StoredKey>, StoreError>;
    async fn insert(&self, key: &StoredKey) -> Result<(), StoreError>;
    async fn list(&self) -> Result<Vec<KeyRecord>, StoreError>;
    /// The keys of one owner. The stores filter in SQL; this default is for test stores.
    async fn list_by_owner(&self, owner: &str) -> Result<Vec<KeyRecord>, StoreError> {
        let mut keys = self.list().await?;
        keys.retain(|k| k.owner.as_deref() == Some(owner));
        Ok(keys)
    }
    /// Inserts `key` unless its owner already has `cap` active keys at `now` (then false).
    /// The stores count and insert atomically, so concurrent creates cannot pass the cap;
    /// this default (count, then insert) is for test stores.
    async fn insert_capped(&self, key: &StoredKey, cap: u32, now: i64) -> Result<bool, StoreError> {
        if let Some(owner) = &key.record.owner {
            let keys = self.list_by_owner(owner).await?;
            if keys.iter().filter(|k| k.is_active(now)).count() >= cap as usize {
                return Ok(false);
            }
        }
        self.insert(key).await?;
        Ok(true)
    }
    /// Marks the key revoked at `at`; false if no such key. Revoking twice keeps the first time.
    async fn revoke(&self, key_id: &str, at: i64) -> Result<bool, StoreError>;
    /// At most `limit` keys (of `owner`, when given), newest first, starting after `after`.
    /// The stores read just that page through an index (keyset paging), never the whole
    /// table; this default (everything, then filtered) is for test stores.
    async fn page(
        &self,
        owner: Option<&str>,
        after: Option<&PageEnd>,
        limit: u32,
    ) -> Result<Vec<KeyRecord>, StoreError> {
        let mut keys = match owner {
            Some(owner) => self.list_by_owner(owner).await?,
            None => self.list().await?,
        };
        keys.retain(|k| after.is_none_or(|end| end.precedes(k)));
        keys.sort_by(|a, b| (b.created_at, &b.key_id).cmp(&(a.created_at, &a.key_id)));
        keys.truncate(limit as usize);
        Ok(keys)
    }
    /// Deletes at most `batch` keys revoked before `before` (unix seconds); how many it
    /// deleted. Batches keep each write short, so creates and revokes are not held up. The
    /// stores do this in one statement; test stores keep their keys.
    async fn purge_revoked(&self, _before: i64, _batch: u32) -> Result<u64, StoreError> {
        Ok(0)
    }
}
