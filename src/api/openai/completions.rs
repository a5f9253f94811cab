//! Text completions: the `prompt` (its prompts each get their own choices), or vLLM's
//! `prompt_embeds` in its place, and the caps chat shares.

use serde::de::MapAccess;

use crate::api::request::shapes::Input;
use crate::api::request::{first_time, Check, Problem, Scanned, Seen, Skip};

/// One top-level member of a completions body.
pub(crate) fn member<'de, A: MapAccess<'de>>(
    key: &str,
    map: &mut A,
    p: &Problem,
    seen: &mut Seen,
    found: &mut Scanned<'de>,
) -> Result<(), A::Error> {
    match key {
        "prompt" => {
            first_time(&mut seen.required, p, || "prompt".into())?;
            let field = "prompt";
            found.prompts = Some(map.next_value_seed(Check(Input { problem: p, field }))?);
        }
        // vLLM takes prompt embeddings instead of a prompt.
        "prompt_embeds" => {
            seen.alternative = true;
            map.next_value_seed(Skip)?;
        }
        _ => super::classic_member(key, map, p, seen, found)?,
    }
    Ok(())
}
