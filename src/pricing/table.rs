//! The price table: dated prices per model, read from TOML, checked whole, and looked up per
//! request without allocating. Prices are integers (billionths of the currency per million
//! tokens), so a cost is integer arithmetic, the same on every gateway and every run.

use std::collections::HashMap;
use std::path::Path;

use super::decimal::{self, DecimalError, Rounding};
use crate::one_line::{one_line, toml_problem};
use crate::time::{date, parse_date};

/// Token counts a cost is computed from, as the metering counts them: `prompt` includes the
/// `cached` prompt tokens, `completion` includes reasoning tokens.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Tokens {
    pub prompt: u64,
    pub cached: u64,
    pub completion: u64,
}

/// One entry's prices per million tokens, in billionths of the currency (2.50 is
/// 2_500_000_000): nine decimals per million tokens hold every real price exactly.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Price {
    pub input: u64,
    pub cached_input: u64,
    pub output: u64,
}

/// Billionths-per-million times tokens is in 10^-15 of the currency; micros are 10^-6.
const PER_MICRO: u128 = 1_000_000_000;
/// The highest price a table may hold, per million tokens (10^18 billionths): far above any
/// real one in any currency, and low enough that no cost overflows 128 bits.
const MAX_PRICE: u64 = 1_000_000_000 * 1_000_000_000;

impl Price {
    /// The cost in micros: ((prompt − cached) × input + cached × cached_input + completion ×
    /// output) / 10^6 per million, rounded half up, saturating at `u64::MAX`. `cached` above
    /// `prompt` counts as `prompt`.
    pub fn cost(&self, t: Tokens) -> u64 {
        let cached = t.cached.min(t.prompt);
        let billionths = u128::from(t.prompt - cached) * u128::from(self.input)
            + u128::from(cached) * u128::from(self.cached_input)
            + u128::from(t.completion) * u128::from(self.output);
        saturate((billionths + PER_MICRO / 2) / PER_MICRO)
    }

    /// What a budget reserves before the answer: every prompt token at the input price (or
    /// the cached price, were it the higher), every completion token of the cap at the output
    /// price, in micros rounded up. Never below `cost` of the same or fewer tokens.
    pub(crate) fn worst_case(&self, prompt: u64, completion: u64) -> u64 {
        let per_prompt = self.input.max(self.cached_input);
        let billionths = u128::from(prompt) * u128::from(per_prompt)
            + u128::from(completion) * u128::from(self.output);
        saturate(billionths.div_ceil(PER_MICRO))
    }
}

fn saturate(micros: u128) -> u64 {
    u64::try_from(micros).unwrap_or(u64::MAX)
}

/// An entry's date and price; a model's entries are kept oldest first.
#[derive(Debug, Clone, Copy)]
struct Dated {
    /// Unix seconds of the UTC day the price starts.
    from: i64,
    price: Price,
}

/// The entries of one model: those for any service, and those of each named service.
#[derive(Debug, Default)]
struct ModelPrices {
    general: Vec<Dated>,
    /// A handful at most per model: a scan beats hashing.
    services: Vec<(Box<str>, Vec<Dated>)>,
}

/// The newest entry whose day has started at `now`.
fn applying(entries: &[Dated], now: i64) -> Option<Price> {
    let started = entries.partition_point(|d| d.from <= now);
    started.checked_sub(1).map(|i| entries[i].price)
}

/// A validated price table; immutable (a reload builds a new one).
#[derive(Debug, Default)]
pub struct Prices {
    models: HashMap<Box<str>, ModelPrices>,
    entries: usize,
}

impl Prices {
    /// Reads a table (`[[price]]` entries: `service` optional, `model`, `from`, `input`,
    /// `cached_input` optional, `output`). `shown` names the file in problems, one line each,
    /// naming the entry: `prices.toml: price[3] (model "x", from 2026-11-01): input: must be a
    /// non-negative number`.
    pub fn parse(shown: &str, text: &str) -> Result<Prices, Vec<String>> {
        Prices::parse_for(shown, text, None)
    }

