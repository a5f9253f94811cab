//! The database: `sqlite.rs` on one host, `postgres.rs` for a fleet, with the same rows, the
//! same numbered migrations (`migrations.rs`) and the same statements (`*_sql.rs`). What it
//! keeps is three traits, one per kind of row, each implemented once by both stores:
//!
//! - `KeyStore` (`keys.rs`): API keys, which the verifier looks up and the key API and the
//!   `keys` CLI manage;
//! - `LedgerStore` (`ledger.rs`): the usage ledger, which the meter writes, usage reports read
//!   and budgets sum over their windows;
//! - `BudgetStore` (`budgets.rs`): the budgets set on keys and owners.
//!
//! `open_store` gives all three as one `Store`; a caller takes the part it uses, and a test
//! store implements only the parts its test needs.

mod budget_sql;
mod budgets;
mod key_sql;
mod keys;
mod ledger;
mod ledger_sql;
mod migrations;
mod postgres;
mod sql_bounds;
mod sqlite;
mod window_sql;

use std::sync::Arc;

pub use budgets::BudgetStore;
pub(crate) use budgets::{
    amount_json, amount_text, Budget, BudgetChange, Subject, TeamChange, Unit,
};
pub use keys::KeyStore;
pub(crate) use keys::{KeyRecord, PageEnd, StoredKey};
pub use ledger::{Grouping, LedgerStore, UsageCounts, UsageQuery, UsageRow};
pub(crate) use ledger::{UsageTotal, WindowStarts, WindowUsage};
pub(crate) use postgres::{
    check_url as check_postgres_url, is_url as is_postgres_url, Revocations,
};
pub(crate) use sqlite::SqliteStore;

pub(crate) type StoreError = Box<dyn std::error::Error + Send + Sync>;

/// The whole database: its keys, its ledger and its budgets, as `open_store` gives them. Any
/// type that keeps all three is one.
pub trait Store: KeyStore + LedgerStore + BudgetStore {}

impl<S: KeyStore + LedgerStore + BudgetStore + ?Sized> Store for S {}

/// The store a `database` URL names: `sqlite://…` or `postgres://…`. `serving`: a gateway
/// starts even when a Postgres server cannot be reached (a `keys` command fails instead).
pub async fn open_store(database: &str, serving: bool) -> Result<Arc<dyn Store>, StoreError> {
    if postgres::is_url(database) {
        Ok(Arc::new(if serving {
            postgres::PgStore::open_for_serving(database).await?
        } else {
            postgres::PgStore::open(database).await?
        }))
    } else {
        Ok(Arc::new(SqliteStore::open(database).await?))
    }
}

#[cfg(test)]
mod budget_tests;
#[cfg(test)]
mod tests;
