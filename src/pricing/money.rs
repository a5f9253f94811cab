//! Money as people and JSON write it. The gateway counts in micros (millionths of the
//! currency, integers, exact); answers, tables and flags show currency units with at most six
//! decimals (`1.5`, `0.000001`). Used by the ledger, usage and budget code.

use super::decimal::{self, DecimalError, Rounding};

/// Micros in one unit of the currency.
const MICROS: u64 = 1_000_000;
/// The largest amount accepted, in micros: the stores keep amounts as signed 64-bit integers.
const MAX_MICROS: u64 = i64::MAX as u64;

/// `micros` as a JSON number in currency units: `1_500_000` → `1.5`, `15` → `0.000015`, whole
/// units as integers (`12`). serde_json's numbers are doubles, printed in their shortest form:
/// exact (the same six decimals) for every amount below 2^32 units, about four billion;
/// beyond that, the nearest double. Below 0.00001 it prints JSON's exponent form, the same
/// number: `1` micro is `1e-6`.
pub(crate) fn units(micros: u64) -> serde_json::Number {
    if micros.is_multiple_of(MICROS) {
        return serde_json::Number::from(micros / MICROS);
    }
    // Both operands are exact doubles and the division is correctly rounded, so this is the
    // double nearest to the exact decimal, which serde_json prints as its shortest form.
    serde_json::Number::from_f64(micros as f64 / MICROS as f64)
        .unwrap_or_else(|| serde_json::Number::from(micros / MICROS))
}

/// `micros` as text in currency units (`1.5`, `0.000001`, `12`): exact for every `u64`.
pub(crate) fn units_text(micros: u64) -> String {
    decimal::text(u128::from(micros), 6)
}

/// An amount in currency units from JSON (a number, `12.5`) as micros. A double a client
/// computed (`0.1 + 0.2` is `0.30000000000000004`) is read as the six-decimal amount it is
/// within a rounding error of; a real seventh decimal is refused.
pub(crate) fn parse_units_json(v: &serde_json::Value) -> Result<u64, String> {
    match v {
        // The number's own text: an integer as sent, a double in its shortest form, which
        // has the digits the client wrote when they fit a double.
        serde_json::Value::Number(n) => micros(&n.to_string()).or_else(|e| {
            let scaled = n
                .as_f64()
                .filter(|f| f.is_finite() && *f >= 0.0)
                .map(|f| f * 1e6);
            match scaled {
                Some(m) if (m - m.round()).abs() <= (m.abs() * 4.0 * f64::EPSILON).max(1e-6) => {
                    micros(&units_text(m.round() as u64))
                }
                _ => Err(e),
            }
        }),
        _ => Err("must be a number of currency units, like 12.5".to_string()),
    }
}

/// An amount in currency units as typed on the command line (`12.5`, `0.000001`, `100`).
pub(crate) fn parse_units_text(s: &str) -> Result<u64, String> {
    let plain = |part: &str| !part.is_empty() && part.bytes().all(|b| b.is_ascii_digit());
    let digits = s.strip_prefix('-').unwrap_or(s);
    let well_formed = match digits.split_once('.') {
        Some((int, frac)) => plain(int) && plain(frac),
        None => plain(digits),
    };
    if !well_formed {
        return Err(format!(
            "{s:?} is not an amount: digits with at most 6 decimals, like 12.5"
        ));
    }
    micros(s)
}

fn micros(text: &str) -> Result<u64, String> {
    let value = decimal::scaled(text, 6, Rounding::Exact).map_err(|e| match e {
        DecimalError::NotANumber => format!("{text} is not a number"),
        DecimalError::Negative => format!("{text} is negative: an amount is 0 or more"),
        DecimalError::TooPrecise => {
            format!("{text} has more than 6 decimals: amounts are counted in millionths")
        }
        DecimalError::TooLarge => too_large(text),
    })?;
    u64::try_from(value)
        .ok()
        .filter(|&v| v <= MAX_MICROS)
        .ok_or_else(|| too_large(text))
}

