//! The usage ledger as stored: `usage_hourly` (what budgets sum over hours, days and months)
//! and its rollup `usage_daily` (what `GET /v1/usage` and `portcullis usage` read), the rows a
//! flush adds, the queries that read them, and the sums over the current windows that seed the
//! budget counters.

use std::collections::HashMap;

use async_trait::async_trait;

use super::{Budget, StoreError, Subject};

/// What one (hour, key, owner, service, model, team) used, and what it cost.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct UsageCounts {
    pub requests: u64,
    pub prompt_tokens: u64,
    pub completion_tokens: u64,
    pub reasoning_tokens: u64,
    pub cached_tokens: u64,
    /// Requests whose usage was estimated (an abandoned stream).
    pub estimated_requests: u64,
    /// What the priced requests cost, in micros of the price table's currency.
    pub cost_micros: u64,
    /// Requests a price applied to (`cost_micros` is theirs; none: no cost to show).
    pub priced_requests: u64,
    /// Requests of a gateway with a price table whose model had no price that applied.
    pub unpriced_requests: u64,
}

impl UsageCounts {
    /// The cost to show: none when no request was priced (never 0 for unpriced ones).
    pub fn cost(&self) -> Option<u64> {
        (self.priced_requests > 0).then_some(self.cost_micros)
    }
}

impl std::ops::AddAssign for UsageCounts {
    fn add_assign(&mut self, o: UsageCounts) {
        self.requests += o.requests;
        self.prompt_tokens += o.prompt_tokens;
        self.completion_tokens += o.completion_tokens;
        self.reasoning_tokens += o.reasoning_tokens;
        self.cached_tokens += o.cached_tokens;
        self.estimated_requests += o.estimated_requests;
        self.cost_micros += o.cost_micros;
        self.priced_requests += o.priced_requests;
        self.unpriced_requests += o.unpriced_requests;
    }
}

/// One row added to the ledger. Absent parts are stored as `''` so they can be part of the
/// primary key: `key_id` for JWT callers, `owner` for keys made without one, `model` unknown.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UsageRow {
    /// Unix seconds of the start of the UTC hour (of the day, in `usage_daily`).
    pub hour: i64,
    pub key_id: String,
    pub owner: String,
    pub service: String,
    pub model: String,
    /// The owner's team when the requests were made (`''`: none): part of the row's identity,
    /// so requests before and after an owner joins a team are never one row.
    pub team: String,
    pub counts: UsageCounts,
}

/// Which of day, key, service, model and team a query splits its totals by. Totals are always
/// split by owner as well.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Grouping {
    pub day: bool,
    pub key: bool,
    pub service: bool,
    pub model: bool,
    pub team: bool,
}

/// Totals from `usage_daily` for the UTC days `from_day..=to_day` (unix seconds of each day's
/// start), of one owner, of one team's owners, or of everyone.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UsageQuery {
    pub from_day: i64,
    pub to_day: i64,
    pub owner: Option<String>,
    pub team: Option<String>,
    pub group: Grouping,
}

/// One line of totals. A part not grouped by is `None`; a grouped part keeps the ledger's
/// `''` for "none" (a JWT call's key, an unknown model).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UsageTotal {
    pub day: Option<i64>,
    pub key_id: Option<String>,
    pub owner: String,
    pub service: Option<String>,
    pub model: Option<String>,
    pub team: Option<String>,
    pub counts: UsageCounts,
}

/// Unix seconds of the starts of the current UTC hour, day and calendar month.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct WindowStarts {
    pub hour: i64,
    pub day: i64,
    pub month: i64,
}

impl WindowStarts {
    /// The windows `now` (unix seconds) falls in.
    pub fn at(now: i64) -> WindowStarts {
        WindowStarts {
            hour: now - now.rem_euclid(3600),
            day: now - now.rem_euclid(86_400),
            month: crate::time::month_bounds(now).0,
        }
    }

    /// Unix seconds of the ends of the same windows: the next hour, day and month.
    pub fn ends(&self) -> WindowStarts {
        WindowStarts {
            hour: self.hour + 3600,
            day: self.day + 86_400,
            month: crate::time::month_bounds(self.month).1,
        }
    }

    /// Unix seconds when each window of `Budget::NAMES` ends (its count starts again).
    pub fn resets(&self) -> [i64; Budget::N] {
        let ends = self.ends();
        [
            ends.hour, ends.day, ends.month, ends.day, ends.day, ends.month,
        ]
    }
}

/// What the ledger holds for one subject in the current windows (tokens: prompt +
/// completion; costs in micros).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct WindowUsage {
    pub hour_tokens: u64,
    pub day_tokens: u64,
    pub month_tokens: u64,
    pub day_requests: u64,
    pub day_cost: u64,
    pub month_cost: u64,
}

impl WindowUsage {
    /// What each limit of a budget counts against, in `Budget::NAMES` order.
    pub fn in_order(&self) -> [u64; Budget::N] {
        [
            self.hour_tokens,
            self.day_tokens,
            self.month_tokens,
            self.day_requests,
            self.day_cost,
            self.month_cost,
        ]
    }
}

/// The usage ledger: what was used, by hour and by day, per key, owner, service and model,
/// which the meter writes, usage reports read and budgets sum over their windows.
#[async_trait]
pub trait LedgerStore: Send + Sync {
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
    /// The ledger's totals in the windows starting at `starts`, for every key, owner and team
    /// with usage in the month (`''`, none, left out).
    async fn all_window_usage(
        &self,
        _starts: WindowStarts,
    ) -> Result<Vec<(Subject, WindowUsage)>, StoreError> {
        Ok(Vec::new())
    }
}
