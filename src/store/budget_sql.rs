//! Budgets in the store, the same statements on both databases (`mark`: the dialect's
//! placeholder prefix, `?` or `$`): key limits are columns of `api_keys`, owner limits rows of
//! `owner_budgets`, each change stamped in unix milliseconds so gateways can poll for what
//! changed since their last look.

use sqlx::{Pool, Row};

use super::sql_bounds::with_sql_bounds;
use super::{Budget, BudgetChange, StoreError, Subject};

/// The limit columns, in `Budget::NAMES` order (the names are the column names).
const LIMITS: &str = "tokens_per_hour, tokens_per_day, tokens_per_month, requests_per_day";

/// The limits as stored: BIGINT, so at most `i64::MAX` each (the CLI and the API refuse more).
pub(super) fn columns(b: &Budget) -> Result<[Option<i64>; 4], StoreError> {
    let mut out = [None; 4];
    for (i, (limit, name)) in b.limits().into_iter().zip(Budget::NAMES).enumerate() {
        out[i] = limit
            .map(|n| i64::try_from(n).map_err(|_| format!("{name} is over {}", i64::MAX)))
            .transpose()?;
    }
    Ok(out)
}

/// Now in unix milliseconds, on the store's own clock: a change's stamp, so a writer whose
/// clock lags (a CLI on another host) is never stamped in the pollers' past.
pub(super) fn store_now_ms(mark: char) -> &'static str {
    match mark {
        '$' => "CAST(FLOOR(EXTRACT(EPOCH FROM clock_timestamp()) * 1000) AS BIGINT)",
        _ => "CAST(ROUND((julianday('now') - 2440587.5) * 86400000) AS INTEGER)",
    }
}

with_sql_bounds!(
    /// The limits of a row of `api_keys` or `owner_budgets`, on either database.
    pub(super) fn budget_of<DB>(row: &DB::Row) -> Result<Budget, sqlx::Error> {
        let mut limits = [None; 4];
        for (limit, name) in limits.iter_mut().zip(Budget::NAMES) {
            let value: Option<i64> = row.try_get(name)?;
            *limit = value.map(|n| n.max(0) as u64);
        }
        Ok(Budget::from_limits(limits))
    }

    /// `BudgetStore::set_key_budget`: the limits and the stamp, in one statement.
    pub(super) async fn set_key<DB>(
        pool: &Pool<DB>,
        key_id: &str,
        budget: &Budget,
        mark: char,
    ) -> Result<bool, StoreError> {
        let [hour, day, month, requests] = columns(budget)?;
        let sql = format!(
            "UPDATE api_keys SET tokens_per_hour = {mark}2, tokens_per_day = {mark}3, \
             tokens_per_month = {mark}4, requests_per_day = {mark}5, budget_changed_at = {now} \
             WHERE key_id = {mark}1 RETURNING key_id",
            now = store_now_ms(mark)
        );
        let found = sqlx::query(&sql)
            .bind(key_id)
            .bind(hour)
            .bind(day)
            .bind(month)
            .bind(requests)
            .fetch_optional(pool)
            .await?;
        Ok(found.is_some())
    }

    /// `BudgetStore::owner_budget`: none for an owner never given one or whose budget was cleared.
    pub(super) async fn owner_budget<DB>(
        pool: &Pool<DB>,
        owner: &str,
        mark: char,
    ) -> Result<Option<Budget>, StoreError> {
        let sql = format!("SELECT {LIMITS} FROM owner_budgets WHERE owner = {mark}1");
        let row = sqlx::query(&sql).bind(owner).fetch_optional(pool).await?;
        let budget = row.as_ref().map(budget_of::<DB>).transpose()?;
        Ok(budget.filter(|b| !b.is_empty()))
    }

    /// `BudgetStore::set_owner_budget`: an upsert; a cleared budget keeps its row (every limit
    /// NULL) with the new stamp, so pollers see the clear.
    pub(super) async fn set_owner<DB>(
        pool: &Pool<DB>,
        owner: &str,
        budget: &Budget,
        mark: char,
    ) -> Result<(), StoreError> {
        let [hour, day, month, requests] = columns(budget)?;
        let sql = format!(
            "INSERT INTO owner_budgets (owner, {LIMITS}, changed_at) \
             VALUES ({mark}1, {mark}2, {mark}3, {mark}4, {mark}5, {now}) \
             ON CONFLICT (owner) DO UPDATE SET tokens_per_hour = excluded.tokens_per_hour, \
             tokens_per_day = excluded.tokens_per_day, \
             tokens_per_month = excluded.tokens_per_month, \
             requests_per_day = excluded.requests_per_day, changed_at = excluded.changed_at",
            now = store_now_ms(mark)
        );
        sqlx::query(&sql)
            .bind(owner)
            .bind(hour)
            .bind(day)
            .bind(month)
            .bind(requests)
            .execute(pool)
            .await?;
        Ok(())
    }

    /// `BudgetStore::budget_changes`: keys then owners, each read through its stamp's index.
    pub(super) async fn changes<DB>(
        pool: &Pool<DB>,
        since_ms: i64,
        mark: char,
    ) -> Result<Vec<BudgetChange>, StoreError> {
        let mut out = Vec::new();
        for (sql, key) in [
            (
                format!(
                    "SELECT key_id AS subject, {LIMITS}, budget_changed_at AS changed_at \
                     FROM api_keys WHERE budget_changed_at >= {mark}1"
                ),
                true,
            ),
            (
                format!(
                    "SELECT owner AS subject, {LIMITS}, changed_at \
                     FROM owner_budgets WHERE changed_at >= {mark}1"
                ),
                false,
            ),
        ] {
            let rows = sqlx::query(&sql).bind(since_ms).fetch_all(pool).await?;
            for row in &rows {
                let subject: String = row.try_get("subject")?;
                out.push(BudgetChange {
                    subject: if key {
                        Subject::Key(subject)
                    } else {
                        Subject::Owner(subject)
                    },
                    budget: budget_of::<DB>(row)?,
                    changed_at_ms: row.try_get("changed_at")?,
                });
            }
        }
        Ok(out)
    }
);

