//! The members of an OpenAI Responses body the gateway reads: `input` (a string or an array
//! of items), a stored `prompt` that may stand in for it, `max_output_tokens`, and whether it
//! runs in the `background` (which a budget cannot follow).

use serde::de::{self, MapAccess, SeqAccess};

use crate::api::request::shapes::Count;
use crate::api::request::{first_time, Check, Problem, Scanned, Seen, Shape, Skip};

/// One top-level member of a Responses body (`model` and `stream` are read by the caller).
pub(crate) fn member<'de, A: MapAccess<'de>>(
    key: &str,
    map: &mut A,
    p: &Problem,
    seen: &mut Seen,
    found: &mut Scanned<'de>,
) -> Result<(), A::Error> {
    match key {
        "input" => {
            first_time(&mut seen.input, p, || "input".into())?;
            // `null` is an absent input, which `prompt` may still supply.
            seen.required = map.next_value_seed(Check(Input(p)))?;
        }
        "prompt" => {
            first_time(&mut seen.prompt, p, || "prompt".into())?;
            seen.alternative = map.next_value_seed(Check(Present(p)))?;
        }
        "background" => {
            first_time(&mut seen.background, p, || "background".into())?;
            found.background = map.next_value_seed(Check(IsTrue(p)))?;
        }
        "max_output_tokens" => {
            let field = "max_output_tokens";
            first_time(&mut seen.counts[0], p, || field.into())?;
            found.max_tokens = map.next_value_seed(Check(Count { problem: p, field }))?;
        }
        _ => map.next_value_seed(Skip)?,
    }
    Ok(())
}

/// `input`: a string, or an array of input items (objects, whose insides are not read).
/// Its value: whether it is present (not `null`).
struct Input<'p>(&'p Problem);

impl<'de> Shape<'de> for Input<'_> {
    type Value = bool;

    fn problem(&self) -> &Problem {
        self.0
    }
    fn wrong_type(&self) -> String {
        "input must be a string or an array".into()
    }
    fn string<E: de::Error>(self) -> Result<bool, E> {
        Ok(true)
    }
    fn null<E: de::Error>(self) -> Result<bool, E> {
        Ok(false)
    }
    fn array<A: SeqAccess<'de>>(self, mut seq: A) -> Result<bool, A::Error> {
        let mut i = 0;
        while seq
            .next_element_seed(Check(Item { problem: self.0, i }))?
            .is_some()
        {
            i += 1;
        }
        Ok(true)
    }
}

/// `input[i]`: an object; an image's or a file's data inside is skipped, never copied.
struct Item<'p> {
    problem: &'p Problem,
    i: usize,
}

impl<'de> Shape<'de> for Item<'_> {
    type Value = ();

    fn problem(&self) -> &Problem {
        self.problem
    }
    fn wrong_type(&self) -> String {
        format!("input[{}] must be an object", self.i)
    }
    fn object<A: MapAccess<'de>>(self, mut map: A) -> Result<(), A::Error> {
        while map.next_entry_seed(Skip, Skip)?.is_some() {}
        Ok(())
    }
}

/// Any value, skipped; its value: whether it is not `null`.
struct Present<'p>(&'p Problem);

impl<'de> Shape<'de> for Present<'_> {
    type Value = bool;

    fn problem(&self) -> &Problem {
        self.0
    }
    fn wrong_type(&self) -> String {
        "prompt must be an object".into()
    }
    fn string<E: de::Error>(self) -> Result<bool, E> {
        Ok(true)
    }
    fn integer<E: de::Error>(self) -> Result<bool, E> {
        Ok(true)
    }
    fn float<E: de::Error>(self) -> Result<bool, E> {
        Ok(true)
    }
    fn boolean<E: de::Error>(self, _: bool) -> Result<bool, E> {
        Ok(true)
    }
    fn null<E: de::Error>(self) -> Result<bool, E> {
        Ok(false)
    }
    fn array<A: SeqAccess<'de>>(self, mut seq: A) -> Result<bool, A::Error> {
        while seq.next_element_seed(Skip)?.is_some() {}
        Ok(true)
    }
    fn object<A: MapAccess<'de>>(self, mut map: A) -> Result<bool, A::Error> {
        while map.next_entry_seed(Skip, Skip)?.is_some() {}
        Ok(true)
    }
}

/// Any value, skipped; its value: whether it is `true` (its type is the upstream's to judge).
struct IsTrue<'p>(&'p Problem);

impl<'de> Shape<'de> for IsTrue<'_> {
    type Value = bool;

    fn problem(&self) -> &Problem {
        self.0
    }
    fn wrong_type(&self) -> String {
        "background must be a boolean".into()
    }
    fn boolean<E: de::Error>(self, value: bool) -> Result<bool, E> {
        Ok(value)
    }
    fn string<E: de::Error>(self) -> Result<bool, E> {
        Ok(false)
    }
    fn integer<E: de::Error>(self) -> Result<bool, E> {
        Ok(false)
    }
    fn float<E: de::Error>(self) -> Result<bool, E> {
        Ok(false)
    }
    fn null<E: de::Error>(self) -> Result<bool, E> {
        Ok(false)
    }
    fn array<A: SeqAccess<'de>>(self, mut seq: A) -> Result<bool, A::Error> {
        while seq.next_element_seed(Skip)?.is_some() {}
        Ok(false)
    }
    fn object<A: MapAccess<'de>>(self, mut map: A) -> Result<bool, A::Error> {
        while map.next_entry_seed(Skip, Skip)?.is_some() {}
        Ok(false)
    }
}
