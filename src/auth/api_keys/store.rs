//! Where API keys live. Only a verifier (SHA-256 of the secret) is stored; revocation marks
//! a row and never deletes it, so a key id is never reused and the audit trail stays.

use std::fs::OpenOptions;
use std::io;
use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
use std::path::Path;
use std::str::FromStr;
use std::time::Duration;

use async_trait::async_trait;
use sqlx::sqlite::{SqliteConnectOptions, SqliteJournalMode, SqlitePool, SqlitePoolOptions};
use sqlx::Row;

/// The store a `database` URL names: `sqlite://…` or `postgres://…`. `serving`: a gateway
/// starts even when a Postgres server cannot be reached (a `keys` command fails instead).
pub async fn open_store(
    database: &str,
    serving: bool,
) -> Result<std::sync::Arc<dyn KeyStore>, StoreError> {
    use super::postgres::PgStore;
    if super::postgres::is_url(database) {
        Ok(std::sync::Arc::new(if serving {
            PgStore::open_for_serving(database).await?
        } else {
            PgStore::open(database).await?
        }))
    } else {
        Ok(std::sync::Arc::new(SqliteStore::open(database).await?))
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
}

impl KeyRecord {
    /// Neither revoked nor expired at `now`: what counts against `max_keys_per_owner`.
    pub fn is_active(&self, now: i64) -> bool {
        self.revoked_at.is_none() && self.expires_at.is_none_or(|at| at > now)
    }
}

#[derive(Debug, Clone)]
pub struct StoredKey {
    pub record: KeyRecord,
    pub verifier: [u8; 32],
}

pub type StoreError = Box<dyn std::error::Error + Send + Sync>;

/// The store the gateway and the `keys` CLI share: `SqliteStore` on one host, `PgStore`
/// (postgres.rs) for a fleet; the same rows and the same plain SQL.
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
}

/// The first release's table: every database starts here, then takes the `MIGRATIONS` it
/// lacks, so an old file and a new one end up the same.
const SCHEMA: &str = "CREATE TABLE IF NOT EXISTS api_keys (
    key_id      TEXT PRIMARY KEY,
    name        TEXT NOT NULL,
    verifier    BLOB NOT NULL,
    scopes      TEXT NOT NULL,
    created_at  BIGINT NOT NULL,
    expires_at  BIGINT,
    revoked_at  BIGINT
)";

/// Schema steps after `SCHEMA`; step N sets SQLite's `user_version` to N. Never edit a
/// released step: add one.
const MIGRATIONS: &[&str] = &[
    // 1: key ownership, for the key API (`owner` is the creator's JWT `sub`).
    "ALTER TABLE api_keys ADD COLUMN owner TEXT;
     CREATE INDEX IF NOT EXISTS api_keys_owner ON api_keys (owner);",
];

/// Brings a database to the current schema inside one `BEGIN IMMEDIATE` transaction, so two
/// processes opening the same new or old file at once take turns and apply each step once.
async fn migrate(conn: &mut sqlx::SqliteConnection) -> Result<(), StoreError> {
    sqlx::raw_sql("BEGIN IMMEDIATE").execute(&mut *conn).await?;
    let result = async {
        sqlx::query(SCHEMA).execute(&mut *conn).await?;
        let version: i64 = sqlx::query_scalar("PRAGMA user_version")
            .fetch_one(&mut *conn)
            .await?;
        for (step, sql) in MIGRATIONS.iter().enumerate().skip(version.max(0) as usize) {
            let step = step + 1;
            sqlx::raw_sql(sql).execute(&mut *conn).await?;
            // PRAGMA takes no bound parameters; `step` is a number of ours.
            sqlx::raw_sql(&format!("PRAGMA user_version = {step}"))
                .execute(&mut *conn)
                .await?;
            log::info!("key store: applied schema migration {step}");
        }
        if version > MIGRATIONS.len() as i64 {
            log::warn!("key store schema is at version {version}, newer than this binary knows");
        }
        Ok::<(), StoreError>(())
    }
    .await;
    let end = if result.is_ok() { "COMMIT" } else { "ROLLBACK" };
    sqlx::raw_sql(end).execute(&mut *conn).await?;
    result
}

pub struct SqliteStore {
    pool: SqlitePool,
}

impl SqliteStore {
    /// Opens (creating file and schema on first use) and checks the database now, so a bad
    /// path fails at start-up. The pool itself connects lazily on the runtime that uses it.
    pub async fn open(url: &str) -> Result<SqliteStore, StoreError> {
        let options = SqliteConnectOptions::from_str(url)?
            .create_if_missing(true)
            .journal_mode(SqliteJournalMode::Wal)
            .busy_timeout(Duration::from_secs(2));
        let file = options.get_filename();
        if let Some(dir) = file.parent() {
            if !dir.as_os_str().is_empty() {
                std::fs::create_dir_all(dir)?;
            }
        }
        if file != Path::new(":memory:") {
            private_file(file)?;
        }
        let setup = SqlitePoolOptions::new()
            .max_connections(1)
            .connect_with(options.clone())
            .await?;
        migrate(&mut *setup.acquire().await?).await?;
        setup.close().await;
        let pool = SqlitePoolOptions::new()
            .max_connections(4)
            .acquire_timeout(Duration::from_secs(2))
            .connect_lazy_with(options);
        Ok(SqliteStore { pool })
    }
}

