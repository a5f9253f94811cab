//! `[pricing]`: the price table and how unpriced models are treated. The table itself is read
//! and checked here too, so `serve -t` and a start refuse a bad table, naming the entry.

use std::path::PathBuf;

use super::file;
use super::validate::Validator;
use crate::pricing::{Prices, PricingSettings, Unpriced};

/// A currency label is a code or a symbol (`USD`, `EUR`, `€`), shown beside amounts.
const MAX_CURRENCY_CHARS: usize = 16;

impl Validator<'_> {
    /// `services`: the configured service names, which an entry's `service` must be one of.
    pub(super) fn pricing(&mut self, p: file::Pricing, services: &[&str]) -> PricingSettings {
        let file = PathBuf::from(&p.file);
        if p.file.is_empty() {
            self.problem("pricing.file", "must name the price table");
        } else if let Err(problems) = Prices::from_file_for(&file, Some(services)) {
            for problem in problems {
                self.problem("pricing.file", problem);
            }
        }
        let currency = p.currency.unwrap_or_else(|| "USD".to_string());
        let chars = currency.chars().count();
        if chars == 0
            || chars > MAX_CURRENCY_CHARS
            || currency
                .chars()
                .any(|c| c.is_control() || c.is_whitespace())
        {
            self.problem(
                "pricing.currency",
                "must be 1 to 16 characters without spaces, like \"USD\"",
            );
        }
        let unpriced = match p.unpriced.as_deref() {
            None | Some("allow") => Unpriced::Allow,
            Some("refuse") => Unpriced::Refuse,
            Some(other) => {
                let why = format!("{other:?} is not one of \"allow\", \"refuse\"");
                self.problem("pricing.unpriced", why);
                Unpriced::Allow
            }
        };
        PricingSettings {
            file,
            currency,
            unpriced,
        }
    }
}
