//! Chat completions: the members of a chat body the gateway reads, `messages` (each with a
//! string role and a content that is a string, an array of parts or `null`) and the caps
//! every OpenAI classic endpoint shares.

use serde::de::{self, MapAccess, SeqAccess};

use crate::api::request::shapes::{Messages, Part};
use crate::api::request::{first_time, Check, Problem, Scanned, Seen, Shape, Skip, Text};

/// One top-level member of a chat body.
pub(crate) fn member<'de, A: MapAccess<'de>>(
    key: &str,
    map: &mut A,
    p: &Problem,
    seen: &mut Seen,
    found: &mut Scanned<'de>,
) -> Result<(), A::Error> {
    match key {
        "messages" => {
            first_time(&mut seen.required, p, || "messages".into())?;
            map.next_value_seed(Check(chat_messages(p)))?;
        }
        _ => super::classic_member(key, map, p, seen, found)?,
    }
    Ok(())
}

/// Chat's `messages`.
fn chat_messages(problem: &Problem) -> Messages<'_, Message<'_>> {
    Messages(problem, |problem, i| Message { problem, i })
}

/// `messages[i]`.
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
                // Absent is fine: an assistant message with tool_calls has no content.
                "content" => {
                    first_time(&mut content, p, || format!("messages[{i}].content"))?;
                    map.next_value_seed(Check(Content { problem: p, i }))?;
                }
                _ => {
                    map.next_value_seed(Skip)?;
                }
            }
        }
        if !role {
            return Err(p.raise(Role { problem: p, i }.wrong_type()));
        }
        Ok(())
    }
}

/// `messages[i].role`.
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

/// `messages[i].content`.
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
            "messages[{}].content must be a string, an array of content parts or null",
            self.i
        )
    }
    fn string<E: de::Error>(self) -> Result<(), E> {
        Ok(())
    }
    fn null<E: de::Error>(self) -> Result<(), E> {
        Ok(())
    }
    fn array<A: SeqAccess<'de>>(self, mut seq: A) -> Result<(), A::Error> {
        let mut j = 0;
        let part = |j| {
            Check(Part {
                problem: self.problem,
                i: self.i,
                j,
            })
        };
        while seq.next_element_seed(part(j))?.is_some() {
            j += 1;
        }
        Ok(())
    }
}