/// Key names, scopes and verifiers are for the gateway's user alone: a new database file is
/// created 0600 (SQLite gives its `-wal` and `-shm` files the same mode), and an existing one
/// that others can read is reported, not silently changed.
fn private_file(path: &Path) -> io::Result<()> {
    match OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(path)
    {
        Ok(_) => Ok(()),
        Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {
            let mode = std::fs::metadata(path)?.permissions().mode();
            if mode & 0o077 != 0 {
                log::warn!(
                    "key store {} is readable or writable by other users (mode {:o}): chmod 600 it",
                    path.display(),
                    mode & 0o777
                );
            }
            Ok(())
        }
        Err(e) => Err(e),
    }
}

fn record(row: &sqlx::sqlite::SqliteRow) -> Result<KeyRecord, sqlx::Error> {
    let scopes: String = row.try_get("scopes")?;
    Ok(KeyRecord {
        key_id: row.try_get("key_id")?,
        name: row.try_get("name")?,
        scopes: scopes.split_whitespace().map(str::to_string).collect(),
        created_at: row.try_get("created_at")?,
        expires_at: row.try_get("expires_at")?,
        revoked_at: row.try_get("revoked_at")?,
        owner: row.try_get("owner")?,
    })
}

#[async_trait]
impl KeyStore for SqliteStore {
    async fn find(&self, key_id: &str) -> Result<Option<StoredKey>, StoreError> {
        let row = sqlx::query("SELECT * FROM api_keys WHERE key_id = ?1")
            .bind(key_id)
            .fetch_optional(&self.pool)
            .await?;
        let Some(row) = row else { return Ok(None) };
        let verifier: Vec<u8> = row.try_get("verifier")?;
        Ok(Some(StoredKey {
            record: record(&row)?,
            verifier: verifier
                .try_into()
                .map_err(|_| "stored verifier has the wrong length")?,
        }))
    }

    async fn insert(&self, key: &StoredKey) -> Result<(), StoreError> {
        // Uncapped: the one insert statement, with a count that can never reach the cap.
        self.insert_capped(key, u32::MAX, 0).await.map(|_| ())
    }

    async fn insert_capped(&self, key: &StoredKey, cap: u32, now: i64) -> Result<bool, StoreError> {
        let r = &key.record;
        // One statement: SQLite holds the write lock from the count to the insert.
        let done = sqlx::query(
            "INSERT INTO api_keys (key_id, name, verifier, scopes, created_at, expires_at, owner)
             SELECT ?1, ?2, ?3, ?4, ?5, ?6, ?7
             WHERE ?7 IS NULL OR (SELECT count(*) FROM api_keys WHERE owner = ?7
                 AND revoked_at IS NULL AND (expires_at IS NULL OR expires_at > ?8)) < ?9",
        )
        .bind(&r.key_id)
        .bind(&r.name)
        .bind(&key.verifier[..])
        .bind(r.scopes.join(" "))
        .bind(r.created_at)
        .bind(r.expires_at)
        .bind(&r.owner)
        .bind(now)
        .bind(cap as i64)
        .execute(&self.pool)
        .await?;
        Ok(done.rows_affected() == 1)
    }

    async fn list_by_owner(&self, owner: &str) -> Result<Vec<KeyRecord>, StoreError> {
        let rows =
            sqlx::query("SELECT * FROM api_keys WHERE owner = ?1 ORDER BY created_at, key_id")
                .bind(owner)
                .fetch_all(&self.pool)
                .await?;
        Ok(rows.iter().map(record).collect::<Result<_, _>>()?)
    }

    async fn list(&self) -> Result<Vec<KeyRecord>, StoreError> {
        let rows = sqlx::query("SELECT * FROM api_keys ORDER BY created_at, key_id")
            .fetch_all(&self.pool)
            .await?;
        Ok(rows.iter().map(record).collect::<Result<_, _>>()?)
    }

    async fn revoke(&self, key_id: &str, at: i64) -> Result<bool, StoreError> {
        let done = sqlx::query(
            "UPDATE api_keys SET revoked_at = COALESCE(revoked_at, ?2) WHERE key_id = ?1",
        )
        .bind(key_id)
        .bind(at)
        .execute(&self.pool)
        .await?;
        Ok(done.rows_affected() > 0)
    }
}
