//! Where API keys live: `sqlite.rs` on one host, `postgres.rs` for a fleet, behind one
//! `KeyStore` trait, with the same rows, the same numbered migrations and one row mapping.
//! Only a verifier (SHA-256 of the secret) is stored; revocation marks a row, and the row is
//! deleted only once it has been revoked for `[admin] revoked_retention_days` (the access log
//! keeps the audit trail of its creation and revocation).

mod budget_sql;
mod budgets;
mod postgres;
mod sqlite;
mod usage;

use std::collections::HashMap;
use std::sync::Arc;

use async_trait::async_trait;
use sqlx::{ColumnIndex, Decode, Row, Type};

pub(crate) use budgets::{Budget, BudgetChange, Subject, WindowStarts, WindowUsage};
pub(crate) use postgres::{check_url as check_postgres_url, is_url as is_postgres_url, CHANNEL};
pub(crate) use sqlite::SqliteStore;
pub(crate) use usage::UsageTotal;
pub use usage::{Grouping, UsageCounts, UsageQuery, UsageRow};

/// The store a `database` URL names: `sqlite://…` or `postgres://…`. `serving`: a gateway
/// starts even when a Postgres server cannot be reached (a `keys` command fails instead).
pub async fn open_store(database: &str, serving: bool) -> Result<Arc<dyn KeyStore>, StoreError> {
    if postgres::is_url(database) {
        Ok(Arc::new(if serving {
            postgres::PgStore::open_for_serving(database).await?
        } else {
            postgres::PgStore::open(database).await?
        }))
    } else {
        Ok(Arc::new(SqliteStore::open(database).await?))
    }
}

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

pub(crate) type StoreError = Box<dyn std::error::Error + Send + Sync>;

/// The store the gateway and the `keys` CLI share; the same plain SQL on both databases.
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
    /// Adds `rows` (hourly, at most one per key) to the usage ledger and its daily rollup, in
    /// one transaction: all of them or none. Test stores keep no ledger.
    async fn add_usage(&self, _rows: &[UsageRow]) -> Result<(), StoreError> {
        Ok(())
    }
    /// `add_usage`, at most once per `batch` (an id the writer keeps for these rows): a retry
    /// of a write whose commit succeeded but was reported failed adds nothing. The batch id is
    /// recorded in the same transaction.
    async fn add_usage_once(&self, _batch: &str, rows: &[UsageRow]) -> Result<(), StoreError> {
        self.add_usage(rows).await
    }
    /// Ledger totals of a range of days, sorted by the grouped parts (day, key, owner,
    /// service, model). Test stores keep no ledger.
    async fn usage(&self, _query: &UsageQuery) -> Result<Vec<UsageTotal>, StoreError> {
        Ok(Vec::new())
    }
    /// Sets (an empty budget: clears) the budget of a key, stamping the change with the
    /// store's own clock (a writer's may lag);
    /// false if no such key. Test stores keep no budgets.
    async fn set_key_budget(&self, _key_id: &str, _budget: &Budget) -> Result<bool, StoreError> {
        Err("this store keeps no budgets".into())
    }
    /// The budget set on an owner, if any.
    async fn owner_budget(&self, _owner: &str) -> Result<Option<Budget>, StoreError> {
        Ok(None)
    }
    /// Sets (an empty budget: clears) an owner's budget, stamping the change with the store's
    /// own clock.
    async fn set_owner_budget(&self, _owner: &str, _budget: &Budget) -> Result<(), StoreError> {
        Err("this store keeps no budgets".into())
    }
    /// Every key and owner budget stamped at or after `since_ms`, as it is now (cleared ones
    /// as empty budgets). `since_ms = 0`: every budget ever set.
    async fn budget_changes(&self, _since_ms: i64) -> Result<Vec<BudgetChange>, StoreError> {
        Ok(Vec::new())
    }
    /// The ledger's totals for one subject in the windows starting at `starts`.
    async fn window_usage(
        &self,
        _subject: &Subject,
        _starts: WindowStarts,
    ) -> Result<WindowUsage, StoreError> {
        Ok(WindowUsage::default())
    }
    /// The ledger's totals in the windows starting at `starts` for each of `key_ids` (a page
    /// of a key listing), keys without usage in the month left out. The stores read them in a
    /// few grouped statements whatever their number; this default (one key at a time) is for
    /// test stores.
    async fn keys_window_usage(
        &self,
        key_ids: &[String],
        starts: WindowStarts,
    ) -> Result<HashMap<String, WindowUsage>, StoreError> {
        let mut out = HashMap::new();
        for id in key_ids {
            let used = self.window_usage(&Subject::Key(id.clone()), starts).await?;
            if used != WindowUsage::default() {
                out.insert(id.clone(), used);
            }
        }
        Ok(out)
    }
    /// The ledger's totals in the windows starting at `starts`, for every key and every
    /// owner with usage in the month (owner `''` and key `''` left out).
    async fn all_window_usage(
        &self,
        _starts: WindowStarts,
    ) -> Result<Vec<(Subject, WindowUsage)>, StoreError> {
        Ok(Vec::new())
    }
}

