//! Embeddings: only the `input` is read (nothing is generated, so no cap).

use serde::de::MapAccess;

use crate::api::request::shapes::Input;
use crate::api::request::{first_time, Check, Problem, Seen, Skip};

/// One top-level member of an embeddings body.
pub(crate) fn member<'de, A: MapAccess<'de>>(
    key: &str,
    map: &mut A,
    p: &Problem,
    seen: &mut Seen,
) -> Result<(), A::Error> {
    match key {
        "input" => {
            first_time(&mut seen.required, p, || "input".into())?;
            let field = "input";
            map.next_value_seed(Check(Input { problem: p, field }))?;
        }
        _ => map.next_value_seed(Skip)?,
    }
    Ok(())
}
