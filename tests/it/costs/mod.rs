//! Money end to end: real gateway processes with a price table (`[pricing]`) in front of the
//! fake upstream, whose answers state fixed token counts (cached and reasoning ones included:
//! `testkit::upstream::*_USAGE`), so every cost below is computed by hand from them.
//!
//! `exact`: {chat, completions, Responses, Messages} × {JSON, stream} costed to the micro in
//! the access log, the ledger (CLI and API) and the metrics; tomorrow's price and the general
//! entry do not apply where a service-specific one of today does. `unpriced`: a model without a
//! price is unpriced everywhere, never 0, and `unpriced = "refuse"` stops only cost-budgeted
//! callers. `fleet`: a team's cost budget holds across four gateways. `teams`: membership and
//! team budgets through the CLI and the key API.

mod exact;
mod fleet;
mod teams;
mod unpriced;

use std::path::PathBuf;

/// The UTC day after today, `YYYY-MM-DD`: a price dated then must not apply today.
pub fn tomorrow() -> String {
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs() as i64;
    let days = now.div_euclid(86_400) + 1;
    // Civil date from days since 1970-01-01 (Howard Hinnant's algorithm).
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = yoe + era * 400 + i64::from(m <= 2);
    format!("{y:04}-{m:02}-{d:02}")
}

/// Writes `table` as a price table in a directory of its own; its path (the directory lives as
/// long as the returned guard).
pub fn price_table(table: &str) -> (tempfile::TempDir, PathBuf) {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("prices.toml");
    std::fs::write(&path, table).unwrap();
    (dir, path)
}

/// Micros from a cost as the gateway writes it (a JSON number in currency units).
pub fn micros(cost: &serde_json::Value) -> u64 {
    let units = cost
        .as_f64()
        .unwrap_or_else(|| panic!("not a cost: {cost}"));
    (units * 1e6).round() as u64
}
