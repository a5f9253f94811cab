//! The fleet key store: PostgreSQL, shared by every gateway and `keys` CLI of a fleet.
//!
//! Same rows and semantics as the SQLite store. The schema is applied by numbered migrations
//! under a transaction-level advisory lock, so gateways and CLIs starting at once take turns.
//! A revoke notifies `CHANNEL` in the same transaction (delivered on commit), which every
//! gateway LISTENs to through `Revocations` (see `auth/api_keys/push.rs`).

use std::collections::HashMap;
use std::str::FromStr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use async_trait::async_trait;
use sqlx::postgres::{PgConnectOptions, PgListener, PgPool, PgPoolOptions};
use sqlx::{Connection, PgConnection, Postgres};

use super::key_sql::{page_sql, purge_sql, records, stored};
use super::migrations::{newer_than_known, MIGRATIONS, MIGRATIONS_TABLE};
use super::{budget_sql, ledger_sql, window_sql};
use super::{
    Budget, BudgetChange, BudgetStore, KeyRecord, KeyStore, LedgerStore, PageEnd, StoreError,
    StoredKey, Subject, TeamChange, UsageQuery, UsageRow, UsageTotal, WindowStarts, WindowUsage,
};

/// The NOTIFY channel a revoke is announced on; the payload is the key id.
const CHANNEL: &str = "portcullis_key_revoked";

/// Any constant shared by every Portcullis build: "PORTCULL" in ASCII.
const MIGRATION_LOCK: i64 = 0x504f_5254_4355_4c4c;

/// The first key of the two-key advisory lock that serialises one owner's creates.
const OWNER_LOCK: i32 = 0x5043_4b4f; // "PCKO"

/// Whether a `database` URL names a Postgres server rather than a SQLite file.
pub(crate) fn is_url(database: &str) -> bool {
    database.starts_with("postgres://") || database.starts_with("postgresql://")
}

/// Parses a `postgres://` URL. Its problems never quote it: it may hold a password.
pub(crate) fn check_url(url: &str) -> Result<PgConnectOptions, String> {
    PgConnectOptions::from_str(url).map_err(|_| {
        "is not a valid postgres://user[:password]@host[:port]/database URL".to_string()
    })
}

/// How long opening waits for the server: a CLI or a starting gateway should fail, not hang.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);

pub(crate) struct PgStore {
    pool: PgPool,
    options: PgConnectOptions,
    /// False only for a gateway that started while the server was unreachable: the schema
    /// is then checked on first use.
    migrated: AtomicBool,
    migrating: tokio::sync::Mutex<()>,
}

impl PgStore {
    /// Connects once to apply the migrations, so a wrong URL, password or unreachable
    /// server fails now (what the `keys` commands want); the pool then connects lazily on
    /// the runtime that uses it.
    pub(crate) async fn open(url: &str) -> Result<PgStore, StoreError> {
        let options = check_url(url)?;
        apply_schema(&options).await?;
        Ok(PgStore::lazy(options, true))
    }

    /// As `open`, but a server that cannot be reached is an outage, not a configuration
    /// error: the gateway starts (cached and JWT traffic need no store) and applies the
    /// schema once the server answers. A refused login or a missing database still fails.
    pub(crate) async fn open_for_serving(url: &str) -> Result<PgStore, StoreError> {
        match PgStore::open(url).await {
            Ok(store) => Ok(store),
            Err(e) if unreachable(&*e) => {
                log::warn!(
                    "auth.api_keys.database: the Postgres server cannot be reached ({e}); \
                     starting anyway: API keys get 401 until it answers"
                );
                Ok(PgStore::lazy(check_url(url)?, false))
            }
            Err(e) => Err(e),
        }
    }

    fn lazy(options: PgConnectOptions, migrated: bool) -> PgStore {
        let pool = PgPoolOptions::new()
            .max_connections(8)
            // A dead server must fail a lookup fast: the outage logic then stops asking.
            .acquire_timeout(Duration::from_secs(1))
            .connect_lazy_with(options.clone());
        PgStore {
            pool,
            options,
            migrated: AtomicBool::new(migrated),
            migrating: tokio::sync::Mutex::new(()),
        }
    }