/// The statement of one page of `KeyStore::page`, one per shape (so each is planned on its
/// index: `api_keys_owner_created` or `api_keys_created`), with parameters in this order:
/// the owner, the end of the last page (`created_at`, `key_id`), the limit. `mark` is the
/// dialect's placeholder prefix (`?` or `$`).
fn page_sql(owner: bool, after: bool, mark: char) -> String {
    let mut n = 0;
    let mut next = || {
        n += 1;
        format!("{mark}{n}")
    };
    let mut conditions = Vec::new();
    if owner {
        conditions.push(format!("owner = {}", next()));
    }
    if after {
        conditions.push(format!("(created_at, key_id) < ({}, {})", next(), next()));
    }
    let filter = if conditions.is_empty() {
        String::new()
    } else {
        format!(" WHERE {}", conditions.join(" AND "))
    };
    format!(
        "SELECT * FROM api_keys{filter} ORDER BY created_at DESC, key_id DESC LIMIT {}",
        next()
    )
}

/// The statement of `KeyStore::purge_revoked`: the oldest revocations first, `batch` at most.
/// Parameters: the time, the batch size.
fn purge_sql(mark: char) -> String {
    format!(
        "DELETE FROM api_keys WHERE key_id IN (SELECT key_id FROM api_keys
             WHERE revoked_at IS NOT NULL AND revoked_at < {mark}1
             ORDER BY revoked_at LIMIT {mark}2)"
    )
}

/// One schema step, numbered the same on both stores, in each database's dialect.
struct Migration {
    version: i64,
    sqlite: &'static str,
    postgres: &'static str,
}

