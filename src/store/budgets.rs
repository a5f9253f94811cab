//! Budgets as the store keeps them: the limits set on keys (columns of `api_keys`) and on
//! owners (`owner_budgets`), each change stamped so gateways can poll for what changed. What
//! the ledger holds against them in the current windows is the ledger's (`ledger.rs`).

use async_trait::async_trait;

use super::StoreError;

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

/// The budgets set on keys and owners, which the key API and the CLI set and every gateway
/// polls for changes.
#[async_trait]
pub trait BudgetStore: Send + Sync {
    /// Sets (an empty budget: clears) the budget of a key, stamping the change with the
    /// store's own clock (a writer's may lag);
    /// false if no such key. Test stores keep no budgets.
    async fn set_key_budget(&self, _key_id: &str, _budget: &Budget) -> Result<bool, StoreError> {
        Err("this store keeps no budgets".into())
    }
    /// The budget set on an owner, if any.
    async fn owner_budget(&self, _owner: &str) -> Result<Option<Budget>, StoreError> {
        Ok(None)
    }
    /// Sets (an empty budget: clears) an owner's budget, stamping the change with the store's
    /// own clock.
    async fn set_owner_budget(&self, _owner: &str, _budget: &Budget) -> Result<(), StoreError> {
        Err("this store keeps no budgets".into())
    }
    /// Every key and owner budget stamped at or after `since_ms`, as it is now (cleared ones
    /// as empty budgets). `since_ms = 0`: every budget ever set.
    async fn budget_changes(&self, _since_ms: i64) -> Result<Vec<BudgetChange>, StoreError> {
        Ok(Vec::new())
    }
}
