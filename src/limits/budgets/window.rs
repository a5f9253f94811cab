//! The four budget counters and their fixed UTC windows: tokens per hour, day and calendar
//! month, and requests per day, in `Budget::NAMES` order everywhere.

use crate::store::{Budget, WindowStarts, WindowUsage};

/// One budget counter.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Kind {
    TokensPerHour,
    TokensPerDay,
    TokensPerMonth,
    RequestsPerDay,
}

impl Kind {
    pub(crate) const ALL: [Kind; 4] = [
        Kind::TokensPerHour,
        Kind::TokensPerDay,
        Kind::TokensPerMonth,
        Kind::RequestsPerDay,
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
        ["th", "td", "tm", "rd"][self.index()]
    }

    pub(crate) fn counts_tokens(self) -> bool {
        self != Kind::RequestsPerDay
    }

    /// The start of this counter's window among `starts`.
    pub(crate) fn start(self, starts: &WindowStarts) -> i64 {
        match self {
            Kind::TokensPerHour => starts.hour,
            Kind::TokensPerDay | Kind::RequestsPerDay => starts.day,
            Kind::TokensPerMonth => starts.month,
        }
    }

    /// The limit of this counter in `budget`.
    pub(crate) fn limit(self, budget: &Budget) -> Option<u64> {
        budget.limits()[self.index()]
    }

    /// This counter's value in what the ledger holds.
    pub(crate) fn used(self, usage: &WindowUsage) -> u64 {
        match self {
            Kind::TokensPerHour => usage.hour_tokens,
            Kind::TokensPerDay => usage.day_tokens,
            Kind::TokensPerMonth => usage.month_tokens,
            Kind::RequestsPerDay => usage.day_requests,
        }
    }

    /// What a request of `tokens` adds to this counter.
    pub(crate) fn amount(self, tokens: u64, requests: u64) -> u64 {
        if self.counts_tokens() {
            tokens
        } else {
            requests
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
        let next = Windows::at(day + 86_400);
        assert_eq!(next.starts.month, parse_date("2026-12-01").unwrap());
        assert_eq!(next.seconds_left(Kind::TokensPerHour), 3600);
        assert_eq!(next.seconds_left(Kind::TokensPerMonth), 31 * 86_400);
    }
}
