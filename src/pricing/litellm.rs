//! `prices import --litellm`: LiteLLM's `model_prices_and_context_window.json`, the table most
//! teams already maintain, as a price table. Its prices are per token (`1.5e-07`); ours per
//! million tokens, so each is read from the JSON number's own text and its digits shifted,
//! never multiplied as a float (`0.15`, not `0.15000000000000002`).

use std::collections::BTreeMap;

use serde::Deserialize;
use serde_json::value::RawValue;

use super::decimal::{self, Rounding};
use super::table::{name_ok, price_text};

/// LiteLLM's description of its own fields, not a model.
const SAMPLE_SPEC: &str = "sample_spec";
/// Per token to billionths per million tokens: 10^6 × 10^9.
const SCALE: u32 = 15;

/// The fields read from an entry; LiteLLM's others (context sizes, per-image or per-second
/// prices, capabilities) are not prices per token.
#[derive(Deserialize)]
struct Entry<'a> {
    #[serde(borrow)]
    input_cost_per_token: Option<&'a RawValue>,
    #[serde(borrow)]
    cache_read_input_token_cost: Option<&'a RawValue>,
    #[serde(borrow)]
    output_cost_per_token: Option<&'a RawValue>,
}

/// What an import made: the table's text, and what it left out and why.
#[derive(Debug)]
pub(crate) struct Imported {
    pub table: String,
    pub entries: usize,
    /// Entries without both an input and an output price per token (images, search, …).
    pub skipped: usize,
    /// Entries whose prices could not be read: `model: why`.
    pub refused: Vec<String>,
}

/// Converts the JSON `text` (LiteLLM's file, named `source` in the header) to a price table
/// whose entries apply from `from` (YYYY-MM-DD), sorted by model.
pub(crate) fn import(text: &str, source: &str, from: &str) -> Result<Imported, String> {
    let models: BTreeMap<String, &RawValue> = serde_json::from_str(text)
        .map_err(|e| format!("{source}: not LiteLLM's JSON object of models: {e}"))?;
    let mut body = String::new();
    let (mut entries, mut skipped, mut refused) = (0, 0, Vec::new());
    for (model, raw) in models {
        if model == SAMPLE_SPEC {
            continue;
        }
        if !name_ok(&model) {
            refused.push(format!(
                "{model:?}: not a model name a table can hold (control characters)"
            ));
            continue;
        }
        let Ok(entry) = serde_json::from_str::<Entry<'_>>(raw.get()) else {
            refused.push(format!("{model:?}: not an object of fields"));
            continue;
        };
        let (Some(input), Some(output)) = (
            present(entry.input_cost_per_token),
            present(entry.output_cost_per_token),
        ) else {
            skipped += 1;
            continue;
        };
        let cached = present(entry.cache_read_input_token_cost);
        let per_million = |name: &str, v: &str| {
            decimal::scaled(v, SCALE, Rounding::HalfUp)
                .ok()
                .and_then(|b| u64::try_from(b).ok())
                .ok_or_else(|| format!("{model:?}: {name} {v} is not a non-negative number"))
        };
        let prices = (
            per_million("input_cost_per_token", input),
            cached
                .map(|v| per_million("cache_read_input_token_cost", v))
                .transpose(),
            per_million("output_cost_per_token", output),
        );
        let (input, cached, output) = match prices {
            (Ok(i), Ok(c), Ok(o)) => (i, c, o),
            (Err(e), ..) | (_, Err(e), _) | (.., Err(e)) => {
                refused.push(e);
                continue;
            }
        };
        entries += 1;
        body.push_str("\n[[price]]\n");
        body.push_str(&format!("model = {}\n", toml::Value::from(model)));
        body.push_str(&format!("from = \"{from}\"\n"));
        body.push_str(&format!("input = {}\n", price_text(input)));
        if let Some(cached) = cached {
            body.push_str(&format!("cached_input = {}\n", price_text(cached)));
        }
        body.push_str(&format!("output = {}\n", price_text(output)));
    }
    let table = format!(
        "# Converted by `portcullis prices import` from LiteLLM's {source}:\n\
         # {entries} models with input and output prices per token, dated {from}; {skipped} without\n\
         # them (images, search, ...) left out. Per million tokens, in LiteLLM's currency (USD).\n{body}"
    );
    Ok(Imported {
        table,
        entries,
        skipped,
        refused,
    })
}

