//! Decimal text to integers and back, exactly. Prices and amounts are written in decimal
//! (`2.50`, `1.5e-07`, `0.000001`) but held as integers of a fixed scale (billionths, micros):
//! converting through a float would turn `1.5e-07 × 10^6` into `0.15000000000000002`, so the
//! digits are shifted as text instead.

/// What to do with digits below the scale.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Rounding {
    /// Round half up (away from zero): prices read from a table or another tool.
    HalfUp,
    /// Refuse: an amount someone set must be held as written.
    Exact,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum DecimalError {
    /// Not `digits[.digits][e[±]digits]`.
    NotANumber,
    /// Below zero (`-0` is zero).
    Negative,
    /// Digits below the scale, with `Rounding::Exact`.
    TooPrecise,
    /// Too large for the integer.
    TooLarge,
}

/// Exponents past this are as good as infinite: no scaled value fits, or every digit is dropped.
const EXPONENT_BOUND: i64 = 100_000;

/// `text` × 10^`scale` as an integer: `scaled("2.50", 9, _)` is 2_500_000_000 and
/// `scaled("1.5e-07", 15, _)` is 150_000_000. Reads JSON's number syntax (and Rust's float
/// `Display`, a subset of it).
pub(crate) fn scaled(text: &str, scale: u32, rounding: Rounding) -> Result<u128, DecimalError> {
    let (negative, magnitude) = match text.strip_prefix('-') {
        Some(rest) => (true, rest),
        None => (false, text),
    };
    let (mantissa, exponent) = match magnitude.find(['e', 'E']) {
        Some(at) => (&magnitude[..at], exponent(&magnitude[at + 1..])?),
        None => (magnitude, 0),
    };
    let (int, frac) = match mantissa.split_once('.') {
        Some((int, frac)) => (int, Some(frac)),
        None => (mantissa, None),
    };
    let all_digits = |s: &str| !s.is_empty() && s.bytes().all(|b| b.is_ascii_digit());
    if !all_digits(int) || frac.is_some_and(|f| !all_digits(f)) {
        return Err(DecimalError::NotANumber);
    }
    let frac = frac.unwrap_or("");
    // The value is `digits` × 10^`shift`, `digits` without leading zeros.
    let digits: Vec<u8> = (int.bytes().chain(frac.bytes()))
        .skip_while(|&b| b == b'0')
        .map(|b| b - b'0')
        .collect();
    if digits.iter().all(|&d| d == 0) {
        return Ok(0);
    }
    if negative {
        return Err(DecimalError::Negative);
    }
    let shift = exponent - frac.len() as i64 + i64::from(scale);
    let kept = digits.len() as i64 + shift;
    let (kept_digits, dropped) = if shift >= 0 {
        (&digits[..], &[][..])
    } else if kept <= 0 {
        (&[][..], &digits[..])
    } else {
        digits.split_at(kept as usize)
    };
    if kept > 39 {
        return Err(DecimalError::TooLarge);
    }
    let mut value: u128 = 0;
    for &d in kept_digits {
        value = (value.checked_mul(10))
            .and_then(|v| v.checked_add(u128::from(d)))
            .ok_or(DecimalError::TooLarge)?;
    }
    for _ in 0..shift.max(0) {
        value = value.checked_mul(10).ok_or(DecimalError::TooLarge)?;
    }
    match rounding {
        // The first dropped digit decides; when `kept < 0` it is one of the implied zeros.
        Rounding::HalfUp if kept >= 0 && dropped.first().is_some_and(|&d| d >= 5) => {
            value.checked_add(1).ok_or(DecimalError::TooLarge)
        }
        Rounding::HalfUp => Ok(value),
        Rounding::Exact if dropped.iter().any(|&d| d != 0) => Err(DecimalError::TooPrecise),
        Rounding::Exact => Ok(value),
    }
}

/// The exponent after `e`, clamped: a thousand-digit exponent is read as a huge one.
fn exponent(text: &str) -> Result<i64, DecimalError> {
    let (sign, digits) = match text.as_bytes().first() {
        Some(b'-') => (-1, &text[1..]),
        Some(b'+') => (1, &text[1..]),
        _ => (1, text),
    };
    if digits.is_empty() || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return Err(DecimalError::NotANumber);
    }
    let mut value: i64 = 0;
    for b in digits.bytes() {
        value = (value * 10 + i64::from(b - b'0')).min(EXPONENT_BOUND);
    }
    Ok(sign * value)
}

