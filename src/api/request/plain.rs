//! What serde_json's parse refuses in a value its `ignore_value` accepted, checked on the
//! value's text without unescaping it: nesting beyond its limit, a `\u` escape of a lone
//! surrogate, a number too large for an f64. The checks err on the side of refusing: a value
//! they do not clear is read again the exact way (`Skip` in the exact pass), which decides.

/// The nesting a skipped value may have; the shapes around it are a few levels deep, so with
/// them it stays well inside serde_json's limit of 128.
const NESTING: usize = 64;

/// Digits before a number's point (plus its exponent) that are surely finite as an f64: it
/// stays under 10 to this, below the largest f64 (about 1.8e308).
const DIGITS: usize = 308;

/// Whether `raw`, one JSON value that serde_json's `ignore_value` accepted, would also pass
/// serde_json's parse (`deserialize_any` all the way down) a few levels deep in a body.
pub(super) fn plain(raw: &[u8]) -> bool {
    let suspect = Suspect::of(raw);
    (suspect.opening <= NESTING || nesting(raw).is_some_and(|deepest| deepest <= NESTING))
        && (!suspect.unicode || surrogates_paired(raw))
        && (!suspect.exponent || exponents_small(raw))
        && no_long_digit_runs(raw)
}

/// What one quick look at every byte pair of a value finds: how many brackets open (quoted
/// ones too), and whether a `\u` or a digit followed by `e` or `E` occurs anywhere (in
/// strings too). Most values have few brackets and neither pair, and need nothing more.
struct Suspect {
    opening: usize,
    unicode: bool,
    exponent: bool,
}

impl Suspect {
    fn of(raw: &[u8]) -> Suspect {
        // Chunks of byte counters and flags over the pairs: a shape the compiler vectorizes.
        const CHUNK: usize = 64;
        let Some((&first, rest)) = raw.split_first() else {
            return Suspect {
                opening: 0,
                unicode: false,
                exponent: false,
            };
        };
        let mut opening = usize::from((first == b'[') | (first == b'{'));
        let (mut unicode, mut exponent) = (false, false);
        let pairs = raw[..rest.len()].chunks(CHUNK).zip(rest.chunks(CHUNK));
        for (firsts, seconds) in pairs {
            let (mut open, mut u, mut e) = (0u8, 0u8, 0u8);
            for (&a, &b) in firsts.iter().zip(seconds) {
                open += u8::from((b == b'[') | (b == b'{'));
                u |= u8::from((a == b'\\') & (b == b'u'));
                e |= u8::from(a.is_ascii_digit() & ((b | 0x20) == b'e'));
            }
            opening += usize::from(open);
            unicode |= u != 0;
            exponent |= e != 0;
        }
        Suspect {
            opening,
            unicode,
            exponent,
        }
    }
}

/// The deepest nesting of arrays and objects in valid JSON; None if it is not valid.
fn nesting(raw: &[u8]) -> Option<usize> {
    let (mut depth, mut deepest, mut i) = (0usize, 0, 0);
    while let Some(&b) = raw.get(i) {
        i += 1;
        match b {
            b'"' => loop {
                let at = i + memchr::memchr2(b'"', b'\\', raw.get(i..)?)?;
                match raw[at] {
                    b'"' => {
                        i = at + 1;
                        break;
                    }
                    // An escape is two bytes at least (`\"`, `\\`, or a `\u` whose digits
                    // hold no quote).
                    _ => i = at + 2,
                }
            },
            b'[' | b'{' => {
                depth += 1;
                deepest = deepest.max(depth);
            }
            b']' | b'}' => depth = depth.checked_sub(1)?,
            _ => {}
        }
    }
    Some(deepest)
}

/// Every `\u` escape of a surrogate is a leading one followed by a `\u` escape of a trailing
/// one, as serde_json's parse requires of a string (its `ignore_value` takes any four hex
/// digits). The text is valid JSON, so a backslash outside strings cannot occur, and a `\u`
/// starts an escape exactly when the run of backslashes it ends is odd.
fn surrogates_paired(raw: &[u8]) -> bool {
    let mut checked = 0;
    for at in memchr::memmem::find_iter(raw, b"\\u") {
        if at < checked {
            continue;
        }
        let run = raw[..=at].iter().rev().take_while(|&&b| b == b'\\').count();
        if run % 2 == 0 {
            continue;
        }
        match hex(raw, at + 2) {
            Some(0xD800..=0xDBFF) => {
                if raw.get(at + 6..at + 8) != Some(b"\\u") {
                    return false;
                }
                match hex(raw, at + 8) {
                    Some(0xDC00..=0xDFFF) => checked = at + 12,
                    _ => return false,
                }
            }
            Some(0xDC00..=0xDFFF) | None => return false,
            Some(_) => {}
        }
    }
    true
}

/// The four hex digits at `at`.
fn hex(raw: &[u8], at: usize) -> Option<u16> {
    let digits = raw.get(at..at + 4)?;
    digits.iter().try_fold(0u16, |n, &d| {
        let digit = char::from(d).to_digit(16)?;
        Some(n << 4 | digit as u16)
    })
}

// No number may be so large that serde_json's parse refuses it as out of range (it turns
// every number that is neither u64 nor i64 into an f64, and an infinite one is an error).
// Such a number has more than [`DIGITS`] digits before its point or an exponent; both are
// looked for in the whole text, strings included (a string that only looks like such a
// number sends the value to the exact pass).

