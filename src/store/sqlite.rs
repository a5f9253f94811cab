//! The one-host key store: a SQLite file, opened private to the gateway's user.

use std::collections::HashMap;
use std::fs::OpenOptions;
use std::io;
use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
use std::path::Path;
use std::str::FromStr;
use std::time::Duration;

use async_trait::async_trait;
use sqlx::sqlite::{SqliteConnectOptions, SqliteJournalMode, SqlitePool, SqlitePoolOptions};
use sqlx::Sqlite;

use super::key_sql::{page_sql, purge_sql, records, stored};
use super::migrations::{newer_than_known, MIGRATIONS, MIGRATIONS_TABLE};
use super::{budget_sql, ledger_sql, window_sql};
use super::{
    Budget, BudgetChange, BudgetStore, KeyRecord, KeyStore, LedgerStore, PageEnd, StoreError,
    StoredKey, Subject, TeamChange, UsageQuery, UsageRow, UsageTotal, WindowStarts, WindowUsage,
};

/// Brings a database to the current schema inside one `BEGIN IMMEDIATE` transaction, so two
/// processes opening the same new or old file at once take turns and apply each step once.
async fn migrate(conn: &mut sqlx::SqliteConnection) -> Result<(), StoreError> {
    sqlx::raw_sql("BEGIN IMMEDIATE").execute(&mut *conn).await?;
    let result = async {
        sqlx::query(MIGRATIONS_TABLE).execute(&mut *conn).await?;
        let mut applied: Vec<i64> = sqlx::query_scalar("SELECT version FROM portcullis_migrations")
            .fetch_all(&mut *conn)
            .await?;
        if applied.is_empty() {
            applied = adopt_user_version(conn).await?;
        }
        for m in MIGRATIONS.iter().filter(|m| !applied.contains(&m.version)) {
            sqlx::raw_sql(m.sqlite).execute(&mut *conn).await?;
            sqlx::query("INSERT INTO portcullis_migrations (version, applied_at) VALUES (?1, ?2)")
                .bind(m.version)
                .bind(crate::time::unix_now())
                .execute(&mut *conn)
                .await?;
            // Kept in step for binaries older than the shared list, which read `user_version`
            // as the number of steps after the table: a downgrade then finds what it expects.
            // PRAGMA takes no bound parameters; the number is ours.
            sqlx::raw_sql(&format!("PRAGMA user_version = {}", m.version - 1))
                .execute(&mut *conn)
                .await?;
            log::info!("key store: applied schema migration {}", m.version);
        }
        if let Some(newer) = newer_than_known(&applied) {
            log::warn!("key store schema is at version {newer}, newer than this binary knows");
        }
        Ok::<(), StoreError>(())
    }
    .await;
    let end = if result.is_ok() { "COMMIT" } else { "ROLLBACK" };
    sqlx::raw_sql(end).execute(&mut *conn).await?;
    result
}

/// A file made before `portcullis_migrations` existed counted its steps in `user_version`:
/// 0 for the first table, 1 once it had owners. Those are steps 1 and 2 of the shared list;
/// they are recorded as applied so the file keeps its keys and takes only what it lacks.
async fn adopt_user_version(conn: &mut sqlx::SqliteConnection) -> Result<Vec<i64>, StoreError> {
    let has_table: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM sqlite_master WHERE type = 'table' AND name = 'api_keys'",
    )
    .fetch_one(&mut *conn)
    .await?;
    if has_table == 0 {
        return Ok(Vec::new());
    }
    let user_version: i64 = sqlx::query_scalar("PRAGMA user_version")
        .fetch_one(&mut *conn)
        .await?;
    let adopted: Vec<i64> = (1..=user_version.clamp(0, 1) + 1).collect();
    for &version in &adopted {
        sqlx::query("INSERT INTO portcullis_migrations (version, applied_at) VALUES (?1, ?2)")
            .bind(version)
            .bind(crate::time::unix_now())
            .execute(&mut *conn)
            .await?;
    }
    Ok(adopted)
}

pub(crate) struct SqliteStore {
    pool: SqlitePool,
}

