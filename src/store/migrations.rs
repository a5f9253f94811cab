//! The schema, as numbered steps both stores apply once each, in order.

use super::{budget_sql, ledger_sql};

/// One schema step, numbered the same on both stores, in each database's dialect.
pub(super) struct Migration {
    pub(super) version: i64,
    pub(super) sqlite: &'static str,
    pub(super) postgres: &'static str,
}

/// Applied once each, in order, and recorded in `portcullis_migrations` on both stores.
/// Never edit a released step: add one.
pub(super) const MIGRATIONS: &[Migration] = &[
    Migration {
        version: 1,
        sqlite: "CREATE TABLE IF NOT EXISTS api_keys (
            key_id      TEXT PRIMARY KEY,
            name        TEXT NOT NULL,
            verifier    BLOB NOT NULL,
            scopes      TEXT NOT NULL,
            created_at  BIGINT NOT NULL,
            expires_at  BIGINT,
            revoked_at  BIGINT
        )",
        postgres: "CREATE TABLE IF NOT EXISTS api_keys (
            key_id      TEXT PRIMARY KEY,
            name        TEXT NOT NULL,
            verifier    BYTEA NOT NULL,
            scopes      TEXT NOT NULL,
            created_at  BIGINT NOT NULL,
            expires_at  BIGINT,
            revoked_at  BIGINT
        )",
    },
    // Key ownership, for the key API (`owner` is the creator's JWT `sub`).
    Migration {
        version: 2,
        sqlite: "ALTER TABLE api_keys ADD COLUMN owner TEXT;
            CREATE INDEX IF NOT EXISTS api_keys_owner ON api_keys (owner);",
        postgres: "ALTER TABLE api_keys ADD COLUMN IF NOT EXISTS owner TEXT;
            CREATE INDEX IF NOT EXISTS api_keys_owner ON api_keys (owner);",
    },
    // Paged listings (newest first, all keys or one owner's) and the removal of keys revoked
    // long ago read only the rows they need.
    Migration {
        version: 3,
        sqlite: "CREATE INDEX IF NOT EXISTS api_keys_created ON api_keys (created_at, key_id);
            CREATE INDEX IF NOT EXISTS api_keys_owner_created
                ON api_keys (owner, created_at, key_id);
            CREATE INDEX IF NOT EXISTS api_keys_revoked ON api_keys (revoked_at)
                WHERE revoked_at IS NOT NULL;",
        postgres: "CREATE INDEX IF NOT EXISTS api_keys_created ON api_keys (created_at, key_id);
            CREATE INDEX IF NOT EXISTS api_keys_owner_created
                ON api_keys (owner, created_at, key_id);
            CREATE INDEX IF NOT EXISTS api_keys_revoked ON api_keys (revoked_at)
                WHERE revoked_at IS NOT NULL;",
    },
    // The usage ledger (`ledger_sql.rs`): hourly rows per key, owner, service and model, and their
    // daily rollup, which usage reports read.
    Migration {
        version: 4,
        sqlite: ledger_sql::MIGRATION,
        postgres: ledger_sql::MIGRATION,
    },
    // Budgets (`budget_sql.rs`): limits on keys (columns of `api_keys`, stamped when changed)
    // and on owners (`owner_budgets`), and an index for one key's days of the ledger.
    Migration {
        version: 5,
        sqlite: budget_sql::MIGRATION_SQLITE,
        postgres: budget_sql::MIGRATION_POSTGRES,
    },
    // The ledger's written batches (`ledger_sql.rs`): a flush is added exactly once.
    Migration {
        version: 6,
        sqlite: ledger_sql::MIGRATION_BATCHES,
        postgres: ledger_sql::MIGRATION_BATCHES,
    },
    // Money and teams (`budget_sql.rs`, `ledger_sql.rs`): cost limits on keys and owners, team
    // budgets and owners' teams; the ledger's cost, priced and unpriced requests and team.
    Migration {
        version: 7,
        sqlite: budget_sql::MIGRATION_TEAMS_SQLITE,
        postgres: budget_sql::MIGRATION_TEAMS_POSTGRES,
    },
    Migration {
        version: 8,
        sqlite: ledger_sql::MIGRATION_COSTS_SQLITE,
        postgres: ledger_sql::MIGRATION_COSTS_POSTGRES,
    },
];

/// Where both stores record the steps they applied.
pub(super) const MIGRATIONS_TABLE: &str = "CREATE TABLE IF NOT EXISTS portcullis_migrations (
    version    BIGINT PRIMARY KEY,
    applied_at BIGINT NOT NULL
)";

/// The newest version recorded that this binary does not know, if any: worth a warning.
pub(super) fn newer_than_known(applied: &[i64]) -> Option<i64> {
    let known = MIGRATIONS.last().map_or(0, |m| m.version);
    applied.iter().copied().filter(|&v| v > known).max()
}
