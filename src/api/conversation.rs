//! The affinity key of a request: the `X-Session-Id` header, else a hash of the conversation's
//! start in a body the gateway already holds (docs/fleet.md, "Prefix affinity").
//!
//! Which bytes: the first top-level `messages`, `input` or `prompt` member whose name starts
//! within the body's first [`WINDOW`] bytes. For an array (chat messages, Responses input
//! items) the raw bytes from its `[` through the end of its first element whose `role` is
//! `"user"`: the system prompt and the first user message, which every later turn of the
//! conversation repeats byte for byte. For a string (a completions prompt) its raw bytes.
//! Either way at most [`WINDOW`] bytes are hashed, so a 220 KB prompt costs what a 16 KiB one
//! does. Members before it (`model`, `stream`, ...) are skipped, so a turn that changes them
//! keeps its key.

use xxhash_rust::xxh3::{xxh3_64, xxh3_64_with_seed};

/// The most bytes looked for the member in, and the most bytes hashed.
pub(crate) const WINDOW: usize = 16 * 1024;

/// Header keys and body keys never meet: a session id equal to a body's bytes is another key.
const HEADER_SEED: u64 = 0x5e55_10a1;

/// The key of an `X-Session-Id` value.
pub fn session_key(value: &[u8]) -> u64 {
    xxh3_64_with_seed(value, HEADER_SEED)
}

/// The key of a JSON body's conversation start; `None` when the body has none in reach.
pub fn body_key(body: &[u8]) -> Option<u64> {
    conversation_start(body).map(xxh3_64)
}

/// The bytes [`body_key`] hashes.
pub(crate) fn conversation_start(body: &[u8]) -> Option<&[u8]> {
    // The member is looked for in the window only: skipping what precedes it never reads on.
    let mut s = Scan {
        b: &body[..body.len().min(WINDOW)],
        i: 0,
    };
    s.ws();
    s.eat(b'{')?;
    loop {
        s.ws();
        let name = s.string()?;
        s.ws();
        s.eat(b':')?;
        s.ws();
        if matches!(name, b"messages" | b"input" | b"prompt") {
            return start_of_value(body, s.i);
        }
        s.skip_value()?;
        s.ws();
        s.eat(b',')?;
    }
}

/// The hashed part of the value at `start` (see the module's comment): looked at only up to
/// [`WINDOW`] bytes on, so a first user message cut there still gives the same bytes every turn.
fn start_of_value(body: &[u8], start: usize) -> Option<&[u8]> {
    let cap = (start + WINDOW).min(body.len());
    let mut s = Scan {
        b: &body[..cap],
        i: start,
    };
    let end = match s.peek()? {
        b'"' => s.string().map_or(cap, |_| s.i),
        b'[' => {
            s.i += 1;
            loop {
                s.ws();
                match s.peek() {
                    None => break cap,
                    Some(b']') => break s.i + 1,
                    Some(b',') => s.i += 1,
                    Some(b'{') => match s.object_is_user() {
                        None => break cap,
                        Some(true) => break s.i,
                        Some(false) => {}
                    },
                    Some(_) => {
                        if s.skip_value().is_none() {
                            break cap;
                        }
                    }
                }
            }
        }
        _ => return None,
    };
    Some(&body[start..end])
}

/// A cursor over JSON bytes; every step returns `None` at the end of the bytes or on bytes
/// that are not JSON (a body the policy already checked never has those).
struct Scan<'a> {
    b: &'a [u8],
    i: usize,
}

impl<'a> Scan<'a> {
    fn peek(&self) -> Option<u8> {
        self.b.get(self.i).copied()
    }

    fn ws(&mut self) {
        while matches!(self.peek(), Some(b' ' | b'\t' | b'\n' | b'\r')) {
            self.i += 1;
        }
    }

    fn eat(&mut self, c: u8) -> Option<()> {
        (self.peek()? == c).then(|| self.i += 1)
    }

