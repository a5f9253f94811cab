//! The usage ledger's statements, shared by both stores: rows added to `usage_hourly` and its
//! rollup `usage_daily` in one transaction per flush, and reports read from the rollup.

use sqlx::Pool;

use super::sql_bounds::with_sql_bounds;
use super::{Grouping, StoreError, UsageCounts, UsageQuery, UsageRow, UsageTotal};

/// Rows per `INSERT` statement: far under either database's limit on bound parameters
/// (`PARAMS` per row), and few statements per flush.
pub(super) const CHUNK: usize = 500;

const DAY: i64 = 86_400;

/// Bound parameters per row: the time, five texts and the counts.
const PARAMS: usize = 6 + COUNT_COLUMNS.len();

impl UsageCounts {
    /// In column order; the databases store signed 64 bits, which no real count reaches.
    fn columns(&self) -> [i64; COUNT_COLUMNS.len()] {
        [
            self.requests,
            self.prompt_tokens,
            self.completion_tokens,
            self.reasoning_tokens,
            self.cached_tokens,
            self.estimated_requests,
            self.cost_micros,
            self.priced_requests,
            self.unpriced_requests,
        ]
        .map(|n| i64::try_from(n).unwrap_or(i64::MAX))
    }
}

impl UsageRow {
    fn key(&self) -> (i64, &str, &str, &str, &str, &str) {
        (
            self.hour,
            &self.key_id,
            &self.owner,
            &self.service,
            &self.model,
            &self.team,
        )
    }

    /// The texts (the key's four, then the team) and the counts, as bound after the time.
    pub(super) fn values(&self) -> ([&str; 5], [i64; COUNT_COLUMNS.len()]) {
        (
            [
                &self.key_id,
                &self.owner,
                &self.service,
                &self.model,
                &self.team,
            ],
            self.counts.columns(),
        )
    }
}

/// How long a written batch id is remembered: far longer than any retry of its write.
const BATCHES_KEPT_SECONDS: i64 = 86_400;

with_sql_bounds!(
    /// Adds `rows` to both tables in one transaction, on either database (`mark`: its placeholder
    /// prefix); with `batch`, only if that batch was not written before (its id is recorded in
    /// the same transaction, so a commit that succeeded but was reported failed is not repeated).
    pub(super) async fn add<DB>(
        pool: &Pool<DB>,
        batch: Option<&str>,
        rows: &[UsageRow],
        mark: char,
    ) -> Result<(), StoreError> {
        if rows.is_empty() {
            return Ok(());
        }
        let (hourly, daily) = (sorted(rows), daily(rows));
        let mut tx = pool.begin().await?;
        if let Some(batch) = batch {
            let now = crate::time::unix_now();
            let sql = format!(
                "INSERT INTO usage_batches (batch_id, written_at) VALUES ({mark}1, {mark}2) \
                 ON CONFLICT (batch_id) DO NOTHING RETURNING written_at"
            );
            let query = sqlx::query(&sql).bind(batch).bind(now);
            if query.fetch_optional(&mut *tx).await?.is_none() {
                // Written before: this is a retry of a write that did commit.
                return Ok(());
            }
            let sql = format!("DELETE FROM usage_batches WHERE written_at < {mark}1");
            let cutoff = now - BATCHES_KEPT_SECONDS;
            sqlx::query(&sql).bind(cutoff).execute(&mut *tx).await?;
        }
        for (table, rows) in [(Table::Hourly, &hourly), (Table::Daily, &daily)] {
            for chunk in rows.chunks(CHUNK) {
                let sql = add_sql(table, chunk.len(), mark);
                let mut query = sqlx::query(&sql);
                for row in chunk {
                    let (texts, counts) = row.values();
                    query = query.bind(row.hour);
                    for text in texts {
                        query = query.bind(text);
                    }
                    for count in counts {
                        query = query.bind(count);
                    }
                }
                query.execute(&mut *tx).await?;
            }
        }
        tx.commit().await?;
        Ok(())
    }

    /// A report from the rollup, on either database (`postgres`: its dialect).
    pub(super) async fn report<DB>(
        pool: &Pool<DB>,
        q: &UsageQuery,
        postgres: bool,
    ) -> Result<Vec<UsageTotal>, StoreError> {
        let sql = usage_sql(q, postgres);
        let mut query = sqlx::query_scalar::<_, String>(&sql)
            .bind(q.from_day)
            .bind(q.to_day);
        for filter in [&q.owner, &q.team].into_iter().flatten() {
            query = query.bind(filter.as_str());
        }
        let json = query.fetch_one(pool).await?;
        totals(&json, &q.group)
    }
);