    /// The schema, applied once, before the first use of a store opened while unreachable.
    async fn ready(&self) -> Result<(), StoreError> {
        if self.migrated.load(Ordering::Acquire) {
            return Ok(());
        }
        let _turn = self.migrating.lock().await;
        if !self.migrated.load(Ordering::Acquire) {
            // On a thread and connection of its own: sqlx's borrowed executors make this
            // future one the compiler cannot prove Send, which a request's future must be.
            let options = self.options.clone();
            let (done, result) = tokio::sync::oneshot::channel();
            std::thread::spawn(move || {
                let applied = tokio::runtime::Builder::new_current_thread()
                    .enable_all()
                    .build()
                    .map_err(StoreError::from)
                    .and_then(|rt| rt.block_on(apply_schema(&options)));
                let _ = done.send(applied);
            });
            result.await.map_err(|_| "the schema migration stopped")??;
            self.migrated.store(true, Ordering::Release);
        }
        Ok(())
    }
}

/// The revokes announced on `CHANNEL`, as they arrive, on a connection of its own.
pub(crate) struct Revocations(PgListener);

impl Revocations {
    /// Connects and listens, in one attempt of at most `wait`: the listener's own pool would
    /// otherwise retry for 30 s before telling that the store is down. It never reconnects by
    /// itself: reconnecting is the caller's, which must know when it happens.
    pub(crate) async fn listen(url: &str, wait: Duration) -> Result<Revocations, StoreError> {
        let options = check_url(url).map_err(|e| sqlx::Error::Configuration(e.into()))?;
        let pool = PgPoolOptions::new()
            .max_connections(1)
            .acquire_timeout(wait)
            .connect_lazy_with(options);
        let mut listener = PgListener::connect_with(&pool).await?;
        listener.eager_reconnect(false);
        listener.listen(CHANNEL).await?;
        Ok(Revocations(listener))
    }

    /// The next announced key id, as sent (unchecked); `None` once the connection is lost.
    pub(crate) async fn recv(&mut self) -> Option<String> {
        match self.0.try_recv().await {
            Ok(Some(notification)) => Some(notification.payload().to_string()),
            _ => None,
        }
    }
}