fn too_large(text: &str) -> String {
    format!("{text} is too large: at most {}", units_text(MAX_MICROS))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn units_print_at_most_six_decimals() {
        for (micros, shown) in [(1, "1e-6"), (9, "9e-6")] {
            assert_eq!(units(micros).to_string(), shown, "{micros}");
        }
        assert_eq!(units_text(1), "0.000001");
        for (micros, shown) in [
            (0, "0"),
            (10, "0.00001"),
            (15, "0.000015"),
            (1_500_000, "1.5"),
            (12_000_000, "12"),
            (123_456_789, "123.456789"),
            (2_500_000_000, "2500"),
            (4_294_967_295_999_999, "4294967295.999999"),
        ] {
            assert_eq!(units(micros).to_string(), shown, "{micros}");
            assert_eq!(units_text(micros), shown, "{micros}");
        }
        assert_eq!(units_text(u64::MAX), "18446744073709.551615");
    }

    #[test]
    fn units_read_back_to_the_same_micros() {
        // Every amount below 2^32 units survives JSON: a spread of them, and the edges.
        const BOUND: u64 = 4_294_967_296_000_000;
        let mut m: u64 = 1;
        while m < BOUND {
            for micros in [m, m + 1, m * 7 + 3, m - 1]
                .into_iter()
                .filter(|&x| x < BOUND)
            {
                let back = parse_units_json(&serde_json::Value::Number(units(micros)));
                assert_eq!(back, Ok(micros), "{micros}");
            }
            m = m * 3 + 1;
        }
        let top = 4_294_967_295_999_999;
        assert_eq!(parse_units_json(&json!(units(top))), Ok(top));
    }

    #[test]
    fn json_amounts_are_numbers_with_at_most_six_decimals() {
        assert_eq!(parse_units_json(&json!(12.5)), Ok(12_500_000));
        assert_eq!(parse_units_json(&json!(0.1)), Ok(100_000));
        assert_eq!(parse_units_json(&json!(0.000001)), Ok(1));
        assert_eq!(parse_units_json(&json!(100)), Ok(100_000_000));
        assert_eq!(parse_units_json(&json!(0)), Ok(0));
        assert_eq!(parse_units_json(&json!(-0.0)), Ok(0));
        assert_eq!(parse_units_json(&json!(1e3)), Ok(1_000_000_000));
        // A double's rounding error is not a seventh decimal.
        assert_eq!(parse_units_json(&json!(0.1 + 0.2)), Ok(300_000));
        assert_eq!(parse_units_json(&json!(7.0 * 0.000001)), Ok(7));
        let refused = |v: serde_json::Value, why: &str| {
            let e = parse_units_json(&v).unwrap_err();
            assert!(e.contains(why), "{v}: {e}");
        };
        refused(json!(-1), "negative");
        refused(json!(-0.5), "negative");
        refused(json!(1.0000001), "more than 6 decimals");
        refused(json!(0.0000001), "more than 6 decimals");
        refused(
            json!(9_223_372_036_855_u64),
            "too large: at most 9223372036854.775807",
        );
        refused(json!(1e300), "too large");
        refused(json!(u64::MAX), "too large");
        refused(json!("12.5"), "must be a number");
        refused(json!(null), "must be a number");
    }

    #[test]
    fn text_amounts_are_plain_decimals() {
        assert_eq!(parse_units_text("12.5"), Ok(12_500_000));
        assert_eq!(parse_units_text("0.000001"), Ok(1));
        assert_eq!(parse_units_text("100"), Ok(100_000_000));
        assert_eq!(parse_units_text("0"), Ok(0));
        assert_eq!(parse_units_text("1.500000"), Ok(1_500_000));
        assert_eq!(
            parse_units_text("9223372036854.775807"),
            Ok(9_223_372_036_854_775_807)
        );
        for (bad, why) in [
            ("", "not an amount"),
            ("1e3", "not an amount"),
            ("1,5", "not an amount"),
            (".5", "not an amount"),
            ("5.", "not an amount"),
            ("+5", "not an amount"),
            (" 5", "not an amount"),
            ("NaN", "not an amount"),
            ("inf", "not an amount"),
            ("-5", "negative"),
            ("0.0000001", "more than 6 decimals"),
            ("9223372036854.775808", "too large"),
            ("99999999999999999999999999999999999999999", "too large"),
        ] {
            let e = parse_units_text(bad).unwrap_err();
            assert!(e.contains(why), "{bad:?}: {e}");
        }
    }
}