    /// `parse`, refusing as well an entry whose `service` is not in `services` (when given).
    pub(crate) fn parse_for(
        shown: &str,
        text: &str,
        services: Option<&[&str]>,
    ) -> Result<Prices, Vec<String>> {
        let table: toml::Table =
            toml::from_str(text).map_err(|e| vec![toml_problem(shown, text, &e)])?;
        let mut reader = Reader {
            shown,
            services,
            problems: Vec::new(),
            seen: HashMap::new(),
        };
        let mut prices = Prices::default();
        for (key, value) in table {
            if key != "price" {
                reader.problem(
                    &format!("{key:?}"),
                    "unknown key: the table holds only [[price]] entries",
                );
                continue;
            }
            let toml::Value::Array(entries) = value else {
                reader.problem("price", "must be [[price]] entries");
                continue;
            };
            for (i, entry) in entries.into_iter().enumerate() {
                if let Some((service, model, dated)) = reader.entry(i + 1, entry) {
                    prices.add(service, model, dated);
                }
            }
        }
        if !reader.problems.is_empty() {
            return Err(reader.problems);
        }
        for model in prices.models.values_mut() {
            model.general.sort_by_key(|d| d.from);
            for (_, entries) in &mut model.services {
                entries.sort_by_key(|d| d.from);
            }
        }
        Ok(prices)
    }

    pub(crate) fn from_file(path: &Path) -> Result<Prices, Vec<String>> {
        Prices::from_file_for(path, None)
    }

    pub(crate) fn from_file_for(
        path: &Path,
        services: Option<&[&str]>,
    ) -> Result<Prices, Vec<String>> {
        let shown = path.display().to_string();
        let text = std::fs::read_to_string(path)
            .map_err(|e| vec![format!("{shown}: cannot read: {e}")])?;
        Prices::parse_for(&shown, &text, services)
    }

    fn add(&mut self, service: Option<String>, model: String, dated: Dated) {
        self.entries += 1;
        let prices = self.models.entry(model.into()).or_default();
        match service {
            None => prices.general.push(dated),
            Some(service) => match prices.services.iter_mut().find(|(s, _)| **s == *service) {
                Some((_, entries)) => entries.push(dated),
                None => prices.services.push((service.into(), vec![dated])),
            },
        }
    }

    /// The price of `model` on `service` at `now` (unix seconds): the newest of the service's
    /// entries for the model whose `from` day has started; only when none has, the same among
    /// the entries for any service. Per request: no allocation.
    pub fn price(&self, service: &str, model: &str, now: i64) -> Option<Price> {
        let prices = self.models.get(model)?;
        let own = prices.services.iter().find(|(s, _)| **s == *service);
        own.and_then(|(_, entries)| applying(entries, now))
            .or_else(|| applying(&prices.general, now))
    }

    /// How many entries the table holds.
    pub(crate) fn len(&self) -> usize {
        self.entries
    }

    /// How many (service or any, model) pairs have an entry that applies at `now`.
    pub(crate) fn applying_pairs(&self, now: i64) -> usize {
        let mut pairs = 0;
        for prices in self.models.values() {
            pairs += usize::from(applying(&prices.general, now).is_some());
            pairs += (prices.services.iter())
                .filter(|(_, entries)| applying(entries, now).is_some())
                .count();
        }
        pairs
    }
}

/// Reads entries, collecting every problem.
struct Reader<'a> {
    shown: &'a str,
    services: Option<&'a [&'a str]>,
    problems: Vec<String>,
    /// (service, model, from) → the entry that has it first.
    seen: HashMap<(Option<String>, String, i64), usize>,
}

const ENTRY_KEYS: [&str; 6] = [
    "service",
    "model",
    "from",
    "input",
    "cached_input",
    "output",
];

