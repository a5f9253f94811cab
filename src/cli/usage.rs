//! `portcullis usage`: the ledger's totals from the key store, as `GET /v1/usage` gives them
//! to an administrator, one row per line under a header line.

use crate::config::Config;
use crate::metering::query::usage_query;
use crate::store::{amount_text, open_store, Grouping, Unit, UsageTotal};
use crate::time::{date, unix_now};

pub(crate) fn run(
    config: &std::path::Path,
    (from, to): (Option<&str>, Option<&str>),
    (group_by, team): (Option<&str>, Option<&str>),
    limit: Option<u64>,
) -> Result<(), String> {
    let team = team.map(str::to_owned);
    // Checked before the store is opened: a typo costs no connection.
    let query = usage_query(from, to, group_by, (None, team), unix_now()).map_err(|e| {
        // The API's parameter names, as the flags are spelled here.
        e.replace("group_by", "--group-by")
            .replace("from", "--from")
            .replace("to", "--to")
            .replace("team must", "--team must")
    })?;
    let settings = Config::key_store_from_file(config).map_err(|e| e.summary())?;
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| e.to_string())?;
    let totals = runtime.block_on(async {
        let store = open_store(&settings.database, false)
            .await
            .map_err(|e| format!("cannot open the key store: {e}"))?;
        store
            .usage(&query)
            .await
            .map_err(|e| format!("cannot read usage: {e}"))
    })?;
    let shown = limit.map_or(totals.len(), |n| (n as usize).min(totals.len()));
    print!("{}", table(&totals[..shown], &query.group));
    if shown < totals.len() {
        eprintln!(
            "{shown} of {} rows shown (--limit); raise it or narrow --from/--to to see the rest",
            totals.len()
        );
    }
    Ok(())
}

/// The header and one line per row, columns aligned: the grouped parts (a `-` where the part
/// has no value: the key of JWT calls, an unknown model, the owner of keys made without one,
/// an owner in no team), then the owner, the counts and the cost (`-`: none of the row's
/// requests was priced).
fn table(totals: &[UsageTotal], g: &Grouping) -> String {
    // Whatever callers chose (a model name, an owner) is shown escaped.
    let none = |s: &str| {
        if s.is_empty() {
            "-".to_string()
        } else {
            super::printable(s).into_owned()
        }
    };
    let mut header = Vec::new();
    for (on, name) in [
        (g.day, "DAY"),
        (g.key, "KEY ID"),
        (true, "OWNER"),
        (g.service, "SERVICE"),
        (g.model, "MODEL"),
        (g.team, "TEAM"),
    ] {
        if on {
            header.push(name.to_string());
        }
    }
    header.extend(
        [
            "REQUESTS",
            "PROMPT",
            "COMPLETION",
            "REASONING",
            "CACHED",
            "ESTIMATED",
            "COST",
            "UNPRICED",
        ]
        .map(String::from),
    );
    let mut lines = vec![header];
    for t in totals {
        let mut line = Vec::new();
        line.extend(t.day.map(date));
        line.extend(t.key_id.as_deref().map(none));
        line.push(none(&t.owner));
        line.extend(t.service.as_deref().map(none));
        line.extend(t.model.as_deref().map(none));
        line.extend(t.team.as_deref().map(none));
        let c = &t.counts;
        line.extend(
            [
                c.requests,
                c.prompt_tokens,
                c.completion_tokens,
                c.reasoning_tokens,
                c.cached_tokens,
                c.estimated_requests,
            ]
            .map(|n| n.to_string()),
        );
        line.push(c.cost().map_or("-".into(), |m| amount_text(Unit::Cost, m)));
        line.push(c.unpriced_requests.to_string());
        lines.push(line);
    }
    aligned(&lines)
}

/// Rows as text, columns left-aligned two spaces apart (widths in characters), one per line.
pub(super) fn aligned<R: AsRef<[String]>>(lines: &[R]) -> String {
    let columns = lines.first().map_or(0, |l| l.as_ref().len());
    let widths: Vec<usize> = (0..columns)
        .map(|i| {
            (lines.iter())
                .map(|l| l.as_ref()[i].chars().count())
                .max()
                .unwrap_or(0)
        })
        .collect();
    let mut out = String::new();
    for line in lines {
        let cells: Vec<String> = (line.as_ref().iter())
            .zip(&widths)
            .map(|(cell, w)| format!("{cell:<w$}"))
            .collect();
        out.push_str(cells.join("  ").trim_end());
        out.push('\n');
    }
    out
}
