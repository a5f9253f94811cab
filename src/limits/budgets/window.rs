//! The six budget counters and their fixed UTC windows: tokens per hour, day and calendar
//! month, requests per day, and cost per day and calendar month, in `Budget::NAMES` order
//! everywhere.

use super::Ask;
use crate::store::{Budget, Unit, WindowStarts, WindowUsage};

/// One budget counter.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Kind {
    TokensPerHour,
    TokensPerDay,
    TokensPerMonth,
    RequestsPerDay,
    CostPerDay,
    CostPerMonth,
}

impl Kind {
    pub(crate) const ALL: [Kind; Budget::N] = [
        Kind::TokensPerHour,
        Kind::TokensPerDay,
        Kind::TokensPerMonth,
        Kind::RequestsPerDay,
        Kind::CostPerDay,
        Kind::CostPerMonth,
    ];

    pub(crate) fn index(self) -> usize {
        self as usize
    }

    /// The name in config, JSON, metrics and messages: `tokens_per_day`…
    pub(crate) fn name(self) -> &'static str {
        Budget::NAMES[self.index()]
    }

    /// The short name in shared counter keys.
    pub(crate) fn tag(self) -> &'static str {
        ["th", "td", "tm", "rd", "cd", "cm"][self.index()]
    }

    /// What this counter counts.
    pub(crate) fn unit(self) -> Unit {
        Budget::UNITS[self.index()]
    }

    pub(crate) fn counts_tokens(self) -> bool {
        self.unit() == Unit::Tokens
    }

    /// The start of this counter's window among `starts`.
    pub(crate) fn start(self, starts: &WindowStarts) -> i64 {
        match self {
            Kind::TokensPerHour => starts.hour,
            Kind::TokensPerDay | Kind::RequestsPerDay | Kind::CostPerDay => starts.day,
            Kind::TokensPerMonth | Kind::CostPerMonth => starts.month,
        }
    }

    /// The limit of this counter in `budget`.
    pub(crate) fn limit(self, budget: &Budget) -> Option<u64> {
        budget.limits()[self.index()]
    }

    /// This counter's value in what the ledger holds.
    pub(crate) fn used(self, usage: &WindowUsage) -> u64 {
        usage.in_order()[self.index()]
    }

    /// What a request asking `ask` adds to this counter.
    pub(crate) fn amount(self, ask: Ask) -> u64 {
        match self.unit() {
            Unit::Tokens => ask.tokens,
            Unit::Requests => ask.requests,
            Unit::Cost => ask.cost,
        }
    }

    /// A change of a request's tokens, requests and cost, as this counter counts it.
    pub(crate) fn delta(self, (tokens, requests, cost): (i64, i64, i64)) -> i64 {
        match self.unit() {
            Unit::Tokens => tokens,
            Unit::Requests => requests,
            Unit::Cost => cost,
        }
    }
}

/// A counter's windows now, with their ends, computed once per request.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Windows {
    pub now: i64,
    pub starts: WindowStarts,
    pub ends: WindowStarts,
}

impl Windows {
    pub(crate) fn at(now: i64) -> Windows {
        let starts = WindowStarts::at(now);
        Windows {
            now,
            starts,
            ends: starts.ends(),
        }
    }

    /// Whole seconds until `kind`'s window ends: at least 1.
    pub(crate) fn seconds_left(&self, kind: Kind) -> u64 {
        (kind.start(&self.ends) - self.now).max(1) as u64
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::time::parse_date;

    #[test]
    fn windows_end_at_the_utc_hour_day_and_month() {
        let day = parse_date("2026-11-30").unwrap();
        let w = Windows::at(day + 23 * 3600 + 59 * 60 + 30);
        assert_eq!(w.seconds_left(Kind::TokensPerHour), 30);
        assert_eq!(w.seconds_left(Kind::TokensPerDay), 30);
        assert_eq!(w.seconds_left(Kind::RequestsPerDay), 30);
        assert_eq!(w.seconds_left(Kind::TokensPerMonth), 30);
        assert_eq!(w.seconds_left(Kind::CostPerDay), 30);
        assert_eq!(w.seconds_left(Kind::CostPerMonth), 30);
        let next = Windows::at(day + 86_400);
        assert_eq!(next.starts.month, parse_date("2026-12-01").unwrap());
        assert_eq!(next.seconds_left(Kind::TokensPerHour), 3600);
        assert_eq!(next.seconds_left(Kind::TokensPerMonth), 31 * 86_400);
    }
}