/// A failure to reach the server at all, as opposed to one it reported.
fn unreachable(e: &(dyn std::error::Error + 'static)) -> bool {
    match e.downcast_ref::<sqlx::Error>() {
        Some(sqlx::Error::Io(_) | sqlx::Error::PoolTimedOut) => true,
        Some(_) => false,
        // Our own timeout message.
        None => e.to_string().contains("did not answer"),
    }
}

/// One connection of its own, the missing steps in one transaction, and closed again.
async fn apply_schema(options: &PgConnectOptions) -> Result<(), StoreError> {
    let mut conn = tokio::time::timeout(CONNECT_TIMEOUT, PgConnection::connect_with(options))
        .await
        .map_err(|_| "the Postgres server did not answer within 5 s")??;
    let mut tx = conn.begin().await?;
    migrate(&mut tx).await?;
    tx.commit().await?;
    conn.close().await?;
    Ok(())
}

/// Applies the missing steps in `tx`; the lock is held until the caller commits.
async fn migrate(tx: &mut sqlx::Transaction<'_, sqlx::Postgres>) -> Result<(), StoreError> {
    sqlx::query("SELECT pg_advisory_xact_lock($1)")
        .bind(MIGRATION_LOCK)
        .execute(&mut **tx)
        .await?;
    sqlx::query(MIGRATIONS_TABLE).execute(&mut **tx).await?;
    let applied: Vec<i64> = sqlx::query_scalar("SELECT version FROM portcullis_migrations")
        .fetch_all(&mut **tx)
        .await?;
    for m in MIGRATIONS.iter().filter(|m| !applied.contains(&m.version)) {
        sqlx::raw_sql(m.postgres).execute(&mut **tx).await?;
        sqlx::query("INSERT INTO portcullis_migrations (version, applied_at) VALUES ($1, $2)")
            .bind(m.version)
            .bind(crate::time::unix_now())
            .execute(&mut **tx)
            .await?;
        log::info!("key store: applied schema migration {}", m.version);
    }
    if let Some(newer) = newer_than_known(&applied) {
        log::warn!("key store schema is at version {newer}, newer than this binary knows");
    }
    Ok(())
}

#[async_trait]
impl KeyStore for PgStore {
    async fn find(&self, key_id: &str) -> Result<Option<StoredKey>, StoreError> {
        self.ready().await?;
        let row = sqlx::query("SELECT * FROM api_keys WHERE key_id = $1")
            .bind(key_id)
            .fetch_optional(&self.pool)
            .await?;
        row.as_ref().map(stored::<Postgres>).transpose()
    }

    async fn insert(&self, key: &StoredKey) -> Result<(), StoreError> {
        // Uncapped: the one insert statement, with a count that can never reach the cap.
        self.insert_capped(key, u32::MAX, 0).await.map(|_| ())
    }

    async fn insert_capped(&self, key: &StoredKey, cap: u32, now: i64) -> Result<bool, StoreError> {
        self.ready().await?;
        let r = &key.record;
        let [hour, day, month, requests, cost_day, cost_month] = budget_sql::columns(&r.budget)?;
        // Stamped on the store's clock when the key has a budget (?14/$14: whether it has).
        let stamped = (!r.budget.is_empty()).then_some(1i64);
        let mut tx = self.pool.begin().await?;
        if let Some(owner) = &r.owner {
            // Concurrent creates for one owner (on any gateway) take turns from the count to
            // the insert; other owners are not held up.
            sqlx::query("SELECT pg_advisory_xact_lock($1, hashtext($2))")
                .bind(OWNER_LOCK)
                .bind(owner)
                .execute(&mut *tx)
                .await?;
        }
        let done = sqlx::query(
            "INSERT INTO api_keys (key_id, name, verifier, scopes, created_at, expires_at, owner,
                 tokens_per_hour, tokens_per_day, tokens_per_month, requests_per_day,
                 budget_changed_at, cost_per_day, cost_per_month)
             SELECT $1, $2, $3, $4, $5, $6, $7, $10, $11, $12, $13,
                 CASE WHEN $14::bigint IS NULL THEN NULL
                     ELSE CAST(FLOOR(EXTRACT(EPOCH FROM clock_timestamp()) * 1000) AS BIGINT) END, $15, $16
             WHERE $7::text IS NULL OR (SELECT count(*) FROM api_keys WHERE owner = $7
                 AND revoked_at IS NULL AND (expires_at IS NULL OR expires_at > $8)) < $9",
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
        .bind(hour)
        .bind(day)
        .bind(month)
        .bind(requests)
        .bind(stamped)
        .bind(cost_day)
        .bind(cost_month)
        .execute(&mut *tx)
        .await?;
        tx.commit().await?;
        Ok(done.rows_affected() == 1)
    }

    async fn list_by_owner(&self, owner: &str) -> Result<Vec<KeyRecord>, StoreError> {
        self.ready().await?;
        let rows =
            sqlx::query("SELECT * FROM api_keys WHERE owner = $1 ORDER BY created_at, key_id")
                .bind(owner)
                .fetch_all(&self.pool)
                .await?;
        Ok(records::<Postgres>(&rows)?)
    }

    async fn list(&self) -> Result<Vec<KeyRecord>, StoreError> {
        self.ready().await?;
        let rows = sqlx::query("SELECT * FROM api_keys ORDER BY created_at, key_id")
            .fetch_all(&self.pool)
            .await?;
        Ok(records::<Postgres>(&rows)?)
    }

    async fn revoke(&self, key_id: &str, at: i64) -> Result<bool, StoreError> {
        self.ready().await?;
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

    async fn page(
        &self,
        owner: Option<&str>,
        after: Option<&PageEnd>,
        limit: u32,
    ) -> Result<Vec<KeyRecord>, StoreError> {
        self.ready().await?;
        let sql = page_sql(owner.is_some(), after.is_some(), '$');
        let mut query = sqlx::query(&sql);
        if let Some(owner) = owner {
            query = query.bind(owner);
        }
        if let Some(end) = after {
            query = query.bind(end.created_at).bind(&end.key_id);
        }
        let rows = query.bind(limit as i64).fetch_all(&self.pool).await?;
        Ok(records::<Postgres>(&rows)?)
    }

    async fn purge_revoked(&self, before: i64, batch: u32) -> Result<u64, StoreError> {
        self.ready().await?;
        let done = sqlx::query(&purge_sql('$'))
            .bind(before)
            .bind(batch as i64)
            .execute(&self.pool)
            .await?;
        Ok(done.rows_affected())
    }
}

#[async_trait]
impl LedgerStore for PgStore {
    async fn add_usage(&self, rows: &[UsageRow]) -> Result<(), StoreError> {
        // Nothing to write: no need for the store to be reachable.
        if rows.is_empty() {
            return Ok(());
        }
        self.ready().await?;
        ledger_sql::add(&self.pool, None, rows, '$').await
    }

    async fn add_usage_once(&self, batch: &str, rows: &[UsageRow]) -> Result<(), StoreError> {
        if rows.is_empty() {
            return Ok(());
        }
        self.ready().await?;
        ledger_sql::add(&self.pool, Some(batch), rows, '$').await
    }

    async fn usage(&self, q: &UsageQuery) -> Result<Vec<UsageTotal>, StoreError> {
        self.ready().await?;
        ledger_sql::report(&self.pool, q, true).await
    }

    async fn window_usage(
        &self,
        subject: &Subject,
        starts: WindowStarts,
    ) -> Result<WindowUsage, StoreError> {
        self.ready().await?;
        let (column, id) = window_sql::column_of(subject);
        let mut used =
            window_sql::window_usage(&self.pool, column, Some(&[id]), starts, '$').await?;
        Ok(used.remove(id).unwrap_or_default())
    }

    async fn keys_window_usage(
        &self,
        key_ids: &[String],
        starts: WindowStarts,
    ) -> Result<HashMap<String, WindowUsage>, StoreError> {
        self.ready().await?;
        let ids: Vec<&str> = key_ids.iter().map(String::as_str).collect();
        window_sql::window_usage(&self.pool, "key_id", Some(&ids), starts, '$').await
    }

    async fn all_window_usage(
        &self,
        starts: WindowStarts,
    ) -> Result<Vec<(Subject, WindowUsage)>, StoreError> {
        self.ready().await?;
        window_sql::all_window_usage(&self.pool, starts, '$').await
    }
}

#[async_trait]
impl BudgetStore for PgStore {
    async fn set_key_budget(&self, key_id: &str, budget: &Budget) -> Result<bool, StoreError> {
        self.ready().await?;
        budget_sql::set_key(&self.pool, key_id, budget, '$').await
    }

    async fn owner_budget(&self, owner: &str) -> Result<Option<Budget>, StoreError> {
        self.ready().await?;
        budget_sql::limits_row(&self.pool, ("owner_budgets", "owner"), owner, '$').await
    }

    async fn set_owner_budget(&self, owner: &str, budget: &Budget) -> Result<(), StoreError> {
        self.ready().await?;
        budget_sql::set_limits_row(&self.pool, ("owner_budgets", "owner"), owner, budget, '$').await
    }

    async fn budget_changes(&self, since_ms: i64) -> Result<Vec<BudgetChange>, StoreError> {
        self.ready().await?;
        budget_sql::changes(&self.pool, since_ms, '$').await
    }

    async fn team_budget(&self, team: &str) -> Result<Option<Budget>, StoreError> {
        self.ready().await?;
        budget_sql::limits_row(&self.pool, ("team_budgets", "team"), team, '$').await
    }

    async fn set_team_budget(&self, team: &str, budget: &Budget) -> Result<(), StoreError> {
        self.ready().await?;
        budget_sql::set_limits_row(&self.pool, ("team_budgets", "team"), team, budget, '$').await
    }

    async fn owner_team(&self, owner: &str) -> Result<Option<String>, StoreError> {
        self.ready().await?;
        budget_sql::owner_team(&self.pool, owner, '$').await
    }

    async fn set_owner_team(&self, owner: &str, team: Option<&str>) -> Result<(), StoreError> {
        self.ready().await?;
        budget_sql::set_owner_team(&self.pool, owner, team, '$').await
    }

    async fn team_changes(&self, since_ms: i64) -> Result<Vec<TeamChange>, StoreError> {
        self.ready().await?;
        budget_sql::team_changes(&self.pool, since_ms, '$').await
    }
}