/// `value` / 10^`scale` in decimal, without trailing zeros: `text(1_500_000, 6)` is `1.5`,
/// `text(12_000_000, 6)` is `12`, `text(1, 6)` is `0.000001`.
pub(crate) fn text(value: u128, scale: u32) -> String {
    let unit = 10u128.pow(scale);
    let (int, frac) = (value / unit, value % unit);
    if frac == 0 {
        return int.to_string();
    }
    let frac = format!("{frac:0width$}", width = scale as usize);
    format!("{int}.{}", frac.trim_end_matches('0'))
}

#[cfg(test)]
mod tests {
    use super::Rounding::{Exact, HalfUp};
    use super::*;

    #[test]
    fn digits_are_shifted_not_multiplied() {
        assert_eq!(scaled("2.50", 9, Exact), Ok(2_500_000_000));
        assert_eq!(scaled("1.5e-07", 15, Exact), Ok(150_000_000));
        assert_eq!(scaled("1.5E-7", 15, Exact), Ok(150_000_000));
        assert_eq!(scaled("5.46875e-07", 15, Exact), Ok(546_875_000));
        assert_eq!(scaled("0.00000060", 15, Exact), Ok(600_000_000));
        assert_eq!(scaled("12", 6, Exact), Ok(12_000_000));
        assert_eq!(scaled("1e+2", 0, Exact), Ok(100));
        assert_eq!(scaled("0.000001", 6, Exact), Ok(1));
        assert_eq!(scaled("007.5", 1, Exact), Ok(75));
    }

    #[test]
    fn zeros_of_every_spelling_are_zero() {
        for zero in [
            "0",
            "-0",
            "0.0",
            "-0.0",
            "0.000000",
            "0e5",
            "0e-99999999999",
            "00",
        ] {
            assert_eq!(scaled(zero, 9, Exact), Ok(0), "{zero}");
        }
    }

    #[test]
    fn digits_below_the_scale_round_half_up_or_are_refused() {
        assert_eq!(scaled("0.0000005", 6, HalfUp), Ok(1));
        assert_eq!(scaled("0.00000049", 6, HalfUp), Ok(0));
        assert_eq!(scaled("2.4999999999", 9, HalfUp), Ok(2_500_000_000));
        assert_eq!(scaled("1e-20", 6, HalfUp), Ok(0));
        assert_eq!(scaled("9.9999999995", 9, HalfUp), Ok(10_000_000_000));
        assert_eq!(scaled("0.0000005", 6, Exact), Err(DecimalError::TooPrecise));
        assert_eq!(scaled("1.0000001", 6, Exact), Err(DecimalError::TooPrecise));
        assert_eq!(scaled("1.0000000", 6, Exact), Ok(1_000_000));
        assert_eq!(
            scaled("1e-99999999999", 6, Exact),
            Err(DecimalError::TooPrecise)
        );
    }

    #[test]
    fn refuses_what_is_not_a_non_negative_number_that_fits() {
        for bad in [
            "", "-", ".5", "5.", "1..2", "1.2.3", "+1", "1e", "1e+", "e5", "0x10", " 1", "1 ",
            "NaN", "inf", "1_000", "١",
        ] {
            assert_eq!(
                scaled(bad, 6, HalfUp),
                Err(DecimalError::NotANumber),
                "{bad:?}"
            );
        }
        assert_eq!(scaled("-0.5", 6, HalfUp), Err(DecimalError::Negative));
        assert_eq!(scaled("-1e-30", 6, HalfUp), Err(DecimalError::Negative));
        assert_eq!(scaled("1e39", 0, HalfUp), Err(DecimalError::TooLarge));
        assert_eq!(
            scaled("1e99999999999", 6, HalfUp),
            Err(DecimalError::TooLarge)
        );
        let max = u128::MAX.to_string();
        assert_eq!(scaled(&max, 0, HalfUp), Ok(u128::MAX));
        assert_eq!(
            scaled(&(max.clone() + ".5"), 0, HalfUp),
            Err(DecimalError::TooLarge)
        );
        assert_eq!(scaled(&(max + "0"), 0, HalfUp), Err(DecimalError::TooLarge));
    }

    #[test]
    fn text_has_no_trailing_zeros() {
        assert_eq!(text(0, 6), "0");
        assert_eq!(text(1, 6), "0.000001");
        assert_eq!(text(1_500_000, 6), "1.5");
        assert_eq!(text(12_000_000, 6), "12");
        assert_eq!(text(150_000_000, 9), "0.15");
        assert_eq!(text(u128::from(u64::MAX), 6), "18446744073709.551615");
        for v in [0u128, 1, 10, 999_999, 1_000_001, 123_456_789_012] {
            assert_eq!(scaled(&text(v, 6), 6, Exact), Ok(v));
        }
    }
}
