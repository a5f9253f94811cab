//! OpenAI's wire API: one file per endpoint, and the members chat and completions share.

use serde::de::MapAccess;

use crate::api::request::shapes::{Count, StreamOptions};
use crate::api::request::{first_time, Check, Problem, Scanned, Seen, Skip};

pub(crate) mod chat;
pub(crate) mod completions;
pub(crate) mod embeddings;
pub(crate) mod responses;

/// The counts read on chat and completions: two caps on tokens per choice, then two counts
/// of choices.
const COUNTS: [&str; 4] = ["max_tokens", "max_completion_tokens", "n", "best_of"];

/// A member chat and completions share (`stream_options` and the caps a budget reserves
/// from); any other is skipped.
fn classic_member<'de, A: MapAccess<'de>>(
    key: &str,
    map: &mut A,
    p: &Problem,
    seen: &mut Seen,
    found: &mut Scanned<'de>,
) -> Result<(), A::Error> {
    match key {
        "stream_options" => {
            first_time(&mut seen.options, p, || "stream_options".into())?;
            map.next_value_seed(Check(StreamOptions(p)))?;
            found.stream_options = true;
        }
        // Caps on what the request may generate, read for budget reservations.
        name if COUNTS.contains(&name) => {
            let slot = COUNTS.iter().position(|n| *n == name).unwrap_or(0);
            let field = COUNTS[slot];
            first_time(&mut seen.counts[slot], p, || field.into())?;
            let value = map.next_value_seed(Check(Count { problem: p, field }))?;
            let into = match slot {
                0 | 1 => &mut found.max_tokens,
                _ => &mut found.choices,
            };
            if let Some(v) = value {
                *into = Some(into.map_or(v, |old: u64| old.max(v)));
            }
        }
        _ => map.next_value_seed(Skip)?,
    }
    Ok(())
}
