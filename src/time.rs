//! Time as the gateway shows and reads it, without a date crate: UTC RFC 3339 timestamps (key
//! listings, the access log), the clock in unix seconds, and the `30s`/`15m`/`12h`/`90d`
//! durations of the CLI and the key API.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// Now, in unix seconds.
pub(crate) fn unix_now() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs() as i64)
        .unwrap_or(0)
}

/// The clock a component reads "now" from: the system's, or in tests a fixed one, so no
/// test depends on today's date.
#[derive(Clone, Debug, Default)]
pub(crate) struct Clock(Option<std::sync::Arc<std::sync::atomic::AtomicI64>>);

impl Clock {
    /// The system clock.
    pub(crate) fn system() -> Clock {
        Clock(None)
    }

    /// A clock standing still at `secs`.
    #[cfg(test)]
    pub(crate) fn fixed(secs: i64) -> Clock {
        Clock(Some(std::sync::Arc::new(secs.into())))
    }

    /// Now, in unix seconds.
    pub(crate) fn now(&self) -> i64 {
        match &self.0 {
            Some(t) => t.load(std::sync::atomic::Ordering::Relaxed),
            None => unix_now(),
        }
    }
}

/// `2026-01-05T10:11:12Z` from unix seconds.
pub(crate) fn rfc3339(secs: i64) -> String {
    let (y, mo, d, h, mi, s) = civil(secs);
    format!("{y:04}-{mo:02}-{d:02}T{h:02}:{mi:02}:{s:02}Z")
}

/// Room for `rfc3339_millis_into` of any `SystemTime`: a year of up to 20 digits.
pub(crate) const RFC3339_MILLIS_MAX: usize = 40;

/// `2026-01-05T10:11:12.345Z` written into `buf`, for the access log, which writes one per
/// request: digits put in place, no allocation and no formatting machinery for a four-digit
/// year.
pub(crate) fn rfc3339_millis_into(t: SystemTime, buf: &mut [u8; RFC3339_MILLIS_MAX]) -> &str {
    let since = t.duration_since(UNIX_EPOCH).unwrap_or_default();
    let (y, mo, d, h, mi, s) = civil(since.as_secs() as i64);
    let ms = i64::from(since.subsec_millis());
    let len = if (0..=9999).contains(&y) {
        let mut at = 0;
        let mut put = |n: i64, width: usize, then: u8| {
            for i in (0..width).rev() {
                buf[at + i] = b'0' + (n / 10_i64.pow((width - 1 - i) as u32) % 10) as u8;
            }
            buf[at + width] = then;
            at += width + 1;
        };
        put(y, 4, b'-');
        put(mo, 2, b'-');
        put(d, 2, b'T');
        put(h, 2, b':');
        put(mi, 2, b':');
        put(s, 2, b'.');
        put(ms, 3, b'Z');
        at
    } else {
        use std::io::Write;
        let mut out = std::io::Cursor::new(&mut buf[..]);
        // 20 digits and 20 more characters fit.
        let _ = write!(out, "{y:04}-{mo:02}-{d:02}T{h:02}:{mi:02}:{s:02}.{ms:03}Z");
        out.position() as usize
    };
    std::str::from_utf8(&buf[..len]).unwrap_or_default()
}

/// Year, month, day, hour, minute, second (Howard Hinnant's civil-from-days).
fn civil(secs: i64) -> (i64, i64, i64, i64, i64, i64) {
    let days = secs.div_euclid(86_400);
    let rem = secs.rem_euclid(86_400);
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    (year, month, day, rem / 3600, rem / 60 % 60, rem % 60)
}

