//! The shapes more than one dialect's members share: `stream`, counts, `stream_options`, a
//! `messages` array and its content parts, and the `input`/`prompt` of embeddings and
//! completions.

use serde::de::{self, MapAccess, SeqAccess};

use super::{first_time, Check, Problem, Shape, Skip, Text};

/// `stream`: optional, so `null` stands for absent, as the OpenAI API reads it.
pub(crate) struct Stream<'p>(pub(crate) &'p Problem);

/// Its value: whether the response is streamed.
impl<'de> Shape<'de> for Stream<'_> {
    type Value = bool;

    fn problem(&self) -> &Problem {
        self.0
    }
    fn wrong_type(&self) -> String {
        "stream must be a boolean".into()
    }
    fn boolean<E: de::Error>(self, value: bool) -> Result<bool, E> {
        Ok(value)
    }
    fn null<E: de::Error>(self) -> Result<bool, E> {
        Ok(false)
    }
}

/// A count the gateway reads (`max_tokens`, `n`…): a non-negative integer, or `null` for
/// absent.
pub(crate) struct Count<'p> {
    pub(crate) problem: &'p Problem,
    pub(crate) field: &'static str,
}

impl<'de> Shape<'de> for Count<'_> {
    type Value = Option<u64>;

    fn problem(&self) -> &Problem {
        self.problem
    }
    fn wrong_type(&self) -> String {
        format!("{} must be a non-negative integer", self.field)
    }
    fn unsigned<E: de::Error>(self, value: u64) -> Result<Option<u64>, E> {
        Ok(Some(value))
    }
    fn null<E: de::Error>(self) -> Result<Option<u64>, E> {
        Ok(None)
    }
}

/// `stream_options`: an object (or `null`) whose `include_usage`, when present, is a boolean
/// (or `null`).
pub(crate) struct StreamOptions<'p>(pub(crate) &'p Problem);

impl<'de> Shape<'de> for StreamOptions<'_> {
    type Value = ();

    fn problem(&self) -> &Problem {
        self.0
    }
    fn wrong_type(&self) -> String {
        "stream_options must be an object".into()
    }
    fn null<E: de::Error>(self) -> Result<(), E> {
        Ok(())
    }
    fn object<A: MapAccess<'de>>(self, mut map: A) -> Result<(), A::Error> {
        let mut seen = false;
        while let Some(Text(key)) = map.next_key()? {
            if key == "include_usage" {
                first_time(&mut seen, self.0, || "stream_options.include_usage".into())?;
                map.next_value_seed(Check(IncludeUsage(self.0)))?;
            } else {
                map.next_value_seed(Skip)?;
            }
        }
        Ok(())
    }
}

struct IncludeUsage<'p>(&'p Problem);

impl<'de> Shape<'de> for IncludeUsage<'_> {
    type Value = ();

    fn problem(&self) -> &Problem {
        self.0
    }
    fn wrong_type(&self) -> String {
        "stream_options.include_usage must be a boolean".into()
    }
    fn boolean<E: de::Error>(self, _: bool) -> Result<(), E> {
        Ok(())
    }
    fn null<E: de::Error>(self) -> Result<(), E> {
        Ok(())
    }
}

/// `messages`: a non-empty array, each element checked by the shape `.1` makes for its
/// index (chat's message, or Anthropic's).
pub(crate) struct Messages<'p, M>(
    pub(crate) &'p Problem,
    pub(crate) fn(&'p Problem, usize) -> M,
);

impl<'de, 'p, M: Shape<'de, Value = ()>> Shape<'de> for Messages<'p, M> {
    type Value = ();

    fn problem(&self) -> &Problem {
        self.0
    }
    fn wrong_type(&self) -> String {
        "messages must be a non-empty array".into()
    }
    fn array<A: SeqAccess<'de>>(self, mut seq: A) -> Result<(), A::Error> {
        let mut i = 0;
        while seq.next_element_seed(Check((self.1)(self.0, i)))?.is_some() {
            i += 1;
        }
        if i == 0 {
            return Err(self.refuse());
        }
        Ok(())
    }
}

/// `messages[i].content[j]` (a chat content part, or an Anthropic content block): only its
/// being an object is checked; an image's base64 data inside is skipped, never copied.
pub(crate) struct Part<'p> {
    pub(crate) problem: &'p Problem,
    pub(crate) i: usize,
    pub(crate) j: usize,
}

impl<'de> Shape<'de> for Part<'_> {
    type Value = ();

    fn problem(&self) -> &Problem {
        self.problem
    }
    fn wrong_type(&self) -> String {
        format!("messages[{}].content[{}] must be an object", self.i, self.j)
    }
    fn object<A: MapAccess<'de>>(self, mut map: A) -> Result<(), A::Error> {
        while map.next_entry_seed(Skip, Skip)?.is_some() {}
        Ok(())
    }
}

/// The embeddings `input` or the completions `prompt` (`Input::field`): the same shapes.
pub(crate) struct Input<'p> {
    pub(crate) problem: &'p Problem,
    pub(crate) field: &'static str,
}

/// What is wrong with an `input` or `prompt` of another shape.
fn input_shape(field: &str) -> String {
    format!(
        "{field} must be a string, an array of strings, an array of integers or an array of \
         integer arrays"
    )
}

/// What an element of `input` is: all elements must be of one kind.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Item {
    String,
    Integer,
    Integers,
}

/// Its value: how many prompts (inputs) it holds. A string or one token array is one; an
/// array of strings or of token arrays is one per element, and a completion is generated for
/// each, so a budget reserves one cap per prompt.
impl<'de> Shape<'de> for Input<'_> {
    type Value = u64;

    fn problem(&self) -> &Problem {
        self.problem
    }
    fn wrong_type(&self) -> String {
        input_shape(self.field)
    }
    fn string<E: de::Error>(self) -> Result<u64, E> {
        Ok(1)
    }
    fn array<A: SeqAccess<'de>>(self, mut seq: A) -> Result<u64, A::Error> {
        let mut first = None;
        let mut n: u64 = 0;
        let item = || Check(InputItem(self.problem, self.field));
        while let Some(kind) = seq.next_element_seed(item())? {
            if *first.get_or_insert(kind) != kind {
                return Err(self.refuse());
            }
            n += 1;
        }
        Ok(match first {
            Some(Item::Integer) => 1,
            _ => n,
        })
    }
}

/// An element of `input` or `prompt`.
struct InputItem<'p>(&'p Problem, &'static str);

impl<'de> Shape<'de> for InputItem<'_> {
    type Value = Item;

    fn problem(&self) -> &Problem {
        self.0
    }
    fn wrong_type(&self) -> String {
        input_shape(self.1)
    }
    fn string<E: de::Error>(self) -> Result<Item, E> {
        Ok(Item::String)
    }
    fn integer<E: de::Error>(self) -> Result<Item, E> {
        Ok(Item::Integer)
    }
    fn array<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Item, A::Error> {
        while seq
            .next_element_seed(Check(Token(self.0, self.1)))?
            .is_some()
        {}
        Ok(Item::Integers)
    }
}

/// An element of an integer array inside `input` or `prompt`.
struct Token<'p>(&'p Problem, &'static str);

impl<'de> Shape<'de> for Token<'_> {
    type Value = ();

    fn problem(&self) -> &Problem {
        self.0
    }
    fn wrong_type(&self) -> String {
        input_shape(self.1)
    }
    fn integer<E: de::Error>(self) -> Result<(), E> {
        Ok(())
    }
}
