//! Budgets as the store keeps them: the limits set on keys (columns of `api_keys`), on owners
//! (`owner_budgets`) and on teams (`team_budgets`), and which team each owner belongs to
//! (`owner_teams`), each change stamped so gateways can poll for what changed. What the ledger
//! holds against them in the current windows is the ledger's (`ledger.rs`).

use async_trait::async_trait;

use super::StoreError;

/// What a limit counts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Unit {
    /// Prompt + completion tokens.
    Tokens,
    Requests,
    /// Micros (millionths) of the price table's currency.
    Cost,
}

/// Limits per fixed UTC window (the hour, the day, the calendar month); `None`: no limit in
/// that window. Tokens are prompt + completion; costs are in micros of the price table's
/// currency.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Budget {
    pub tokens_per_hour: Option<u64>,
    pub tokens_per_day: Option<u64>,
    pub tokens_per_month: Option<u64>,
    pub requests_per_day: Option<u64>,
    pub cost_per_day: Option<u64>,
    pub cost_per_month: Option<u64>,
}

impl Budget {
    /// How many limits a budget has.
    pub const N: usize = 6;

    /// The names used in config, JSON and CLI flags, in this order everywhere.
    pub const NAMES: [&'static str; Budget::N] = [
        "tokens_per_hour",
        "tokens_per_day",
        "tokens_per_month",
        "requests_per_day",
        "cost_per_day",
        "cost_per_month",
    ];

    /// What each limit of `NAMES` counts.
    pub const UNITS: [Unit; Budget::N] = [
        Unit::Tokens,
        Unit::Tokens,
        Unit::Tokens,
        Unit::Requests,
        Unit::Cost,
        Unit::Cost,
    ];

    /// No limit at all: the same as no budget.
    pub fn is_empty(&self) -> bool {
        self.limits().iter().all(Option::is_none)
    }

    /// Whether a limit counts what requests cost.
    pub fn limits_cost(&self) -> bool {
        self.cost_per_day.is_some() || self.cost_per_month.is_some()
    }

    /// The limits in `NAMES` order.
    pub fn limits(&self) -> [Option<u64>; Budget::N] {
        [
            self.tokens_per_hour,
            self.tokens_per_day,
            self.tokens_per_month,
            self.requests_per_day,
            self.cost_per_day,
            self.cost_per_month,
        ]
    }

    pub fn from_limits(l: [Option<u64>; Budget::N]) -> Budget {
        Budget {
            tokens_per_hour: l[0],
            tokens_per_day: l[1],
            tokens_per_month: l[2],
            requests_per_day: l[3],
            cost_per_day: l[4],
            cost_per_month: l[5],
        }
    }
}

/// A count of `unit` as JSON: a whole number, or for a cost the currency's units with at most
/// six decimals.
pub(crate) fn amount_json(unit: Unit, n: u64) -> serde_json::Value {
    match unit {
        Unit::Cost => serde_json::Value::Number(crate::pricing::money::units(n)),
        _ => serde_json::Value::from(n),
    }
}

/// A count of `unit` as text for people (messages, the CLI): `0.000001`, never `1e-6`.
pub(crate) fn amount_text(unit: Unit, n: u64) -> String {
    match unit {
        Unit::Cost => crate::pricing::money::units_text(n),
        _ => n.to_string(),
    }
}

/// In JSON, an object of the limits that are set, keyed by `NAMES` (`{}` for none).
impl serde::Serialize for Budget {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        use serde::ser::SerializeMap;
        let set = Self::NAMES.iter().zip(Self::UNITS).zip(self.limits());
        let mut map = s.serialize_map(Some(self.limits().iter().flatten().count()))?;
        for ((name, unit), limit) in set {
            if let Some(limit) = limit {
                map.serialize_entry(name, &amount_json(unit, limit))?;
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
    /// A team: all its owners' keys and JWT calls together.
    Team(String),
}

/// A budget as it is now, for a subject whose budget changed at `changed_at_ms` (unix
/// milliseconds, the writer's clock). A cleared budget is an empty one.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BudgetChange {
    pub subject: Subject,
    pub budget: Budget,
    pub changed_at_ms: i64,
}

/// An owner's team as it is now (`None`: in none), changed at `changed_at_ms`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TeamChange {
    pub owner: String,
    pub team: Option<String>,
    pub changed_at_ms: i64,
}

/// The budgets set on keys, owners and teams, and owners' teams, which the key API and the CLI
/// set and every gateway polls for changes.
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
    /// The budget set on a team, if any.
    async fn team_budget(&self, _team: &str) -> Result<Option<Budget>, StoreError> {
        Ok(None)
    }
    /// Sets (an empty budget: clears) a team's budget, stamped as an owner's is.
    async fn set_team_budget(&self, _team: &str, _budget: &Budget) -> Result<(), StoreError> {
        Err("this store keeps no budgets".into())
    }
    /// The team an owner belongs to, if any.
    async fn owner_team(&self, _owner: &str) -> Result<Option<String>, StoreError> {
        Ok(None)
    }
    /// Puts an owner in a team (`None`: in none), stamped as a budget change is.
    async fn set_owner_team(&self, _owner: &str, _team: Option<&str>) -> Result<(), StoreError> {
        Err("this store keeps no teams".into())
    }
    /// Every key, owner and team budget stamped at or after `since_ms`, as it is now (cleared
    /// ones as empty budgets). `since_ms = 0`: every budget ever set.
    async fn budget_changes(&self, _since_ms: i64) -> Result<Vec<BudgetChange>, StoreError> {
        Ok(Vec::new())
    }
    /// Every owner's team stamped at or after `since_ms`, as it is now.
    async fn team_changes(&self, _since_ms: i64) -> Result<Vec<TeamChange>, StoreError> {
        Ok(Vec::new())
    }
}