/// `30s`, `15m`, `12h`, `90d`: a whole positive number and one unit.
pub(crate) fn parse_duration(s: &str) -> Result<Duration, String> {
    let bad = || format!("{s:?} is not a duration like 30s, 15m, 12h or 90d");
    // Split off the last character, not byte: the input is whatever the user typed.
    let unit = s.chars().next_back().ok_or_else(bad)?;
    let digits = &s[..s.len() - unit.len_utf8()];
    let unit_secs = match unit {
        's' => 1,
        'm' => 60,
        'h' => 3600,
        'd' => 86_400,
        _ => return Err(bad()),
    };
    if digits.is_empty() || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return Err(bad());
    }
    let n: u64 = digits.parse().map_err(|_| bad())?;
    if n == 0 {
        return Err(bad());
    }
    n.checked_mul(unit_secs)
        .map(Duration::from_secs)
        .ok_or_else(bad)
}

/// The last second of the year 9999 (UTC): RFC 3339 times have four-digit years.
pub(crate) const MAX_EXPIRY: i64 = 253_402_300_799;

/// A key lifetime from `now`: a duration that ends by the year 9999.
pub(crate) fn parse_lifetime(s: &str, now: i64) -> Result<Duration, String> {
    let d = parse_duration(s)?;
    let fits = i64::try_from(d.as_secs())
        .ok()
        .and_then(|secs| now.checked_add(secs))
        .is_some_and(|at| at <= MAX_EXPIRY);
    if !fits {
        return Err(format!("{s:?} would end after the year 9999"));
    }
    Ok(d)
}

/// `2026-01-05` from unix seconds: the UTC day they fall in.
pub(crate) fn date(secs: i64) -> String {
    let (y, mo, d, ..) = civil(secs);
    format!("{y:04}-{mo:02}-{d:02}")
}

/// Unix seconds of the starts of the UTC month that `secs` falls in and of the next one.
pub(crate) fn month_bounds(secs: i64) -> (i64, i64) {
    let (y, m, ..) = civil(secs);
    let day_start = secs - secs.rem_euclid(86_400);
    let (_, _, d, ..) = civil(secs);
    let start = day_start - (d - 1) * 86_400;
    let (ny, nm) = if m == 12 { (y + 1, 1) } else { (y, m + 1) };
    let next = parse_date(&format!("{ny:04}-{nm:02}-01")).unwrap_or(start + 31 * 86_400);
    (start, next)
}

