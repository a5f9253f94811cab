//! The members of an Anthropic Messages body the gateway reads: `messages` (each with a string
//! role and a content that is a string or an array of blocks), `system`, and the `max_tokens`
//! a Messages request must state (token counting needs none). Which roles and block types a
//! model takes is the upstream's to judge: Claude Code sends mid-conversation `system` turns.

use serde::de::{self, MapAccess, SeqAccess};

use crate::api::request::shapes::{Messages, Part};
use crate::api::request::{first_time, Check, Problem, Scanned, Seen, Shape, Skip, Text};
use crate::api::Endpoint;

/// One top-level member of a Messages or count_tokens body (`model` and `stream` are read by
/// the caller).
pub(crate) fn member<'de, A: MapAccess<'de>>(
    key: &str,
    endpoint: Endpoint,
    map: &mut A,
    p: &Problem,
    seen: &mut Seen,
    found: &mut Scanned<'de>,
) -> Result<(), A::Error> {
    match key {
        "messages" => {
            first_time(&mut seen.required, p, || "messages".into())?;
            let messages = Messages(p, |problem, i| Message { problem, i });
            map.next_value_seed(Check(messages))?;
        }
        "system" => {
            first_time(&mut seen.system, p, || "system".into())?;
            map.next_value_seed(Check(System(p)))?;
        }
        "max_tokens" if endpoint == Endpoint::Messages => {
            first_time(&mut seen.counts[0], p, || "max_tokens".into())?;
            found.max_tokens = map.next_value_seed(Check(MaxTokens(p)))?;
        }
        _ => map.next_value_seed(Skip)?,
    }
    Ok(())
}

/// `max_tokens`: a positive integer (`null` stands for absent, which Messages refuses).
struct MaxTokens<'p>(&'p Problem);

impl<'de> Shape<'de> for MaxTokens<'_> {
    type Value = Option<u64>;

    fn problem(&self) -> &Problem {
        self.0
    }
    fn wrong_type(&self) -> String {
        "max_tokens must be a positive integer".into()
    }
    fn unsigned<E: de::Error>(self, value: u64) -> Result<Option<u64>, E> {
        match value {
            0 => Err(self.refuse()),
            n => Ok(Some(n)),
        }
    }
    fn null<E: de::Error>(self) -> Result<Option<u64>, E> {
        Ok(None)
    }
}

/// `system`: a string or an array of text blocks (whose insides are not read).
struct System<'p>(&'p Problem);

impl<'de> Shape<'de> for System<'_> {
    type Value = ();

    fn problem(&self) -> &Problem {
        self.0
    }
    fn wrong_type(&self) -> String {
        "system must be a string or an array".into()
    }
    fn string<E: de::Error>(self) -> Result<(), E> {
        Ok(())
    }
    fn null<E: de::Error>(self) -> Result<(), E> {
        Ok(())
    }
    fn array<A: SeqAccess<'de>>(self, mut seq: A) -> Result<(), A::Error> {
        while seq.next_element_seed(Skip)?.is_some() {}
        Ok(())
    }
}

/// `messages[i]`: both `role` and `content` are required.
struct Message<'p> {
    problem: &'p Problem,
    i: usize,
}

impl<'de> Shape<'de> for Message<'_> {
    type Value = ();

    fn problem(&self) -> &Problem {
        self.problem
    }
    fn wrong_type(&self) -> String {
        format!("messages[{}] must be an object", self.i)
    }
    fn object<A: MapAccess<'de>>(self, mut map: A) -> Result<(), A::Error> {
        let (p, i) = (self.problem, self.i);
        let (mut role, mut content) = (false, false);
        while let Some(Text(key)) = map.next_key()? {
            match key.as_ref() {
                "role" => {
                    first_time(&mut role, p, || format!("messages[{i}].role"))?;
                    map.next_value_seed(Check(Role { problem: p, i }))?;
                }
                "content" => {
                    first_time(&mut content, p, || format!("messages[{i}].content"))?;
                    map.next_value_seed(Check(Content { problem: p, i }))?;
                }
                _ => map.next_value_seed(Skip)?,
            }
        }
        if !role {
            return Err(p.raise(Role { problem: p, i }.wrong_type()));
        }
        if !content {
            return Err(p.raise(Content { problem: p, i }.wrong_type()));
        }
        Ok(())
    }
}

/// `messages[i].role`: a string; its vocabulary is the upstream's.
struct Role<'p> {
    problem: &'p Problem,
    i: usize,
}

impl<'de> Shape<'de> for Role<'_> {
    type Value = ();

    fn problem(&self) -> &Problem {
        self.problem
    }
    fn wrong_type(&self) -> String {
        format!("messages[{}].role must be a string", self.i)
    }
    fn string<E: de::Error>(self) -> Result<(), E> {
        Ok(())
    }
}

/// `messages[i].content`: a string or an array of content blocks.
struct Content<'p> {
    problem: &'p Problem,
    i: usize,
}

impl<'de> Shape<'de> for Content<'_> {
    type Value = ();

    fn problem(&self) -> &Problem {
        self.problem
    }
    fn wrong_type(&self) -> String {
        format!(
            "messages[{}].content must be a string or an array of content blocks",
            self.i
        )
    }
    fn string<E: de::Error>(self) -> Result<(), E> {
        Ok(())
    }
    fn array<A: SeqAccess<'de>>(self, mut seq: A) -> Result<(), A::Error> {
        let (problem, i) = (self.problem, self.i);
        let mut j = 0;
        while seq
            .next_element_seed(Check(Part { problem, i, j }))?
            .is_some()
        {
            j += 1;
        }
        Ok(())
    }
}
