//! The ledger's sums over the current hour, day and month, per key or per owner, that seed the
//! budget counters: the same statements on both databases (`mark`: the dialect's placeholder
//! prefix, `?` or `$`), grouped so that any number of subjects costs a few statements.

use std::collections::HashMap;

use sqlx::{Pool, Row};

use super::sql_bounds::with_sql_bounds;
use super::{StoreError, Subject, WindowStarts, WindowUsage};

/// Subjects per `IN (…)` list: far under either database's limit on bound parameters.
const CHUNK: usize = 500;

/// The ledger column a subject's usage is under, and its value there.
pub(super) fn column_of(subject: &Subject) -> (&'static str, &str) {
    match subject {
        Subject::Key(key_id) => ("key_id", key_id),
        Subject::Owner(owner) => ("owner", owner),
        Subject::Team(team) => ("team", team),
    }
}

/// Which subjects a window statement sums: those named (a key listing's page, one subject), or
/// every one but the ledger's `''` (no key, no owner).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Which {
    Named(usize),
    All,
}

/// The ledger's sums per subject (`column`: `key_id` or `owner`) in the current windows, two
/// grouped statements: the hour's tokens from `usage_hourly`, and from `usage_daily` the day's
/// tokens and requests and the month's tokens (the current day is one of the month's). Both
/// filter on the subject's leading index column (`usage_hourly_key`/`_owner`,
/// `usage_daily_key`/`_owner`). Parameters: the hour's start (hourly), or the day's and the
/// month's starts (daily), then the subjects. Sums are cast
/// back to 64 bits (Postgres widens a bigint sum to numeric).
pub(super) fn window_sql(column: &str, which: Which, mark: char) -> [String; 2] {
    // The subjects' parameters follow the statement's own (`first`: the first subject's number).
    let filter = |first: usize| match which {
        Which::All => format!("{column} <> ''"),
        Which::Named(n) => {
            let marks: Vec<String> = (first..first + n).map(|i| format!("{mark}{i}")).collect();
            format!("{column} IN ({})", marks.join(", "))
        }
    };
    let tokens = "prompt_tokens + completion_tokens";
    [
        format!(
            "SELECT {column}, CAST(SUM({tokens}) AS BIGINT) FROM usage_hourly \
             WHERE hour = {mark}1 AND {filter} GROUP BY {column}",
            filter = filter(2)
        ),
        format!(
            "SELECT {column}, \
             CAST(SUM(CASE WHEN day = {mark}1 THEN {tokens} ELSE 0 END) AS BIGINT), \
             CAST(SUM(CASE WHEN day = {mark}1 THEN requests ELSE 0 END) AS BIGINT), \
             CAST(SUM({tokens}) AS BIGINT), \
             CAST(SUM(CASE WHEN day = {mark}1 THEN cost_micros ELSE 0 END) AS BIGINT), \
             CAST(SUM(cost_micros) AS BIGINT) FROM usage_daily \
             WHERE day >= {mark}2 AND {filter} GROUP BY {column}",
            filter = filter(3)
        ),
    ]
}

with_sql_bounds!(
    /// The current windows' sums of the subjects in `ids` (every subject with `Which::All` and no
    /// ids), by `column`, read in one transaction (a snapshot on both databases, so a flush landing
    /// between the statements is seen by both or neither). Subjects without usage in the month are
    /// left out.
    pub(super) async fn window_usage<DB>(
        pool: &Pool<DB>,
        column: &str,
        ids: Option<&[&str]>,
        starts: WindowStarts,
        mark: char,
    ) -> Result<HashMap<String, WindowUsage>, StoreError> {
        let mut out: HashMap<String, WindowUsage> = HashMap::new();
        let chunks: Vec<Option<&[&str]>> = match ids {
            None => vec![None],
            Some([]) => return Ok(out),
            Some(ids) => ids.chunks(CHUNK).map(Some).collect(),
        };
        let count = |n: i64| n.max(0) as u64;
        let mut tx = pool.begin().await?;
        if mark == '$' {
            sqlx::query("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ, READ ONLY")
                .execute(&mut *tx)
                .await?;
        }
        for chunk in chunks {
            let which = chunk.map_or(Which::All, |c| Which::Named(c.len()));
            let [hourly, daily] = window_sql(column, which, mark);
            let mut days = sqlx::query(&daily).bind(starts.day).bind(starts.month);
            let mut hours = sqlx::query(&hourly).bind(starts.hour);
            for id in chunk.unwrap_or_default() {
                days = days.bind(*id);
                hours = hours.bind(*id);
            }
            for row in days.fetch_all(&mut *tx).await? {
                let used = out.entry(row.try_get(0)?).or_default();
                used.day_tokens = count(row.try_get(1)?);
                used.day_requests = count(row.try_get(2)?);
                used.month_tokens = count(row.try_get(3)?);
                used.day_cost = count(row.try_get(4)?);
                used.month_cost = count(row.try_get(5)?);
            }
            for row in hours.fetch_all(&mut *tx).await? {
                out.entry(row.try_get(0)?).or_default().hour_tokens = count(row.try_get(1)?);
            }
        }
        tx.commit().await?;
        Ok(out)
    }

    /// `LedgerStore::all_window_usage`: every key, owner and team, six grouped statements in
    /// all.
    pub(super) async fn all_window_usage<DB>(
        pool: &Pool<DB>,
        starts: WindowStarts,
        mark: char,
    ) -> Result<Vec<(Subject, WindowUsage)>, StoreError> {
        let keys = window_usage(pool, "key_id", None, starts, mark).await?;
        let owners = window_usage(pool, "owner", None, starts, mark).await?;
        let teams = window_usage(pool, "team", None, starts, mark).await?;
        let mut out: Vec<(Subject, WindowUsage)> = keys
            .into_iter()
            .map(|(k, u)| (Subject::Key(k), u))
            .chain(owners.into_iter().map(|(o, u)| (Subject::Owner(o), u)))
            .chain(teams.into_iter().map(|(t, u)| (Subject::Team(t), u)))
            .collect();
        out.sort_by(|a, b| a.0.cmp(&b.0));
        Ok(out)
    }
);