/// No run of [`DIGITS`] digits. Any run that long holds one of every 64th byte, so only the
/// runs through those are measured.
fn no_long_digit_runs(raw: &[u8]) -> bool {
    let mut i = 0;
    while let Some(b) = raw.get(i) {
        if b.is_ascii_digit() {
            let start = i - raw[..i]
                .iter()
                .rev()
                .take_while(|b| b.is_ascii_digit())
                .count();
            let end = i + raw[i..].iter().take_while(|b| b.is_ascii_digit()).count();
            if end - start >= DIGITS {
                return false;
            }
            i = end;
        }
        i += 64;
    }
    true
}

/// Every exponent (an `e` or `E` after a digit) small enough: the digits before the point
/// plus a positive exponent at most [`DIGITS`] (a negative one never overflows). Blocks are
/// first searched for such a pair in a loop the compiler vectorizes.
fn exponents_small(raw: &[u8]) -> bool {
    const BLOCK: usize = 1024;
    let is_exponent = |before: u8, b: u8| before.is_ascii_digit() & ((b | 0x20) == b'e');
    let mut start = 1;
    while start < raw.len() {
        let end = (start + BLOCK).min(raw.len());
        let pairs = raw[start - 1..end - 1].iter().zip(&raw[start..end]);
        let found = pairs.fold(false, |found, (&before, &b)| found | is_exponent(before, b));
        if found {
            for e in start..end {
                if is_exponent(raw[e - 1], raw[e]) && !exponent_small(raw, e) {
                    return false;
                }
            }
        }
        start = end;
    }
    true
}

/// Whether the number whose `e` is at `e` stays under 10 to the [`DIGITS`].
fn exponent_small(raw: &[u8], e: usize) -> bool {
    let digits_back = |end: usize| {
        raw[..end]
            .iter()
            .rev()
            .take_while(|b| b.is_ascii_digit())
            .count()
    };
    let mut point = e - digits_back(e);
    let mut integer = e - point;
    if point > 0 && raw[point - 1] == b'.' {
        point -= 1;
        integer = digits_back(point);
    }
    let after = &raw[e + 1..];
    let (negative, digits) = match after.first() {
        Some(b'-') => (true, &after[1..]),
        Some(b'+') => (false, &after[1..]),
        _ => (false, after),
    };
    if negative {
        return true;
    }
    let exponent = digits
        .iter()
        .take_while(|b| b.is_ascii_digit())
        .try_fold(0usize, |n, &d| {
            let n = n * 10 + usize::from(d - b'0');
            (n <= DIGITS).then_some(n)
        });
    exponent.is_some_and(|exponent| integer + exponent <= DIGITS)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn is_plain(raw: &str) -> bool {
        plain(raw.as_bytes())
    }

    #[test]
    fn nesting_is_counted_outside_strings() {
        let nested = |depth: usize| format!("{}{}", "[".repeat(depth), "]".repeat(depth));
        assert!(is_plain(&nested(NESTING)));
        assert!(!is_plain(&nested(NESTING + 1)));
        // Many brackets, shallow: walked.
        let wide = format!("[{}]", vec!["{}"; 200].join(","));
        assert!(is_plain(&wide));
        let quoted = format!(r#"["{}\"{}"]"#, "[".repeat(100), "{".repeat(100));
        assert!(is_plain(&quoted));
        let deep_object = format!(r#"{}1{}"#, r#"{"a":"#.repeat(65), "}".repeat(65));
        assert!(!is_plain(&deep_object));
        let wide_deep = format!("[{},{}]", vec!["[]"; 100].join(","), nested(64));
        assert!(!is_plain(&wide_deep));
    }

    #[test]
    fn surrogates_must_pair() {
        assert!(is_plain(r#""\uD83D\uDE00""#));
        assert!(is_plain(r#""\ud83d\ude00 and \u00fc \u0041""#));
        assert!(!is_plain(r#""\uD83D""#));
        assert!(!is_plain(r#""\uD83D\u0041""#));
        assert!(!is_plain(r#""\uD83D\n""#));
        assert!(!is_plain(r#""\uDE00""#));
        assert!(!is_plain(r#""\uD83D\uD83D\uDE00""#));
        // Escaped backslashes before a `u` are no escape.
        assert!(is_plain(r#""\\uD800 \\\\uDE00""#));
        assert!(!is_plain(r#""\\\uD800""#));
        assert!(is_plain(r#"{"\uD83D\uDE00":"\u20AC"}"#));
        assert!(!is_plain(r#"{"\uDE00":1}"#));
    }

    #[test]
    fn numbers_must_be_finite() {
        for finite in [
            "1e300",
            "-1e300",
            "1.5e299",
            "1e-99999",
            "0.0000001e299",
            "12e288",
        ] {
            assert!(is_plain(finite), "{finite}");
        }
        for large in ["1e309", "-1e310", "1E400", "1e+309", "1.5e9999999999999"] {
            assert!(!is_plain(large), "{large}");
        }
        // Finite, but too close to the edge to clear without the exact pass.
        assert!(is_plain("1.5e307"));
        assert!(!is_plain("1.5e308"));
        let long = "9".repeat(DIGITS - 1);
        assert!(is_plain(&long));
        assert!(is_plain(&format!("{long}.5")));
        assert!(!is_plain(&"9".repeat(DIGITS)));
        assert!(!is_plain(&format!("[1,{}]", "9".repeat(400))));
        assert!(!is_plain(&format!("0.{}e1", "0".repeat(400))));
        // A string that looks like a large number is only sent to the exact pass.
        assert!(!is_plain(r#""version 2e999""#));
        assert!(is_plain(r#""call_3e5f9a", "2E5""#));
    }
}