/// Unix seconds of the start of a UTC day written `YYYY-MM-DD` (years 0001 to 9999), or None
/// for anything else, impossible dates (`2026-02-30`) included.
pub(crate) fn parse_date(s: &str) -> Option<i64> {
    let b = s.as_bytes();
    let digits = |r: std::ops::Range<usize>| {
        b[r.clone()]
            .iter()
            .all(u8::is_ascii_digit)
            .then(|| s[r].parse::<i64>().ok())?
    };
    if b.len() != 10 || b[4] != b'-' || b[7] != b'-' {
        return None;
    }
    let (y, m, d) = (digits(0..4)?, digits(5..7)?, digits(8..10)?);
    if y < 1 || !(1..=12).contains(&m) || d < 1 {
        return None;
    }
    // Howard Hinnant's days-from-civil; the round trip rejects days past the month's end.
    let (yy, mm) = if m <= 2 { (y - 1, m + 9) } else { (y, m - 3) };
    let era = yy.div_euclid(400);
    let yoe = yy - era * 400;
    let doy = (153 * mm + 2) / 5 + d - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    let secs = (era * 146_097 + doe - 719_468) * 86_400;
    (civil(secs).2 == d).then_some(secs)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dates() {
        assert_eq!(parse_date("1970-01-01"), Some(0));
        assert_eq!(parse_date("2000-02-29"), Some(951_782_400));
        assert_eq!(
            parse_date("2026-11-18"),
            Some(1_795_000_000 / 86_400 * 86_400)
        );
        assert_eq!(date(1_795_000_000), "2026-11-18");
        assert_eq!(date(parse_date("9999-12-31").unwrap()), "9999-12-31");
        assert_eq!(date(parse_date("0001-01-01").unwrap()), "0001-01-01");
        assert_eq!(parse_date("1969-12-31"), Some(-86_400));
        for bad in [
            "",
            "2026-1-01",
            "2026-13-01",
            "2026-02-30",
            "2025-02-29",
            "2026-00-10",
            "2026-01-00",
            "0000-01-01",
            "2026/01/01",
            "+026-01-01",
            "2026-01-01T",
            "２０２６-01-01",
        ] {
            assert_eq!(parse_date(bad), None, "{bad}");
        }
    }

    #[test]
    fn months() {
        let nov = parse_date("2026-11-01").unwrap();
        let dec = parse_date("2026-12-01").unwrap();
        let jan = parse_date("2027-01-01").unwrap();
        assert_eq!(month_bounds(nov), (nov, dec));
        assert_eq!(month_bounds(dec - 1), (nov, dec));
        assert_eq!(month_bounds(dec + 86_400 * 30 + 5), (dec, jan));
        let feb = parse_date("2028-02-01").unwrap();
        assert_eq!(
            month_bounds(feb + 28 * 86_400).1,
            parse_date("2028-03-01").unwrap()
        );
    }

    fn rfc3339_millis(t: SystemTime) -> String {
        let mut buf = [0; RFC3339_MILLIS_MAX];
        rfc3339_millis_into(t, &mut buf).to_string()
    }

    #[test]
    fn formats_utc_times() {
        assert_eq!(rfc3339(0), "1970-01-01T00:00:00Z");
        assert_eq!(rfc3339(1_795_000_000), "2026-11-18T11:06:40Z");
        assert_eq!(rfc3339(951_782_400), "2000-02-29T00:00:00Z");
        let t = UNIX_EPOCH + Duration::from_millis(1_795_000_000_042);
        assert_eq!(rfc3339_millis(t), "2026-11-18T11:06:40.042Z");
        assert_eq!(rfc3339_millis(UNIX_EPOCH), "1970-01-01T00:00:00.000Z");
        let t = UNIX_EPOCH + Duration::from_millis(253_402_300_799_999);
        assert_eq!(rfc3339_millis(t), "9999-12-31T23:59:59.999Z");
        let t = UNIX_EPOCH + Duration::from_millis(253_402_300_800_007);
        assert_eq!(rfc3339_millis(t), "10000-01-01T00:00:00.007Z");
        let t = UNIX_EPOCH + Duration::from_secs(i64::MAX as u64 / 2);
        let far = rfc3339_millis(t);
        assert!(far.len() > 24 && far.ends_with(".000Z"), "{far}");
    }

    #[test]
    fn durations() {
        assert_eq!(parse_duration("30s"), Ok(Duration::from_secs(30)));
        assert_eq!(parse_duration("15m"), Ok(Duration::from_secs(900)));
        assert_eq!(parse_duration("12h"), Ok(Duration::from_secs(43_200)));
        assert_eq!(parse_duration("90d"), Ok(Duration::from_secs(7_776_000)));
        for bad in [
            "",
            "s",
            "10",
            "0s",
            "-5m",
            "+5m",
            "1.5h",
            "10w",
            "99999999999999999999d",
            "5é",
            "é",
            "1ds",
            "٣s",
        ] {
            assert!(parse_duration(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn lifetimes_end_by_the_year_9999() {
        let now = 1_800_000_000;
        assert_eq!(
            parse_lifetime("90d", now),
            Ok(Duration::from_secs(7_776_000))
        );
        for past_9999 in ["10000000000000000000s", "3000000d", "18446744073709551615s"] {
            let err = parse_lifetime(past_9999, now).unwrap_err();
            assert!(err.contains("9999"), "{past_9999}: {err}");
        }
        let last = (MAX_EXPIRY - now).to_string() + "s";
        assert!(parse_lifetime(&last, now).is_ok());
        let one_more = (MAX_EXPIRY - now + 1).to_string() + "s";
        assert!(parse_lifetime(&one_more, now).is_err());
    }
}