/// Applied once each, in order, and recorded in `portcullis_migrations` on both stores.
/// Never edit a released step: add one.
const MIGRATIONS: &[Migration] = &[
    Migration {
        version: 1,
        sqlite: "CREATE TABLE IF NOT EXISTS api_keys (
            key_id      TEXT PRIMARY KEY,
            name        TEXT NOT NULL,
            verifier    BLOB NOT NULL,
            scopes      TEXT NOT NULL,
            created_at  BIGINT NOT NULL,
            expires_at  BIGINT,
            revoked_at  BIGINT
        )",
        postgres: "CREATE TABLE IF NOT EXISTS api_keys (
            key_id      TEXT PRIMARY KEY,
            name        TEXT NOT NULL,
            verifier    BYTEA NOT NULL,
            scopes      TEXT NOT NULL,
            created_at  BIGINT NOT NULL,
            expires_at  BIGINT,
            revoked_at  BIGINT
        )",
    },
    // Key ownership, for the key API (`owner` is the creator's JWT `sub`).
    Migration {
        version: 2,
        sqlite: "ALTER TABLE api_keys ADD COLUMN owner TEXT;
            CREATE INDEX IF NOT EXISTS api_keys_owner ON api_keys (owner);",
        postgres: "ALTER TABLE api_keys ADD COLUMN IF NOT EXISTS owner TEXT;
            CREATE INDEX IF NOT EXISTS api_keys_owner ON api_keys (owner);",
    },
    // Paged listings (newest first, all keys or one owner's) and the removal of keys revoked
    // long ago read only the rows they need.
    Migration {
        version: 3,
        sqlite: "CREATE INDEX IF NOT EXISTS api_keys_created ON api_keys (created_at, key_id);
            CREATE INDEX IF NOT EXISTS api_keys_owner_created
                ON api_keys (owner, created_at, key_id);
            CREATE INDEX IF NOT EXISTS api_keys_revoked ON api_keys (revoked_at)
                WHERE revoked_at IS NOT NULL;",
        postgres: "CREATE INDEX IF NOT EXISTS api_keys_created ON api_keys (created_at, key_id);
            CREATE INDEX IF NOT EXISTS api_keys_owner_created
                ON api_keys (owner, created_at, key_id);
            CREATE INDEX IF NOT EXISTS api_keys_revoked ON api_keys (revoked_at)
                WHERE revoked_at IS NOT NULL;",
    },
    // The usage ledger (`usage.rs`): hourly rows per key, owner, service and model, and their
    // daily rollup, which usage reports read.
    Migration {
        version: 4,
        sqlite: usage::MIGRATION,
        postgres: usage::MIGRATION,
    },
    // Budgets (`budget_sql.rs`): limits on keys (columns of `api_keys`, stamped when changed)
    // and on owners (`owner_budgets`), and an index for one key's days of the ledger.
    Migration {
        version: 5,
        sqlite: budget_sql::MIGRATION_SQLITE,
        postgres: budget_sql::MIGRATION_POSTGRES,
    },
    // The ledger's written batches (`usage.rs`): a flush is added exactly once.
    Migration {
        version: 6,
        sqlite: usage::MIGRATION_BATCHES,
        postgres: usage::MIGRATION_BATCHES,
    },
];

/// Where both stores record the steps they applied.
const MIGRATIONS_TABLE: &str = "CREATE TABLE IF NOT EXISTS portcullis_migrations (
    version    BIGINT PRIMARY KEY,
    applied_at BIGINT NOT NULL
)";

/// The newest version recorded that this binary does not know, if any: worth a warning.
fn newer_than_known(applied: &[i64]) -> Option<i64> {
    let known = MIGRATIONS.last().map_or(0, |m| m.version);
    applied.iter().copied().filter(|&v| v > known).max()
}

/// A row of `api_keys` as a record, on either database.
fn record<R>(row: &R) -> Result<KeyRecord, sqlx::Error>
where
    R: Row,
    for<'c> &'c str: ColumnIndex<R>,
    for<'d> String: Decode<'d, R::Database> + Type<R::Database>,
    for<'d> i64: Decode<'d, R::Database> + Type<R::Database>,
{
    let scopes: String = row.try_get("scopes")?;
    Ok(KeyRecord {
        key_id: row.try_get("key_id")?,
        name: row.try_get("name")?,
        scopes: scopes.split_whitespace().map(str::to_string).collect(),
        created_at: row.try_get("created_at")?,
        expires_at: row.try_get("expires_at")?,
        revoked_at: row.try_get("revoked_at")?,
        owner: row.try_get("owner")?,
        budget: budget_sql::budget_of(row)?,
    })
}

/// A row of `api_keys` with its verifier, on either database.
fn stored<R>(row: &R) -> Result<StoredKey, StoreError>
where
    R: Row,
    for<'c> &'c str: ColumnIndex<R>,
    for<'d> String: Decode<'d, R::Database> + Type<R::Database>,
    for<'d> i64: Decode<'d, R::Database> + Type<R::Database>,
    for<'d> Vec<u8>: Decode<'d, R::Database> + Type<R::Database>,
{
    let verifier: Vec<u8> = row.try_get("verifier")?;
    Ok(StoredKey {
        record: record(row)?,
        verifier: verifier
            .try_into()
            .map_err(|_| "stored verifier has the wrong length")?,
    })
}

#[cfg(test)]
mod budget_tests;
#[cfg(test)]
mod tests;