/// Sorted by primary key, so that concurrent flushes of a fleet lock rows in one order.
pub(super) fn sorted(rows: &[UsageRow]) -> Vec<UsageRow> {
    let mut rows = rows.to_vec();
    rows.sort_by(|a, b| a.key().cmp(&b.key()));
    rows
}

/// The rows of `usage_daily` for these hourly rows: one per day and key, sorted. Merged here,
/// because one statement may not update a row twice (Postgres refuses it).
pub(super) fn daily(rows: &[UsageRow]) -> Vec<UsageRow> {
    let mut days: Vec<UsageRow> = rows
        .iter()
        .map(|r| UsageRow {
            hour: r.hour.div_euclid(DAY) * DAY,
            ..r.clone()
        })
        .collect();
    days.sort_by(|a, b| a.key().cmp(&b.key()));
    let mut merged: Vec<UsageRow> = Vec::with_capacity(days.len());
    for row in days {
        match merged.last_mut() {
            Some(last) if last.key() == row.key() => last.counts += row.counts,
            _ => merged.push(row),
        }
    }
    merged
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Table {
    Hourly,
    Daily,
}

/// `INSERT … ON CONFLICT DO UPDATE` adding `rows` rows to a table, in a dialect whose
/// placeholders are `mark` and a number (`?1`, `$1`): the same statement on both databases.
pub(super) fn add_sql(table: Table, rows: usize, mark: char) -> String {
    let (name, time) = match table {
        Table::Hourly => ("usage_hourly", "hour"),
        Table::Daily => ("usage_daily", "day"),
    };
    let values: Vec<String> = (0..rows)
        .map(|r| {
            let params: Vec<String> = (1..=PARAMS)
                .map(|c| format!("{mark}{}", r * PARAMS + c))
                .collect();
            format!("({})", params.join(", "))
        })
        .collect();
    let adds: Vec<String> = COUNT_COLUMNS
        .iter()
        .map(|c| format!("{c} = {name}.{c} + excluded.{c}"))
        .collect();
    format!(
        "INSERT INTO {name} ({time}, key_id, owner, service, model, team, {counts}) \
         VALUES {values} ON CONFLICT ({time}, key_id, owner, service, model, team) \
         DO UPDATE SET {adds}",
        counts = COUNT_COLUMNS.join(", "),
        values = values.join(", "),
        adds = adds.join(", "),
    )
}

const COUNT_COLUMNS: [&str; 9] = [
    "requests",
    "prompt_tokens",
    "completion_tokens",
    "reasoning_tokens",
    "cached_tokens",
    "estimated_requests",
    "cost_micros",
    "priced_requests",
    "unpriced_requests",
];

/// The grouping columns of a query, in output order (owner always).
fn group_columns(g: &Grouping) -> Vec<&'static str> {
    let mut columns = Vec::with_capacity(6);
    for (on, column) in [
        (g.day, "day"),
        (g.key, "key_id"),
        (true, "owner"),
        (g.service, "service"),
        (g.model, "model"),
        (g.team, "team"),
    ] {
        if on {
            columns.push(column);
        }
    }
    columns
}

