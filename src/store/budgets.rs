//! Budgets as the store keeps them: the limits set on keys (columns of `api_keys`) and on
//! owners (`owner_budgets`), each change stamped so gateways can poll for what changed, and
//! the ledger's sums over the current hour, day and month that seed the budget counters.

/// Limits per fixed UTC window (the hour, the day, the calendar month); `None`: no limit in
/// that window. Tokens are prompt + completion.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Budget {
    pub tokens_per_hour: Option<u64>,
    pub tokens_per_day: Option<u64>,
    pub tokens_per_month: Option<u64>,
    pub requests_per_day: Option<u64>,
}

impl Budget {
    /// The names used in config, JSON and CLI flags, in this order everywhere.
    pub const NAMES: [&'static str; 4] = [
        "tokens_per_hour",
        "tokens_per_day",
        "tokens_per_month",
        "requests_per_day",
    ];

    /// No limit at all: the same as no budget.
    pub fn is_empty(&self) -> bool {
        self.limits().iter().all(Option::is_none)
    }

    /// The limits in `NAMES` order.
    pub fn limits(&self) -> [Option<u64>; 4] {
        [
            self.tokens_per_hour,
            self.tokens_per_day,
            self.tokens_per_month,
            self.requests_per_day,
        ]
    }

    pub fn from_limits(l: [Option<u64>; 4]) -> Budget {
        Budget {
            tokens_per_hour: l[0],
            tokens_per_day: l[1],
            tokens_per_month: l[2],
            requests_per_day: l[3],
        }
    }
}

/// In JSON, an object of the limits that are set, keyed by `NAMES` (`{}` for none).
impl serde::Serialize for Budget {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        use serde::ser::SerializeMap;
        let set: Vec<_> = Self::NAMES.iter().zip(self.limits()).collect();
        let mut map = s.serialize_map(Some(set.iter().filter(|(_, l)| l.is_some()).count()))?;
        for (name, limit) in set {
            if let Some(limit) = limit {
                map.serialize_entry(name, &limit)?;
            }
        }
        map.end()
    }
}

/// Whom a budget is set on.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Subject {
    /// An API key, by key id.
    Key(String),
    /// An owner (a JWT `sub`): all its keys and its own JWT calls together.
    Owner(String),
}

/// A budget as it is now, for a subject whose budget changed at `changed_at_ms` (unix
/// milliseconds, the writer's clock). A cleared budget is an empty one.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BudgetChange {
    pub subject: Subject,
    pub budget: Budget,
    pub changed_at_ms: i64,
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
}

/// What the ledger holds for one subject in the current windows (tokens: prompt +
/// completion).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct WindowUsage {
    pub hour_tokens: u64,
    pub day_tokens: u64,
    pub month_tokens: u64,
    pub day_requests: u64,
}

impl WindowUsage {
    /// What each limit of a budget counts against, in `Budget::NAMES` order.
    pub fn in_order(&self) -> [u64; 4] {
        [
            self.hour_tokens,
            self.day_tokens,
            self.month_tokens,
            self.day_requests,
        ]
    }
}

impl WindowStarts {
    /// Unix seconds when each window of `Budget::NAMES` ends (its count starts again).
    pub fn resets(&self) -> [i64; 4] {
        let ends = self.ends();
        [ends.hour, ends.day, ends.month, ends.day]
    }
}