/// A field's JSON text, unless it is absent or `null`.
fn present(field: Option<&RawValue>) -> Option<&str> {
    field.map(RawValue::get).filter(|v| *v != "null")
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::pricing::Prices;

    const FIXTURE: &str =
        include_str!("../../tests/fixtures/litellm/model_prices_and_context_window.json");
    const EXPECTED: &str = include_str!("../../tests/fixtures/litellm/expected_prices.toml");

    #[test]
    fn the_fixture_converts_to_the_expected_table_exactly() {
        let imported = import(
            FIXTURE,
            "model_prices_and_context_window.json",
            "2026-11-01",
        )
        .unwrap();
        assert_eq!(imported.table, EXPECTED);
        assert!(imported.refused.is_empty(), "{:?}", imported.refused);
        let prices = Prices::parse("expected_prices.toml", &imported.table).unwrap();
        assert_eq!(prices.len(), imported.entries);
    }

    #[test]
    fn prices_are_shifted_exactly_and_odd_entries_are_refused_by_name() {
        let json = r#"{
            "sample_spec": {"input_cost_per_token": 0.0, "output_cost_per_token": 0.0},
            "a": {"input_cost_per_token": 1.5e-07, "output_cost_per_token": 6E-7,
                  "cache_read_input_token_cost": 7.5e-08},
            "b": {"input_cost_per_token": 0.00000015, "output_cost_per_token": 0.0000006,
                  "cache_read_input_token_cost": null},
            "c": {"input_cost_per_token": 3.3333333333333335e-07, "output_cost_per_token": 1e-25},
            "d": {"input_cost_per_token": "0.1", "output_cost_per_token": 1e-06},
            "e": {"input_cost_per_token": -1e-06, "output_cost_per_token": 1e-06},
            "f": {"output_cost_per_token": 1e-06},
            "g": [1, 2],
            "h\"\n": {"input_cost_per_token": 1, "output_cost_per_token": 2},
            "q\"\\": {"input_cost_per_token": 1, "output_cost_per_token": 2}
        }"#;
        let imported = import(json, "x.json", "2020-01-01").unwrap();
        let t = &imported.table;
        assert!(t.contains("model = \"a\"\nfrom = \"2020-01-01\"\ninput = 0.15\ncached_input = 0.075\noutput = 0.6\n"), "{t}");
        assert!(
            t.contains("model = \"b\"\nfrom = \"2020-01-01\"\ninput = 0.15\noutput = 0.6\n"),
            "{t}"
        );
        // Past nine decimals per million, rounded half up.
        assert!(
            t.contains("model = \"c\"\nfrom = \"2020-01-01\"\ninput = 0.333333333\noutput = 0\n"),
            "{t}"
        );
        assert!(t.contains("input = 1000000\noutput = 2000000\n"), "{t}");
        assert!(!t.contains("sample_spec") && !t.contains("\"f\""), "{t}");
        assert_eq!((imported.entries, imported.skipped), (4, 1));
        assert_eq!(imported.refused.len(), 4, "{:?}", imported.refused);
        assert!(imported.refused[0].starts_with("\"d\": input_cost_per_token \"0.1\""));
        assert!(imported.refused[1].starts_with("\"e\": input_cost_per_token -1e-06"));
        assert!(imported.refused[2].starts_with("\"g\": not an object"));
        assert!(imported.refused[3].starts_with("\"h\\\"\\n\": not a model name"));
        let prices = Prices::parse("x.toml", t).unwrap();
        assert_eq!(prices.len(), 4);
        assert!(prices.price("s", "q\"\\", i64::MAX).is_some());
        assert!(import("[]", "x.json", "2020-01-01")
            .unwrap_err()
            .contains("x.json: not LiteLLM's"));
    }
}