/// The statement of `LedgerStore::usage`; parameters: first day, last day, then the owner and
/// the team when filtered. Read through the primary key (a day range) or `usage_daily_owner` (one owner's
/// days). The database returns the whole answer as one JSON array of row arrays (grouped parts,
/// then the counts): a report of thousands of rows then costs one value to fetch, where row by
/// row the drivers spent more time than the query itself (`benches/ledger.rs`). Sums are cast
/// back to 64 bits (Postgres widens a bigint sum to numeric).
pub(super) fn usage_sql(q: &UsageQuery, postgres: bool) -> String {
    let mark = if postgres { '$' } else { '?' };
    let columns = group_columns(&q.group).join(", ");
    let sums: Vec<String> = COUNT_COLUMNS
        .iter()
        .map(|c| format!("CAST(SUM({c}) AS BIGINT) AS {c}"))
        .collect();
    let mut filter = format!("day >= {mark}1 AND day <= {mark}2");
    let mut next = 3;
    for (on, column) in [(q.owner.is_some(), "owner"), (q.team.is_some(), "team")] {
        if on {
            filter.push_str(&format!(" AND {column} = {mark}{next}"));
            next += 1;
        }
    }
    let g = &q.group;
    let rows = if g.day && g.key && g.service && g.model && g.team {
        // Grouped by every part: each daily row is a group of its own, so the rows are read as
        // they are, with no aggregation (which costs most of a large report on SQLite).
        format!(
            "SELECT {columns}, {counts} FROM usage_daily WHERE {filter}",
            counts = COUNT_COLUMNS.join(", ")
        )
    } else {
        format!(
            "SELECT {columns}, {sums} FROM usage_daily WHERE {filter} GROUP BY {columns}",
            sums = sums.join(", "),
        )
    };
    let cells = format!("{columns}, {}", COUNT_COLUMNS.join(", "));
    if postgres {
        format!("SELECT COALESCE(json_agg(json_build_array({cells})), '[]'::json)::text FROM ({rows}) AS t")
    } else {
        format!("SELECT json_group_array(json_array({cells})) FROM ({rows})")
    }
}

/// The totals in `usage_sql`'s JSON answer, sorted by day, key, owner, service and model.
pub(super) fn totals(json: &str, g: &Grouping) -> Result<Vec<UsageTotal>, StoreError> {
    let rows: Vec<Vec<serde_json::Value>> = serde_json::from_str(json)?;
    let mut out = Vec::with_capacity(rows.len());
    for row in rows {
        let mut cells = row.into_iter();
        let day = if g.day {
            Some(number(&mut cells)?)
        } else {
            None
        };
        let key_id = text(&mut cells, g.key)?;
        let owner = text(&mut cells, true)?.unwrap_or_default();
        let service = text(&mut cells, g.service)?;
        let model = text(&mut cells, g.model)?;
        let team = text(&mut cells, g.team)?;
        let mut counts = [0u64; COUNT_COLUMNS.len()];
        for count in &mut counts {
            *count = number(&mut cells)?.max(0) as u64;
        }
        let [requests, prompt_tokens, completion_tokens, reasoning_tokens, cached_tokens, estimated_requests, cost_micros, priced_requests, unpriced_requests] =
            counts;
        out.push(UsageTotal {
            day,
            key_id,
            owner,
            service,
            model,
            team,
            counts: UsageCounts {
                requests,
                prompt_tokens,
                completion_tokens,
                reasoning_tokens,
                cached_tokens,
                estimated_requests,
                cost_micros,
                priced_requests,
                unpriced_requests,
            },
        });
    }
    out.sort_by(|a, b| {
        (a.day, &a.key_id, &a.owner, &a.service, &a.model, &a.team)
            .cmp(&(b.day, &b.key_id, &b.owner, &b.service, &b.model, &b.team))
    });
    Ok(out)
}

type Cells = std::vec::IntoIter<serde_json::Value>;

fn number(cells: &mut Cells) -> Result<i64, StoreError> {
    (cells.next().and_then(|v| v.as_i64()))
        .ok_or_else(|| "usage report: a count is missing or not a whole number".into())
}

/// The next text cell when `on` (its part is grouped by).
fn text(cells: &mut Cells, on: bool) -> Result<Option<String>, StoreError> {
    if !on {
        return Ok(None);
    }
    match cells.next() {
        Some(serde_json::Value::String(s)) => Ok(Some(s)),
        _ => Err("usage report: a text part is missing or not text".into()),
    }
}

