//! Budgets in the store, the same statements on both databases (`mark`: the dialect's
//! placeholder prefix, `?` or `$`): key limits are columns of `api_keys`, owner and team limits
//! rows of `owner_budgets` and `team_budgets`, owners' teams rows of `owner_teams`, each change
//! stamped in unix milliseconds so gateways can poll for what changed since their last look.

use sqlx::{Pool, Row};

use super::sql_bounds::with_sql_bounds;
use super::{Budget, BudgetChange, StoreError, Subject, TeamChange};

/// The limit columns, in `Budget::NAMES` order (the names are the column names).
const LIMITS: &str =
    "tokens_per_hour, tokens_per_day, tokens_per_month, requests_per_day, cost_per_day, \
     cost_per_month";

/// `SET tokens_per_hour = excluded.tokens_per_hour, …` for an upsert of a limits row.
fn limits_from_excluded() -> String {
    let sets: Vec<String> = (Budget::NAMES.iter())
        .map(|n| format!("{n} = excluded.{n}"))
        .collect();
    sets.join(", ")
}

/// The limits as stored: BIGINT, so at most `i64::MAX` each (the CLI and the API refuse more).
pub(super) fn columns(b: &Budget) -> Result<[Option<i64>; Budget::N], StoreError> {
    let mut out = [None; Budget::N];
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
        let mut limits = [None; Budget::N];
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
        let sets: Vec<String> = (Budget::NAMES.iter().enumerate())
            .map(|(i, n)| format!("{n} = {mark}{}", i + 2))
            .collect();
        let sql = format!(
            "UPDATE api_keys SET {sets}, budget_changed_at = {now} \
             WHERE key_id = {mark}1 RETURNING key_id",
            sets = sets.join(", "),
            now = store_now_ms(mark)
        );
        let mut query = sqlx::query(&sql).bind(key_id);
        for limit in columns(budget)? {
            query = query.bind(limit);
        }
        Ok(query.fetch_optional(pool).await?.is_some())
    }

    /// `BudgetStore::owner_budget` and `team_budget` (`table`: `owner_budgets` or
    /// `team_budgets`, keyed by `column`): none for a subject never given one or whose budget
    /// was cleared.
    pub(super) async fn limits_row<DB>(
        pool: &Pool<DB>,
        (table, column): (&str, &str),
        id: &str,
        mark: char,
    ) -> Result<Option<Budget>, StoreError> {
        let sql = format!("SELECT {LIMITS} FROM {table} WHERE {column} = {mark}1");
        let row = sqlx::query(&sql).bind(id).fetch_optional(pool).await?;
        let budget = row.as_ref().map(budget_of::<DB>).transpose()?;
        Ok(budget.filter(|b| !b.is_empty()))
    }

    /// `BudgetStore::set_owner_budget` and `set_team_budget`: an upsert; a cleared budget keeps
    /// its row (every limit NULL) with the new stamp, so pollers see the clear.
    pub(super) async fn set_limits_row<DB>(
        pool: &Pool<DB>,
        (table, column): (&str, &str),
        id: &str,
        budget: &Budget,
        mark: char,
    ) -> Result<(), StoreError> {
        let marks: Vec<String> = (2..=Budget::N + 1).map(|i| format!("{mark}{i}")).collect();
        let sql = format!(
            "INSERT INTO {table} ({column}, {LIMITS}, changed_at) \
             VALUES ({mark}1, {marks}, {now}) \
             ON CONFLICT ({column}) DO UPDATE SET {sets}, changed_at = excluded.changed_at",
            marks = marks.join(", "),
            sets = limits_from_excluded(),
            now = store_now_ms(mark)
        );
        let mut query = sqlx::query(&sql).bind(id);
        for limit in columns(budget)? {
            query = query.bind(limit);
        }
        query.execute(pool).await?;
        Ok(())
    }

    /// `BudgetStore::owner_team`.
    pub(super) async fn owner_team<DB>(
        pool: &Pool<DB>,
        owner: &str,
        mark: char,
    ) -> Result<Option<String>, StoreError> {
        let sql = format!("SELECT team FROM owner_teams WHERE owner = {mark}1");
        let row = sqlx::query(&sql).bind(owner).fetch_optional(pool).await?;
        Ok(match row {
            Some(row) => row.try_get::<Option<String>, _>("team")?,
            None => None,
        })
    }

    /// `BudgetStore::set_owner_team`: an upsert; leaving a team keeps the row (team NULL) with
    /// the new stamp, so pollers see it.
    pub(super) async fn set_owner_team<DB>(
        pool: &Pool<DB>,
        owner: &str,
        team: Option<&str>,
        mark: char,
    ) -> Result<(), StoreError> {
        let sql = format!(
            "INSERT INTO owner_teams (owner, team, changed_at) VALUES ({mark}1, {mark}2, {now}) \
             ON CONFLICT (owner) DO UPDATE SET team = excluded.team, \
             changed_at = excluded.changed_at",
            now = store_now_ms(mark)
        );
        sqlx::query(&sql)
            .bind(owner)
            .bind(team)
            .execute(pool)
            .await?;
        Ok(())
    }

    /// `BudgetStore::team_changes`, read through the stamp's index.
    pub(super) async fn team_changes<DB>(
        pool: &Pool<DB>,
        since_ms: i64,
        mark: char,
    ) -> Result<Vec<TeamChange>, StoreError> {
        let sql =
            format!("SELECT owner, team, changed_at FROM owner_teams WHERE changed_at >= {mark}1");
        let rows = sqlx::query(&sql).bind(since_ms).fetch_all(pool).await?;
        let mut out = Vec::with_capacity(rows.len());
        for row in &rows {
            out.push(TeamChange {
                owner: row.try_get("owner")?,
                team: row.try_get("team")?,
                changed_at_ms: row.try_get("changed_at")?,
            });
        }
        Ok(out)
    }

    /// `BudgetStore::budget_changes`: keys, owners then teams, each read through its stamp's
    /// index.
    pub(super) async fn changes<DB>(
        pool: &Pool<DB>,
        since_ms: i64,
        mark: char,
    ) -> Result<Vec<BudgetChange>, StoreError> {
        let mut out = Vec::new();
        // (table, id column, stamp column, whose budget).
        type Source = (
            &'static str,
            &'static str,
            &'static str,
            fn(String) -> Subject,
        );
        let sources: [Source; 3] = [
            ("api_keys", "key_id", "budget_changed_at", Subject::Key),
            ("owner_budgets", "owner", "changed_at", Subject::Owner),
            ("team_budgets", "team", "changed_at", Subject::Team),
        ];
        for (table, column, stamp, subject) in sources {
            let sql = format!(
                "SELECT {column} AS subject, {LIMITS}, {stamp} AS changed_at \
                 FROM {table} WHERE {stamp} >= {mark}1"
            );
            let rows = sqlx::query(&sql).bind(since_ms).fetch_all(pool).await?;
            for row in &rows {
                out.push(BudgetChange {
                    subject: subject(row.try_get("subject")?),
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

/// Step 7 of the shared migrations on SQLite (one column per `ALTER TABLE`): cost limits on keys
/// and owners, team budgets and owners' teams.
pub(super) const MIGRATION_TEAMS_SQLITE: &str = "
    ALTER TABLE api_keys ADD COLUMN cost_per_day BIGINT;
    ALTER TABLE api_keys ADD COLUMN cost_per_month BIGINT;
    ALTER TABLE owner_budgets ADD COLUMN cost_per_day BIGINT;
    ALTER TABLE owner_budgets ADD COLUMN cost_per_month BIGINT;
    CREATE TABLE IF NOT EXISTS team_budgets (
        team             TEXT PRIMARY KEY,
        tokens_per_hour  BIGINT,
        tokens_per_day   BIGINT,
        tokens_per_month BIGINT,
        requests_per_day BIGINT,
        cost_per_day     BIGINT,
        cost_per_month   BIGINT,
        changed_at       BIGINT NOT NULL
    );
    CREATE INDEX IF NOT EXISTS team_budgets_changed ON team_budgets (changed_at);
    CREATE TABLE IF NOT EXISTS owner_teams (
        owner      TEXT PRIMARY KEY,
        team       TEXT,
        changed_at BIGINT NOT NULL
    );
    CREATE INDEX IF NOT EXISTS owner_teams_changed ON owner_teams (changed_at);
    CREATE INDEX IF NOT EXISTS owner_teams_team ON owner_teams (team);";

/// Step 7 on Postgres: the same, with `IF NOT EXISTS` on the columns too.
pub(super) const MIGRATION_TEAMS_POSTGRES: &str = "
    ALTER TABLE api_keys ADD COLUMN IF NOT EXISTS cost_per_day BIGINT,
        ADD COLUMN IF NOT EXISTS cost_per_month BIGINT;
    ALTER TABLE owner_budgets ADD COLUMN IF NOT EXISTS cost_per_day BIGINT,
        ADD COLUMN IF NOT EXISTS cost_per_month BIGINT;
    CREATE TABLE IF NOT EXISTS team_budgets (
        team             TEXT PRIMARY KEY,
        tokens_per_hour  BIGINT,
        tokens_per_day   BIGINT,
        tokens_per_month BIGINT,
        requests_per_day BIGINT,
        cost_per_day     BIGINT,
        cost_per_month   BIGINT,
        changed_at       BIGINT NOT NULL
    );
    CREATE INDEX IF NOT EXISTS team_budgets_changed ON team_budgets (changed_at);
    CREATE TABLE IF NOT EXISTS owner_teams (
        owner      TEXT PRIMARY KEY,
        team       TEXT,
        changed_at BIGINT NOT NULL
    );
    CREATE INDEX IF NOT EXISTS owner_teams_changed ON owner_teams (changed_at);
    CREATE INDEX IF NOT EXISTS owner_teams_team ON owner_teams (team);";