impl Reader<'_> {
    fn problem(&mut self, what: &str, why: impl std::fmt::Display) {
        self.problems
            .push(one_line(&format!("{}: {what}: {why}", self.shown)));
    }

    fn entry(&mut self, n: usize, entry: toml::Value) -> Option<(Option<String>, String, Dated)> {
        let toml::Value::Table(mut fields) = entry else {
            self.problem(&format!("price[{n}]"), "must be a [[price]] table");
            return None;
        };
        let label = label(n, &fields);
        let before = self.problems.len();
        let field = |reader: &mut Self, key: &str, why: &str| {
            reader.problem(&format!("{label}: {key}"), why);
        };
        for key in fields.keys() {
            if !ENTRY_KEYS.contains(&key.as_str()) {
                let why =
                    "unknown key: an entry takes service, model, from, input, cached_input, output";
                field(self, &format!("{key:?}"), why);
            }
        }
        let service = match fields.remove("service") {
            None => None,
            Some(toml::Value::String(s)) if name_ok(&s) => {
                if self
                    .services
                    .is_some_and(|known| !known.contains(&s.as_str()))
                {
                    field(self, "service", "names no service in [services]");
                }
                Some(s)
            }
            Some(_) => {
                field(self, "service", "must be a service name (non-empty text)");
                None
            }
        };
        let model = match fields.remove("model") {
            Some(toml::Value::String(s)) if name_ok(&s) => Some(s),
            Some(_) => {
                field(self, "model", "must be a model name (non-empty text)");
                None
            }
            None => {
                field(self, "model", "is required");
                None
            }
        };
        let from = match fields.remove("from") {
            Some(v) => day(&v).or_else(|| {
                field(self, "from", "must be a date, YYYY-MM-DD");
                None
            }),
            None => {
                field(self, "from", "is required");
                None
            }
        };
        let mut amount = |reader: &mut Self, key: &str, required: bool| match fields.remove(key) {
            Some(v) => price(&v).map_err(|why| field(reader, key, &why)).ok(),
            None if required => {
                field(reader, key, "is required");
                None
            }
            None => None,
        };
        let input = amount(self, "input", true);
        let cached_input = amount(self, "cached_input", false);
        let output = amount(self, "output", true);
        if self.problems.len() > before {
            return None;
        }
        let (model, from, input, output) = (model?, from?, input?, output?);
        let key = (service.clone(), model.clone(), from);
        if let Some(first) = self.seen.get(&key) {
            let why = format!("the same service, model and from as price[{first}]");
            self.problem(&label, why);
            return None;
        }
        self.seen.insert(key, n);
        let price = Price {
            input,
            cached_input: cached_input.unwrap_or(input),
            output,
        };
        Some((service, model, Dated { from, price }))
    }
}

/// `price[3] (service "chatx", model "x-large-2", from 2026-11-01)`: an entry named by what it
/// says of itself (what it says legibly), so it is found without counting entries. Counted
/// from 1, in the file's order.
fn label(n: usize, fields: &toml::Table) -> String {
    let mut name = Vec::new();
    for key in ["service", "model"] {
        if let Some(toml::Value::String(s)) = fields.get(key) {
            name.push(format!("{key} {s:?}"));
        }
    }
    if let Some(from) = fields.get("from").and_then(day) {
        name.push(format!("from {}", date(from)));
    }
    match name.is_empty() {
        true => format!("price[{n}]"),
        false => format!("price[{n}] ({})", name.join(", ")),
    }
}

/// `from`: `"2026-11-01"`, or TOML's own date, `2026-11-01`, unquoted.
fn day(v: &toml::Value) -> Option<i64> {
    match v {
        toml::Value::String(s) => parse_date(s),
        toml::Value::Datetime(d) if d.time.is_none() && d.offset.is_none() => {
            parse_date(&d.to_string())
        }
        _ => None,
    }
}

/// Service and model names are compared as sent; they must be text one can read back.
pub(super) fn name_ok(s: &str) -> bool {
    !s.is_empty() && !s.chars().any(char::is_control)
}

/// A price per million tokens as written (an integer or a decimal number), in billionths,
/// rounded half up past nine decimals.
fn price(v: &toml::Value) -> Result<u64, String> {
    const WHY: &str = "must be a non-negative number (per million tokens)";
    let text = match v {
        toml::Value::Integer(i) => i.to_string(),
        // Rust prints a double as the shortest decimal that reads back to it: the digits
        // written in the file, for any price of up to 15 significant digits.
        toml::Value::Float(f) if f.is_finite() => f.to_string(),
        _ => return Err(WHY.to_string()),
    };
    match decimal::scaled(&text, 9, Rounding::HalfUp) {
        Ok(billionths) if billionths <= u128::from(MAX_PRICE) => Ok(billionths as u64),
        Ok(_) | Err(DecimalError::TooLarge) => Err(format!(
            "must be at most {} (per million tokens)",
            MAX_PRICE / 1_000_000_000
        )),
        Err(_) => Err(WHY.to_string()),
    }
}

/// The table as a price table file writes it: `text(2_500_000_000)` is `2.5`.
pub(crate) fn price_text(billionths: u64) -> String {
    decimal::text(u128::from(billionths), 9)
}

#[cfg(test)]
mod tests;