/// Step 5 of the shared migrations on SQLite (one column per `ALTER TABLE`): the key limits and
/// their stamp, the owner budgets, and the index a key's days are summed through.
pub(super) const MIGRATION_SQLITE: &str = "
    ALTER TABLE api_keys ADD COLUMN tokens_per_hour BIGINT;
    ALTER TABLE api_keys ADD COLUMN tokens_per_day BIGINT;
    ALTER TABLE api_keys ADD COLUMN tokens_per_month BIGINT;
    ALTER TABLE api_keys ADD COLUMN requests_per_day BIGINT;
    ALTER TABLE api_keys ADD COLUMN budget_changed_at BIGINT;
    CREATE INDEX IF NOT EXISTS api_keys_budget_changed ON api_keys (budget_changed_at)
        WHERE budget_changed_at IS NOT NULL;
    CREATE TABLE IF NOT EXISTS owner_budgets (
        owner            TEXT PRIMARY KEY,
        tokens_per_hour  BIGINT,
        tokens_per_day   BIGINT,
        tokens_per_month BIGINT,
        requests_per_day BIGINT,
        changed_at       BIGINT NOT NULL
    );
    CREATE INDEX IF NOT EXISTS owner_budgets_changed ON owner_budgets (changed_at);
    CREATE INDEX IF NOT EXISTS usage_daily_key ON usage_daily (key_id, day);";

/// Step 5 on Postgres: the same, with `IF NOT EXISTS` on the columns too.
pub(super) const MIGRATION_POSTGRES: &str = "
    ALTER TABLE api_keys ADD COLUMN IF NOT EXISTS tokens_per_hour BIGINT,
        ADD COLUMN IF NOT EXISTS tokens_per_day BIGINT,
        ADD COLUMN IF NOT EXISTS tokens_per_month BIGINT,
        ADD COLUMN IF NOT EXISTS requests_per_day BIGINT,
        ADD COLUMN IF NOT EXISTS budget_changed_at BIGINT;
    CREATE INDEX IF NOT EXISTS api_keys_budget_changed ON api_keys (budget_changed_at)
        WHERE budget_changed_at IS NOT NULL;
    CREATE TABLE IF NOT EXISTS owner_budgets (
        owner            TEXT PRIMARY KEY,
        tokens_per_hour  BIGINT,
        tokens_per_day   BIGINT,
        tokens_per_month BIGINT,
        requests_per_day BIGINT,
        changed_at       BIGINT NOT NULL
    );
    CREATE INDEX IF NOT EXISTS owner_budgets_changed ON owner_budgets (changed_at);
    CREATE INDEX IF NOT EXISTS usage_daily_key ON usage_daily (key_id, day);";
