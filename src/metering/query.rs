//! What a usage report asks for, the same for `GET /v1/usage` and `portcullis usage`: a range
//! of UTC days (`from`/`to`, inclusive; by default the 30 days ending today, at most
//! `MAX_DAYS`), the parts to split totals by (`group_by`: day, key, service, model, team; by
//! default the first four) and whose usage (`owner`, `team`).

use crate::store::{Grouping, UsageQuery};
use crate::time::parse_date;

/// The longest range one report covers, in days.
pub(crate) const MAX_DAYS: i64 = 366;
/// Days covered when `from` is not given: the 30 days ending with `to`.
pub(crate) const DEFAULT_DAYS: i64 = 30;
const DAY: i64 = 86_400;

/// The query for the days `from..=to` (either may be absent), grouped by `group_by` (absent:
/// day, key, service and model), of `owner` and of `team`'s owners, or of everyone; `now` is
/// the time in unix seconds. The error names the parameter, as a 400's message or the CLI's one
/// line.
pub(crate) fn usage_query(
    from: Option<&str>,
    to: Option<&str>,
    group_by: Option<&str>,
    (owner, team): (Option<String>, Option<String>),
    now: i64,
) -> Result<UsageQuery, String> {
    let day = |name: &str, value: &str| {
        parse_date(value).ok_or_else(|| format!("{name} must be a UTC day written YYYY-MM-DD"))
    };
    let to_day = match to {
        Some(to) => day("to", to)?,
        None => now.div_euclid(DAY) * DAY,
    };
    let from_day = match from {
        Some(from) => day("from", from)?,
        None => to_day - (DEFAULT_DAYS - 1) * DAY,
    };
    if from_day > to_day {
        return Err("from must not be after to".into());
    }
    if (to_day - from_day) / DAY + 1 > MAX_DAYS {
        return Err(format!("from and to may span at most {MAX_DAYS} days"));
    }
    let group = match group_by {
        Some(parts) => grouping(parts)?,
        None => Grouping {
            day: true,
            key: true,
            service: true,
            model: true,
            team: false,
        },
    };
    Ok(UsageQuery {
        from_day,
        to_day,
        owner,
        team,
        group,
    })
}

/// `day,key,service,model,team` or any part of it, in any order; empty: totals per owner only.
fn grouping(parts: &str) -> Result<Grouping, String> {
    let mut g = Grouping::default();
    for part in parts.split(',').filter(|p| !p.is_empty()) {
        match part {
            "day" => g.day = true,
            "key" => g.key = true,
            "service" => g.service = true,
            "model" => g.model = true,
            "team" => g.team = true,
            _ => {
                return Err(
                    "group_by must list parts of day,key,service,model,team separated by commas"
                        .into(),
                )
            }
        }
    }
    Ok(g)
}

/// The API's query string: `from`, `to`, `group_by`, `owner`, `team` (the last of each counts;
/// other names are ignored, as `GET /v1/keys` does). The owner and team are checked by the
/// caller.
pub(crate) fn from_query_string(query: Option<&str>, now: i64) -> Result<UsageQuery, String> {
    let (mut from, mut to, mut group_by) = (None, None, None);
    let (mut owner, mut team) = (None, None);
    for (name, value) in form_urlencoded::parse(query.unwrap_or("").as_bytes()) {
        match &*name {
            "from" => from = Some(value.into_owned()),
            "to" => to = Some(value.into_owned()),
            "group_by" => group_by = Some(value.into_owned()),
            "owner" => owner = Some(value.into_owned()),
            "team" => team = Some(value.into_owned()),
            _ => {}
        }
    }
    if owner.as_ref().is_some_and(|o| o.is_empty()) {
        return Err("owner must not be empty".into());
    }
    if team.as_ref().is_some_and(|t| t.is_empty()) {
        return Err("team must not be empty".into());
    }
    usage_query(
        from.as_deref(),
        to.as_deref(),
        group_by.as_deref(),
        (owner, team),
        now,
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    const NOW: i64 = 1_795_000_000; // 2026-11-18T11:06:40Z
    const TODAY: i64 = NOW / DAY * DAY;

    #[test]
    fn defaults_are_the_30_days_ending_today_grouped_by_everything() {
        let q = from_query_string(None, NOW).unwrap();
        assert_eq!((q.from_day, q.to_day), (TODAY - 29 * DAY, TODAY));
        assert!(q.group.day && q.group.key && q.group.service && q.group.model);
        assert_eq!(q.owner, None);
        let q = from_query_string(Some("to=2026-01-31&group_by="), NOW).unwrap();
        assert_eq!(q.from_day, parse_date("2026-01-02").unwrap());
        assert_eq!(q.group, Grouping::default());
    }

    #[test]
    fn parameters() {
        let q = from_query_string(
            Some("from=2026-11-01&to=2026-11-02&group_by=model,key&owner=a%20b&x=1"),
            NOW,
        )
        .unwrap();
        assert_eq!(q.from_day, parse_date("2026-11-01").unwrap());
        assert_eq!(q.to_day, q.from_day + DAY);
        assert_eq!(q.owner.as_deref(), Some("a b"));
        let t = from_query_string(Some("team=red&group_by=team,day"), NOW).unwrap();
        assert_eq!(t.team.as_deref(), Some("red"));
        assert!(t.group.team && t.group.day && !t.group.key);
        let want = Grouping {
            key: true,
            model: true,
            ..Grouping::default()
        };
        assert_eq!(q.group, want);
        // 366 days is the most.
        assert!(from_query_string(Some("from=2025-01-01&to=2026-01-01"), NOW).is_ok());
        for (bad, named) in [
            ("from=2026-11-31", "from"),
            ("from=yesterday", "from"),
            ("to=2026-1-1", "to"),
            ("to=", "to"),
            ("from=2026-11-02&to=2026-11-01", "from must not be after to"),
            ("from=2024-01-01&to=2026-01-01", "at most 366"),
            ("from=2025-01-01&to=2026-01-02", "at most 366"),
            ("group_by=day,user", "group_by"),
            ("group_by=DAY", "group_by"),
            ("owner=", "owner"),
            ("team=", "team"),
        ] {
            let e = from_query_string(Some(bad), NOW).unwrap_err();
            assert!(e.contains(named), "{bad}: {e}");
        }
    }
}