    /// A string's raw contents (escapes left as they are), the cursor after its closing quote.
    fn string(&mut self) -> Option<&'a [u8]> {
        self.eat(b'"')?;
        let start = self.i;
        loop {
            let at = self.i + memchr::memchr2(b'"', b'\\', self.b.get(self.i..)?)?;
            if self.b[at] == b'\\' {
                self.i = at + 2;
                continue;
            }
            self.i = at + 1;
            return Some(&self.b[start..at]);
        }
    }

    /// Skips one value of any kind.
    fn skip_value(&mut self) -> Option<()> {
        match self.peek()? {
            b'"' => self.string().map(drop),
            b'{' | b'[' => {
                // Byte by byte between strings, which are skipped fast: the structure
                // around them is a few bytes a member.
                let mut depth = 0usize;
                loop {
                    match self.peek()? {
                        b'"' => {
                            self.string()?;
                        }
                        b'[' | b'{' => {
                            depth += 1;
                            self.i += 1;
                        }
                        b']' | b'}' => {
                            depth = depth.checked_sub(1)?;
                            self.i += 1;
                            if depth == 0 {
                                return Some(());
                            }
                        }
                        _ => self.i += 1,
                    }
                }
            }
            _ => {
                // A number, true, false or null: up to the next delimiter.
                while !matches!(
                    self.peek()?,
                    b',' | b'}' | b']' | b' ' | b'\n' | b'\r' | b'\t'
                ) {
                    self.i += 1;
                }
                Some(())
            }
        }
    }

    /// Skips an object, telling whether its `role` is `"user"`; `None` if it is cut.
    fn object_is_user(&mut self) -> Option<bool> {
        self.eat(b'{')?;
        let mut user = false;
        loop {
            self.ws();
            if self.peek()? == b'}' {
                self.i += 1;
                return Some(user);
            }
            let name = self.string()?;
            self.ws();
            self.eat(b':')?;
            self.ws();
            if name == b"role" && self.peek()? == b'"' {
                user |= self.string()? == b"user";
            } else {
                self.skip_value()?;
            }
            self.ws();
            if self.peek()? == b',' {
                self.i += 1;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn start(body: &str) -> Option<&str> {
        conversation_start(body.as_bytes()).map(|b| std::str::from_utf8(b).unwrap())
    }

    #[test]
    fn the_system_prompt_and_first_user_message_are_the_key_whatever_comes_before_or_after() {
        let first = r#"{"model":"a","messages":[{"role":"system","content":"be brief"},{"content":"hi \"there\"","role":"user"}]}"#;
        let later = r#"{"stream":true,"model":"bb","tools":[{"x":[1,{"y":"]"}]}],"messages":[{"role":"system","content":"be brief"},{"content":"hi \"there\"","role":"user"},{"role":"assistant","content":"hello"},{"role":"user","content":"more"}],"n":1}"#;
        let expected =
            r#"[{"role":"system","content":"be brief"},{"content":"hi \"there\"","role":"user"}"#;
        assert_eq!(start(first), Some(expected));
        assert_eq!(start(later), Some(expected));
        assert_eq!(body_key(first.as_bytes()), body_key(later.as_bytes()));
        let other = later.replace("be brief", "be long");
        assert_ne!(body_key(first.as_bytes()), body_key(other.as_bytes()));
    }

    #[test]
    fn strings_and_arrays_without_a_user_message_are_hashed_whole_up_to_the_window() {
        assert_eq!(start(r#"{"prompt":"once upon"}"#), Some(r#""once upon""#));
        assert_eq!(start(r#"{"input":["a","b"]}"#), Some(r#"["a","b"]"#));
        assert_eq!(start(r#"{"model":"m"}"#), None);
        assert_eq!(start(r#"{"prompt":3}"#), None);
        assert_eq!(start("not json"), None);
        assert_eq!(start(""), None);
    }

    #[test]
    fn at_most_the_window_is_hashed_and_the_member_must_start_within_it() {
        let long = "x".repeat(200_000);
        let one = format!(r#"{{"messages":[{{"role":"user","content":"{long}"}}]}}"#);
        let two = format!(
            r#"{{"model":"m","messages":[{{"role":"user","content":"{long}"}},{{"role":"user","content":"y"}}]}}"#
        );
        assert_eq!(start(&one).unwrap().len(), WINDOW);
        assert_eq!(body_key(one.as_bytes()), body_key(two.as_bytes()));
        let late = format!(r#"{{"tools":"{long}","messages":[]}}"#);
        assert_eq!(start(&late), None, "no member starts in the first 16 KiB");
        // Cut anywhere, a body never panics.
        for cut in 0..two.len().min(300) {
            let _ = conversation_start(&two.as_bytes()[..cut]);
        }
    }
}
