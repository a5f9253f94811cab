//! A scope: one RFC 6749 §3.3 scope-token, checked by one rule wherever a scope enters the
//! gateway (the config, a token's claims, the CLI, the key API).

use std::fmt;
use std::ops::Deref;
use std::str::FromStr;

/// Printable ASCII without space, `"` or `\`. Scopes are compared whole and a token's list
/// splits on spaces, so a scope holding a space could never match.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Scope(Box<str>);

impl Scope {
    pub fn is_token(s: &str) -> bool {
        !s.is_empty()
            && s.bytes()
                .all(|b| matches!(b, 0x21 | 0x23..=0x5b | 0x5d..=0x7e))
    }
}

impl FromStr for Scope {
    type Err = NotAScope;

    fn from_str(s: &str) -> Result<Scope, NotAScope> {
        if Scope::is_token(s) {
            Ok(Scope(s.into()))
        } else {
            Err(NotAScope)
        }
    }
}

impl Deref for Scope {
    type Target = str;

    fn deref(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for Scope {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// The one text for a malformed scope; the caller names where it was found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct NotAScope;

impl fmt::Display for NotAScope {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("is not a scope (printable ASCII without spaces, quotes or backslashes)")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_scope_is_one_printable_token() {
        for good in ["infer", "portcullis:admin", "a/b.c-d_e", "!#[]~"] {
            assert_eq!(good.parse::<Scope>().as_deref(), Ok(good));
        }
        for bad in ["", "a b", "a\"b", "a\\b", "é", "a\nb", "\u{7f}"] {
            assert_eq!(bad.parse::<Scope>(), Err(NotAScope), "{bad:?}");
        }
    }
}