impl SqliteStore {
    /// Opens (creating file and schema on first use) and checks the database now, so a bad
    /// path fails at start-up. The pool itself connects lazily on the runtime that uses it.
    pub(crate) async fn open(url: &str) -> Result<SqliteStore, StoreError> {
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

#[async_trait]
impl KeyStore for SqliteStore {
    async fn find(&self, key_id: &str) -> Result<Option<StoredKey>, StoreError> {
        let row = sqlx::query("SELECT * FROM api_keys WHERE key_id = ?1")
            .bind(key_id)
            .fetch_optional(&self.pool)
            .await?;
        row.as_ref().map(stored::<Sqlite>).transpose()
    }

    async fn insert(&self, key: &StoredKey) -> Result<(), StoreError> {
        // Uncapped: the one insert statement, with a count that can never reach the cap.
        self.insert_capped(key, u32::MAX, 0).await.map(|_| ())
    }

    async fn insert_capped(&self, key: &StoredKey, cap: u32, now: i64) -> Result<bool, StoreError> {
        let r = &key.record;
        let [hour, day, month, requests, cost_day, cost_month] = budget_sql::columns(&r.budget)?;
        // Stamped on the store's clock when the key has a budget (?14/$14: whether it has).
        let stamped = (!r.budget.is_empty()).then_some(1i64);
        // One statement: SQLite holds the write lock from the count to the insert.
        let done = sqlx::query(
            "INSERT INTO api_keys (key_id, name, verifier, scopes, created_at, expires_at, owner,
                 tokens_per_hour, tokens_per_day, tokens_per_month, requests_per_day,
                 budget_changed_at, cost_per_day, cost_per_month)
             SELECT ?1, ?2, ?3, ?4, ?5, ?6, ?7, ?10, ?11, ?12, ?13,
                 CASE WHEN ?14 IS NULL THEN NULL ELSE CAST(ROUND((julianday('now') - 2440587.5) * 86400000) AS INTEGER) END, ?15, ?16
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
        .bind(hour)
        .bind(day)
        .bind(month)
        .bind(requests)
        .bind(stamped)
        .bind(cost_day)
        .bind(cost_month)
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
        Ok(records::<Sqlite>(&rows)?)
    }

    async fn list(&self) -> Result<Vec<KeyRecord>, StoreError> {
        let rows = sqlx::query("SELECT * FROM api_keys ORDER BY created_at, key_id")
            .fetch_all(&self.pool)
            .await?;
        Ok(records::<Sqlite>(&rows)?)
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

    async fn page(
        &self,
        owner: Option<&str>,
        after: Option<&PageEnd>,
        limit: u32,
    ) -> Result<Vec<KeyRecord>, StoreError> {
        let sql = page_sql(owner.is_some(), after.is_some(), '?');
        let mut query = sqlx::query(&sql);
        if let Some(owner) = owner {
            query = query.bind(owner);
        }
        if let Some(end) = after {
            query = query.bind(end.created_at).bind(&end.key_id);
        }
        let rows = query.bind(limit as i64).fetch_all(&self.pool).await?;
        Ok(records::<Sqlite>(&rows)?)
    }

    async fn purge_revoked(&self, before: i64, batch: u32) -> Result<u64, StoreError> {
        let done = sqlx::query(&purge_sql('?'))
            .bind(before)
            .bind(batch as i64)
            .execute(&self.pool)
            .await?;
        Ok(done.rows_affected())
    }
}

#[async_trait]
impl LedgerStore for SqliteStore {
    async fn add_usage(&self, rows: &[UsageRow]) -> Result<(), StoreError> {
        ledger_sql::add(&self.pool, None, rows, '?').await
    }

    async fn add_usage_once(&self, batch: &str, rows: &[UsageRow]) -> Result<(), StoreError> {
        ledger_sql::add(&self.pool, Some(batch), rows, '?').await
    }

    async fn usage(&self, q: &UsageQuery) -> Result<Vec<UsageTotal>, StoreError> {
        ledger_sql::report(&self.pool, q, false).await
    }

    async fn window_usage(
        &self,
        subject: &Subject,
        starts: WindowStarts,
    ) -> Result<WindowUsage, StoreError> {
        let (column, id) = window_sql::column_of(subject);
        let mut used =
            window_sql::window_usage(&self.pool, column, Some(&[id]), starts, '?').await?;
        Ok(used.remove(id).unwrap_or_default())
    }

    async fn keys_window_usage(
        &self,
        key_ids: &[String],
        starts: WindowStarts,
    ) -> Result<HashMap<String, WindowUsage>, StoreError> {
        let ids: Vec<&str> = key_ids.iter().map(String::as_str).collect();
        window_sql::window_usage(&self.pool, "key_id", Some(&ids), starts, '?').await
    }

    async fn all_window_usage(
        &self,
        starts: WindowStarts,
    ) -> Result<Vec<(Subject, WindowUsage)>, StoreError> {
        window_sql::all_window_usage(&self.pool, starts, '?').await
    }
}

#[async_trait]
impl BudgetStore for SqliteStore {
    async fn set_key_budget(&self, key_id: &str, budget: &Budget) -> Result<bool, StoreError> {
        budget_sql::set_key(&self.pool, key_id, budget, '?').await
    }

    async fn owner_budget(&self, owner: &str) -> Result<Option<Budget>, StoreError> {
        budget_sql::limits_row(&self.pool, ("owner_budgets", "owner"), owner, '?').await
    }

    async fn set_owner_budget(&self, owner: &str, budget: &Budget) -> Result<(), StoreError> {
        budget_sql::set_limits_row(&self.pool, ("owner_budgets", "owner"), owner, budget, '?').await
    }

    async fn budget_changes(&self, since_ms: i64) -> Result<Vec<BudgetChange>, StoreError> {
        budget_sql::changes(&self.pool, since_ms, '?').await
    }

    async fn team_budget(&self, team: &str) -> Result<Option<Budget>, StoreError> {
        budget_sql::limits_row(&self.pool, ("team_budgets", "team"), team, '?').await
    }

    async fn set_team_budget(&self, team: &str, budget: &Budget) -> Result<(), StoreError> {
        budget_sql::set_limits_row(&self.pool, ("team_budgets", "team"), team, budget, '?').await
    }

    async fn owner_team(&self, owner: &str) -> Result<Option<String>, StoreError> {
        budget_sql::owner_team(&self.pool, owner, '?').await
    }

    async fn set_owner_team(&self, owner: &str, team: Option<&str>) -> Result<(), StoreError> {
        budget_sql::set_owner_team(&self.pool, owner, team, '?').await
    }

    async fn team_changes(&self, since_ms: i64) -> Result<Vec<TeamChange>, StoreError> {
        budget_sql::team_changes(&self.pool, since_ms, '?').await
    }
}
