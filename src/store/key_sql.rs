//! API keys in the store, the same statements on both databases (`mark`: the dialect's
//! placeholder prefix, `?` or `$`), and one mapping from a row of `api_keys` to a key.

use sqlx::Row;

use super::sql_bounds::with_sql_bounds;
use super::{budget_sql, KeyRecord, StoreError, StoredKey};

/// The statement of one page of `KeyStore::page`, one per shape (so each is planned on its
/// index: `api_keys_owner_created` or `api_keys_created`), with parameters in this order:
/// the owner, the end of the last page (`created_at`, `key_id`), the limit. `mark` is the
/// dialect's placeholder prefix (`?` or `$`).
pub(super) fn page_sql(owner: bool, after: bool, mark: char) -> String {
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
pub(super) fn purge_sql(mark: char) -> String {
    format!(
        "DELETE FROM api_keys WHERE key_id IN (SELECT key_id FROM api_keys
             WHERE revoked_at IS NOT NULL AND revoked_at < {mark}1
             ORDER BY revoked_at LIMIT {mark}2)"
    )
}

with_sql_bounds!(
    /// A row of `api_keys` as a record, on either database.
    fn record<DB>(row: &DB::Row) -> Result<KeyRecord, sqlx::Error> {
        let scopes: String = row.try_get("scopes")?;
        Ok(KeyRecord {
            key_id: row.try_get("key_id")?,
            name: row.try_get("name")?,
            scopes: scopes.split_whitespace().map(str::to_string).collect(),
            created_at: row.try_get("created_at")?,
            expires_at: row.try_get("expires_at")?,
            revoked_at: row.try_get("revoked_at")?,
            owner: row.try_get("owner")?,
            budget: budget_sql::budget_of::<DB>(row)?,
        })
    }

    /// Rows of `api_keys` as records: a listing.
    pub(super) fn records<DB>(rows: &[DB::Row]) -> Result<Vec<KeyRecord>, sqlx::Error> {
        rows.iter().map(record::<DB>).collect()
    }

    /// A row of `api_keys` with its verifier, on either database.
    pub(super) fn stored<DB>(row: &DB::Row) -> Result<StoredKey, StoreError> {
        let verifier: Vec<u8> = row.try_get("verifier")?;
        Ok(StoredKey {
            record: record::<DB>(row)?,
            verifier: verifier
                .try_into()
                .map_err(|_| "stored verifier has the wrong length")?,
        })
    }
);