/// Step 4 of the shared migrations, the same on both databases: the ledger and its rollup,
/// keyed as `UsageRow`, with indexes for one key's or one owner's hours (budgets) and one
/// owner's days (`GET /v1/usage` of a non-administrator).
pub(super) const MIGRATION: &str = "
    CREATE TABLE IF NOT EXISTS usage_hourly (
        hour               BIGINT NOT NULL,
        key_id             TEXT NOT NULL,
        owner              TEXT NOT NULL,
        service            TEXT NOT NULL,
        model              TEXT NOT NULL,
        requests           BIGINT NOT NULL,
        prompt_tokens      BIGINT NOT NULL,
        completion_tokens  BIGINT NOT NULL,
        reasoning_tokens   BIGINT NOT NULL,
        cached_tokens      BIGINT NOT NULL,
        estimated_requests BIGINT NOT NULL,
        PRIMARY KEY (hour, key_id, owner, service, model)
    );
    CREATE INDEX IF NOT EXISTS usage_hourly_key ON usage_hourly (key_id, hour);
    CREATE INDEX IF NOT EXISTS usage_hourly_owner ON usage_hourly (owner, hour);
    CREATE TABLE IF NOT EXISTS usage_daily (
        day                BIGINT NOT NULL,
        key_id             TEXT NOT NULL,
        owner              TEXT NOT NULL,
        service            TEXT NOT NULL,
        model              TEXT NOT NULL,
        requests           BIGINT NOT NULL,
        prompt_tokens      BIGINT NOT NULL,
        completion_tokens  BIGINT NOT NULL,
        reasoning_tokens   BIGINT NOT NULL,
        cached_tokens      BIGINT NOT NULL,
        estimated_requests BIGINT NOT NULL,
        PRIMARY KEY (day, key_id, owner, service, model)
    );
    CREATE INDEX IF NOT EXISTS usage_daily_owner ON usage_daily (owner, day);";

/// Step 6, the same on both databases: the ids of the ledger batches written in the last day.
pub(super) const MIGRATION_BATCHES: &str = "
    CREATE TABLE IF NOT EXISTS usage_batches (
        batch_id    TEXT PRIMARY KEY,
        written_at  BIGINT NOT NULL
    );
    CREATE INDEX IF NOT EXISTS usage_batches_written ON usage_batches (written_at);
";

