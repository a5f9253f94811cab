//! The table in use: read per request without a lock, replaced whole when SIGHUP reloads the
//! file. A table that fails to load never replaces a good one: requests go on being costed
//! with the old prices, and the log names what was refused.

use std::path::PathBuf;
use std::sync::Arc;

use arc_swap::ArcSwap;
use async_trait::async_trait;
use pingora::server::ShutdownWatch;
use pingora::services::background::BackgroundService;

use super::table::{Price, Prices, Tokens};

/// `[pricing]`, validated.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PricingSettings {
    /// The price table, as written (a relative path is relative to the working directory, as
    /// every path in the config is).
    pub file: PathBuf,
    /// A label for the table's currency, shown beside amounts; never converted.
    pub currency: String,
    pub unpriced: Unpriced,
}

/// `unpriced`: what happens to a request whose model has no applicable price.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Unpriced {
    /// Served, recorded as unpriced (never as costing 0).
    Allow,
    /// Refused (403 `model_unpriced`) to a caller with a cost budget; served to the others.
    Refuse,
}

pub struct Pricing {
    pub currency: Box<str>,
    pub unpriced: Unpriced,
    /// Where `reload` reads from; `None` for a table made in memory.
    file: Option<PathBuf>,
    table: ArcSwap<Prices>,
}

impl Pricing {
    /// Reads the table `settings` names (at start-up: a bad table stops the start).
    pub(crate) fn load(settings: &PricingSettings) -> Result<Pricing, Vec<String>> {
        let prices = Prices::from_file(&settings.file)?;
        Ok(Pricing {
            currency: settings.currency.as_str().into(),
            unpriced: settings.unpriced,
            file: Some(settings.file.clone()),
            table: ArcSwap::from_pointee(prices),
        })
    }

    /// A table made in memory (tests, benchmarks); `reload` has no file to read.
    pub fn from_prices(prices: Prices, currency: &str, unpriced: Unpriced) -> Pricing {
        Pricing {
            currency: currency.into(),
            unpriced,
            file: None,
            table: ArcSwap::from_pointee(prices),
        }
    }

    /// The price of `model` on `service` at `now` (unix seconds), as `Prices::price`.
    pub(crate) fn price(&self, service: &str, model: &str, now: i64) -> Option<Price> {
        self.table.load().price(service, model, now)
    }

    /// The cost of `tokens` of `model` on `service` at `now`, in micros; `None`: unpriced.
    pub fn cost(&self, service: &str, model: &str, now: i64, tokens: Tokens) -> Option<u64> {
        self.price(service, model, now).map(|p| p.cost(tokens))
    }

    /// Reads the file again: a good table replaces the one in use (the number of entries is
    /// returned and logged); a bad one is kept out, each problem logged, the old table kept.
    pub(crate) fn reload(&self) -> Result<usize, Vec<String>> {
        let Some(file) = &self.file else {
            return Err(vec!["the price table was not read from a file".to_string()]);
        };
        match Prices::from_file(file) {
            Ok(prices) => {
                let entries = prices.len();
                self.table.store(Arc::new(prices));
                log::info!(
                    "{}: price table reloaded, {entries} entries",
                    file.display()
                );
                Ok(entries)
            }
            Err(problems) => {
                for problem in &problems {
                    log::error!("{problem}");
                }
                log::error!(
                    "{}: refused, so the price table in use ({} entries) is kept",
                    file.display(),
                    self.table.load().len()
                );
                Err(problems)
            }
        }
    }
}

/// Reloads the price table on every SIGHUP (the access log reopens its file on the same
/// signal: each listener gets it).
pub(crate) struct PricingReload {
    pub pricing: Arc<Pricing>,
}

#[async_trait]
impl BackgroundService for PricingReload {
    async fn start(&self, _shutdown: ShutdownWatch) {
        use tokio::signal::unix::{signal, SignalKind};
        let mut hangup = match signal(SignalKind::hangup()) {
            Ok(s) => s,
            Err(e) => {
                log::error!("cannot handle SIGHUP, so the price table is never reloaded: {e}");
                return;
            }
        };
        while hangup.recv().await.is_some() {
            // A small file read once per signal: not worth a thread of its own.
            let _ = self.pricing.reload();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::time::parse_date;

    const TABLE: &str = r#"
[[price]]
model = "m"
from = "2026-01-01"
input = 1
output = 2
"#;

    fn settings(file: PathBuf) -> PricingSettings {
        PricingSettings {
            file,
            currency: "EUR".into(),
            unpriced: Unpriced::Refuse,
        }
    }

    #[test]
    fn a_reload_replaces_a_good_table_and_keeps_the_old_one_over_a_bad_one() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("prices.toml");
        std::fs::write(&file, TABLE).unwrap();
        let pricing = Pricing::load(&settings(file.clone())).unwrap();
        assert_eq!(
            (&*pricing.currency, pricing.unpriced),
            ("EUR", Unpriced::Refuse)
        );
        let now = parse_date("2026-06-01").unwrap();
        let tokens = Tokens {
            prompt: 1_000_000,
            cached: 0,
            completion: 1_000_000,
        };
        assert_eq!(pricing.cost("any", "m", now, tokens), Some(3_000_000));

        std::fs::write(&file, TABLE.replace("output = 2", "output = 5")).unwrap();
        assert_eq!(pricing.reload(), Ok(1));
        assert_eq!(pricing.cost("any", "m", now, tokens), Some(6_000_000));

        std::fs::write(&file, TABLE.replace("output = 2", "output = -5")).unwrap();
        let problems = pricing.reload().unwrap_err();
        assert!(
            problems[0].contains("price[1] (model \"m\", from 2026-01-01): output"),
            "{problems:?}"
        );
        assert_eq!(pricing.cost("any", "m", now, tokens), Some(6_000_000));

        std::fs::remove_file(&file).unwrap();
        assert!(pricing.reload().unwrap_err()[0].contains("cannot read"));
        assert_eq!(pricing.cost("any", "m", now, tokens), Some(6_000_000));
        assert_eq!(pricing.cost("any", "other", now, tokens), None);
    }

    #[test]
    fn a_table_made_in_memory_has_nothing_to_reload() {
        let prices = Prices::parse("t.toml", TABLE).unwrap();
        let pricing = Pricing::from_prices(prices, "USD", Unpriced::Allow);
        assert!(pricing.reload().is_err());
        let now = parse_date("2026-01-01").unwrap();
        assert_eq!(
            pricing.price("s", "m", now).map(|p| p.output),
            Some(2_000_000_000)
        );
    }
}
