//! The fleet key store: PostgreSQL, shared by every gateway and `keys` CLI of a fleet.
//!
//! Same rows and semantics as the SQLite store. The schema is applied by numbered migrations
//! under a transaction-level advisory lock, so gateways and CLIs starting at once take turns.
//! A revoke notifies `CHANNEL` in the same transaction (delivered on commit), which every
//! gateway LISTENs to (see `push.rs`).

use std::str::FromStr;
use std::time::Duration;

use async_trait::async_trait;
use sqlx::postgres::{PgConnectOptions, PgPool, PgPoolOptions, PgRow};
use sqlx::{Connection, PgConnection, Row};

use super::store::{KeyRecord, KeyStore, StoreError, StoredKey};

/// The NOTIFY channel a revoke is announced on; the payload is the key id.
pub const CHANNEL: &str = "portcullis_key_revoked";

/// Any constant shared by every Portcullis build: "PORTCULL" in ASCII.
const MIGRATION_LOCK: i64 = 0x504f_5254_4355_4c4c;

/// Numbered schema steps, applied once each, in order. Never edit a released step: add one.
const MIGRATIONS: &[(i64, &str)] = &[(
    1,
    "CREATE TABLE IF NOT EXISTS api_keys (
        key_id      TEXT PRIMARY KEY,
        name        TEXT NOT NULL,
        verifier    BYTEA NOT NULL,
        scopes      TEXT NOT NULL,
        created_at  BIGINT NOT NULL,
        expires_at  BIGINT,
        revoked_at  BIGINT
    )",
)];

/// Parses a `postgres://` URL. Its problems never quote it: it may hold a password.
pub fn check_url(url: &str) -> Result<PgConnectOptions, String> {
    PgConnectOptions::from_str(url).map_err(|_| {
        "is not a valid postgres://user[:password]@host[:port]/database URL".to_string()
    })
}

/// How long opening waits for the server: a CLI or a starting gateway should fail, not hang.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);

pub struct PgStore {
    pool: PgPool,
}

impl PgStore {
    /// Connects once to apply the migrations, so a wrong URL, password or unreachable
    /// server fails now; the pool then connects lazily on the runtime that uses it.
    pub async fn open(url: &str) -> Result<PgStore, StoreError> {
        let options = check_url(url)?;
        let mut setup = tokio::time::timeout(CONNECT_TIMEOUT, PgConnection::connect_with(&options))
            .await
            .map_err(|_| "the Postgres server did not answer within 5 s")??;
        migrate(&mut setup).await?;
        setup.close().await?;
        let pool = PgPoolOptions::new()
            .max_connections(8)
            // A dead server must fail a lookup fast: the outage logic then stops asking.
            .acquire_timeout(Duration::from_secs(1))
            .connect_lazy_with(options);
        Ok(PgStore { pool })
    }
}

async fn migrate(conn: &mut PgConnection) -> Result<(), StoreError> {
    let mut tx = conn.begin().await?;
    sqlx::query("SELECT pg_advisory_xact_lock($1)")
        .bind(MIGRATION_LOCK)
        .execute(&mut *tx)
        .await?;
    sqlx::query(
        "CREATE TABLE IF NOT EXISTS portcullis_migrations (
            version    BIGINT PRIMARY KEY,
            applied_at BIGINT NOT NULL
        )",
    )
    .execute(&mut *tx)
    .await?;
    let applied: Vec<i64> = sqlx::query_scalar("SELECT version FROM portcullis_migrations")
        .fetch_all(&mut *tx)
        .await?;
    for (version, sql) in MIGRATIONS {
        if applied.contains(version) {
            continue;
        }
        sqlx::raw_sql(sql).execute(&mut *tx).await?;
        sqlx::query("INSERT INTO portcullis_migrations (version, applied_at) VALUES ($1, $2)")
            .bind(version)
            .bind(crate::auth::unix_now())
            .execute(&mut *tx)
            .await?;
        log::info!("key store: applied schema migration {version}");
    }
    if let Some(newer) = applied
        .iter()
        .filter(|v| **v > MIGRATIONS.len() as i64)
        .max()
    {
        log::warn!("key store schema is at version {newer}, newer than this binary knows");
    }
    tx.commit().await?;
    Ok(())
}

fn record(row: &PgRow) -> Result<KeyRecord, sqlx::Error> {
    let scopes: String = row.try_get("scopes")?;
    Ok(KeyRecord {
        key_id: row.try_get("key_id")?,
        name: row.try_get("name")?,
        scopes: scopes.split_whitespace().map(str::to_string).collect(),
        created_at: row.try_get("created_at")?,
        expires_at: row.try_get("expires_at")?,
        revoked_at: row.try_get("revoked_at")?,
    })
}

#[async_trait]
impl KeyStore for PgStore {
    async fn find(&self, key_id: &str) -> Result<Option<StoredKey>, StoreError> {
        let row = sqlx::query("SELECT * FROM api_keys WHERE key_id = $1")
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
        let r = &key.record;
        sqlx::query(
            "INSERT INTO api_keys (key_id, name, verifier, scopes, created_at, expires_at, revoked_at)
             VALUES ($1, $2, $3, $4, $5, $6, NULL)",
        )
        .bind(&r.key_id)
        .bind(&r.name)
        .bind(&key.verifier[..])
        .bind(r.scopes.join(" "))
        .bind(r.created_at)
        .bind(r.expires_at)
        .execute(&self.pool)
        .await?;
        Ok(())
    }

    async fn list(&self) -> Result<Vec<KeyRecord>, StoreError> {
        let rows = sqlx::query("SELECT * FROM api_keys ORDER BY created_at, key_id")
            .fetch_all(&self.pool)
            .await?;
        Ok(rows.iter().map(record).collect::<Result<_, _>>()?)
    }

    async fn revoke(&self, key_id: &str, at: i64) -> Result<bool, StoreError> {
        let mut tx = self.pool.begin().await?;
        let done = sqlx::query(
            "UPDATE api_keys SET revoked_at = COALESCE(revoked_at, $2) WHERE key_id = $1",
        )
        .bind(key_id)
        .bind(at)
        .execute(&mut *tx)
        .await?;
        let found = done.rows_affected() > 0;
        if found {
            // Sent on commit, so no gateway hears of a revoke that did not happen. Repeated
            // on a second revoke: harmless, and it heals a gateway that missed the first.
            sqlx::query("SELECT pg_notify($1, $2)")
                .bind(CHANNEL)
                .bind(key_id)
                .execute(&mut *tx)
                .await?;
        }
        tx.commit().await?;
        Ok(found)
    }
}