/// Step 8 on SQLite, which cannot change a primary key in place. A row's identity becomes
/// (time, key, owner, service, model, team), so a request made after its owner joined a team is
/// never folded into a row of requests made before (nor the other way round); each row gains
/// what its requests cost and how many were priced and unpriced. Each table is rebuilt (its rows
/// copied, with no team and no cost) and its indexes made again, with one for a team's hours or
/// days (team budgets, `GET /v1/usage?team=`). Runs inside the migration's transaction.
pub(super) const MIGRATION_COSTS_SQLITE: &str = "
    CREATE TABLE usage_hourly_costed (
        hour               BIGINT NOT NULL,
        key_id             TEXT NOT NULL,
        owner              TEXT NOT NULL,
        service            TEXT NOT NULL,
        model              TEXT NOT NULL,
        team               TEXT NOT NULL DEFAULT '',
        requests           BIGINT NOT NULL,
        prompt_tokens      BIGINT NOT NULL,
        completion_tokens  BIGINT NOT NULL,
        reasoning_tokens   BIGINT NOT NULL,
        cached_tokens      BIGINT NOT NULL,
        estimated_requests BIGINT NOT NULL,
        cost_micros        BIGINT NOT NULL DEFAULT 0,
        priced_requests    BIGINT NOT NULL DEFAULT 0,
        unpriced_requests  BIGINT NOT NULL DEFAULT 0,
        PRIMARY KEY (hour, key_id, owner, service, model, team)
    );
    INSERT INTO usage_hourly_costed (hour, key_id, owner, service, model, requests, prompt_tokens,
        completion_tokens, reasoning_tokens, cached_tokens, estimated_requests)
        SELECT hour, key_id, owner, service, model, requests, prompt_tokens,
        completion_tokens, reasoning_tokens, cached_tokens, estimated_requests FROM usage_hourly;
    DROP TABLE usage_hourly;
    ALTER TABLE usage_hourly_costed RENAME TO usage_hourly;
    CREATE INDEX IF NOT EXISTS usage_hourly_key ON usage_hourly (key_id, hour);
    CREATE INDEX IF NOT EXISTS usage_hourly_owner ON usage_hourly (owner, hour);
    CREATE INDEX IF NOT EXISTS usage_hourly_team ON usage_hourly (team, hour);
    CREATE TABLE usage_daily_costed (
        day                BIGINT NOT NULL,
        key_id             TEXT NOT NULL,
        owner              TEXT NOT NULL,
        service            TEXT NOT NULL,
        model              TEXT NOT NULL,
        team               TEXT NOT NULL DEFAULT '',
        requests           BIGINT NOT NULL,
        prompt_tokens      BIGINT NOT NULL,
        completion_tokens  BIGINT NOT NULL,
        reasoning_tokens   BIGINT NOT NULL,
        cached_tokens      BIGINT NOT NULL,
        estimated_requests BIGINT NOT NULL,
        cost_micros        BIGINT NOT NULL DEFAULT 0,
        priced_requests    BIGINT NOT NULL DEFAULT 0,
        unpriced_requests  BIGINT NOT NULL DEFAULT 0,
        PRIMARY KEY (day, key_id, owner, service, model, team)
    );
    INSERT INTO usage_daily_costed (day, key_id, owner, service, model, requests, prompt_tokens,
        completion_tokens, reasoning_tokens, cached_tokens, estimated_requests)
        SELECT day, key_id, owner, service, model, requests, prompt_tokens,
        completion_tokens, reasoning_tokens, cached_tokens, estimated_requests FROM usage_daily;
    DROP TABLE usage_daily;
    ALTER TABLE usage_daily_costed RENAME TO usage_daily;
    CREATE INDEX IF NOT EXISTS usage_daily_key ON usage_daily (key_id, day);
    CREATE INDEX IF NOT EXISTS usage_daily_owner ON usage_daily (owner, day);
    CREATE INDEX IF NOT EXISTS usage_daily_team ON usage_daily (team, day);
";

/// Step 8 on Postgres: the columns added, the primary keys widened to the team in place.
pub(super) const MIGRATION_COSTS_POSTGRES: &str = "
    ALTER TABLE usage_hourly ADD COLUMN IF NOT EXISTS team TEXT NOT NULL DEFAULT '',
        ADD COLUMN IF NOT EXISTS cost_micros BIGINT NOT NULL DEFAULT 0,
        ADD COLUMN IF NOT EXISTS priced_requests BIGINT NOT NULL DEFAULT 0,
        ADD COLUMN IF NOT EXISTS unpriced_requests BIGINT NOT NULL DEFAULT 0;
    ALTER TABLE usage_hourly DROP CONSTRAINT IF EXISTS usage_hourly_pkey,
        ADD PRIMARY KEY (hour, key_id, owner, service, model, team);
    ALTER TABLE usage_daily ADD COLUMN IF NOT EXISTS team TEXT NOT NULL DEFAULT '',
        ADD COLUMN IF NOT EXISTS cost_micros BIGINT NOT NULL DEFAULT 0,
        ADD COLUMN IF NOT EXISTS priced_requests BIGINT NOT NULL DEFAULT 0,
        ADD COLUMN IF NOT EXISTS unpriced_requests BIGINT NOT NULL DEFAULT 0;
    ALTER TABLE usage_daily DROP CONSTRAINT IF EXISTS usage_daily_pkey,
        ADD PRIMARY KEY (day, key_id, owner, service, model, team);
    CREATE INDEX IF NOT EXISTS usage_hourly_team ON usage_hourly (team, hour);
    CREATE INDEX IF NOT EXISTS usage_daily_team ON usage_daily (team, day);";
