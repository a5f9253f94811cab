//! The query of `GET /v1/keys`: `owner`, and the page (`limit`, `cursor`). Pages are newest
//! first; a page's `next` cursor names its last key, and the next page starts after it.

use crate::store::PageEnd;

/// Keys in a page when `limit` is not given.
pub(crate) const DEFAULT_LIMIT: u32 = 100;
/// The largest page: a larger `limit` is clamped to it, so one request reads a bounded number
/// of rows whatever it asks for.
pub(crate) const MAX_LIMIT: u32 = 1000;

pub(crate) const BAD_LIMIT: &str =
    "limit must be a whole number of at least 1 (pages hold at most 1000)";
const BAD_CURSOR: &str =
    "cursor is not one this API gave out: send the `next` of the previous page";

#[derive(Debug, PartialEq, Eq)]
pub(crate) struct ListQuery {
    pub owner: Option<String>,
    pub limit: u32,
    pub after: Option<PageEnd>,
}

impl ListQuery {
    /// The query string's `owner`, `limit` and `cursor` (the last of each counts; other names
    /// are ignored), or the message of a 400.
    pub(crate) fn parse(query: Option<&str>) -> Result<ListQuery, &'static str> {
        let mut q = ListQuery {
            owner: None,
            limit: DEFAULT_LIMIT,
            after: None,
        };
        for (name, value) in form_urlencoded::parse(query.unwrap_or("").as_bytes()) {
            match &*name {
                "owner" => q.owner = Some(value.into_owned()),
                "limit" => q.limit = parse_limit(&value).ok_or(BAD_LIMIT)?,
                "cursor" => q.after = Some(parse_cursor(&value).ok_or(BAD_CURSOR)?),
                _ => {}
            }
        }
        Ok(q)
    }
}

pub(crate) fn parse_limit(value: &str) -> Option<u32> {
    if value.is_empty() || !value.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    // Digits only, so the parse fails only on a number too large for u64: clamped like any
    // other large one.
    let n = value.parse::<u64>().unwrap_or(u64::MAX);
    (n >= 1).then(|| n.min(u64::from(MAX_LIMIT)) as u32)
}

/// The `next` of a page ending at `end`: 32 lowercase hex digits, `created_at` (as 64 bits)
/// then the key id. Clients treat it as opaque (docs/console-and-key-api.md), so its form may
/// change; every string of this form names a position, so none of them is refused.
pub(crate) fn cursor(end: &PageEnd) -> String {
    format!("{:016x}{}", end.created_at as u64, end.key_id)
}

fn parse_cursor(value: &str) -> Option<PageEnd> {
    let hex = |s: &str| s.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f'));
    if value.len() != 32 || !hex(value) {
        return None;
    }
    let (time, key_id) = value.split_at(16);
    Some(PageEnd {
        created_at: u64::from_str_radix(time, 16).ok()? as i64,
        key_id: key_id.to_string(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn queries() {
        let q = ListQuery::parse(None).unwrap();
        assert_eq!((q.owner, q.limit, q.after), (None, DEFAULT_LIMIT, None));
        let end = PageEnd {
            created_at: 1_700_000_000,
            key_id: "00112233aabbccdd".into(),
        };
        let query = format!("owner=a%20b&limit=7&cursor={}&other=x", cursor(&end));
        let q = ListQuery::parse(Some(&query)).unwrap();
        assert_eq!(q.owner.as_deref(), Some("a b"));
        assert_eq!(q.limit, 7);
        assert_eq!(q.after, Some(end));
        for (limit, clamped) in [
            ("1000", 1000),
            ("1001", 1000),
            ("99999999999999999999999", 1000),
        ] {
            let q = ListQuery::parse(Some(&format!("limit={limit}"))).unwrap();
            assert_eq!(q.limit, clamped, "{limit}");
        }
        for bad in ["0", "", "-1", "+5", "1.5", "ten", " 5"] {
            let query = format!("limit={}", bad.replace(' ', "%20").replace('+', "%2B"));
            assert_eq!(ListQuery::parse(Some(&query)), Err(BAD_LIMIT), "{bad:?}");
        }
        for bad in [
            "",
            "abc",
            &"0".repeat(31),
            &"0".repeat(33),
            &"A".repeat(32),
            "null",
        ] {
            let query = format!("cursor={bad}");
            assert_eq!(ListQuery::parse(Some(&query)), Err(BAD_CURSOR), "{bad:?}");
        }
    }
}
