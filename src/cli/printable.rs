//! Cells the CLI prints hold what callers and key owners chose (model names, owners, key
//! names): control characters and bidirectional overrides in them could erase, move or forge
//! rows on the operator's terminal, so every such character is shown escaped.

use std::borrow::Cow;
use std::fmt::Write as _;

/// `s` as it may be printed: a control character (C0, DEL, C1) or a bidirectional formatting
/// character as `\u{…}`, and a backslash as `\\` so an escape cannot be forged.
pub(crate) fn printable(s: &str) -> Cow<'_, str> {
    if !s.chars().any(needs_escape) {
        return Cow::Borrowed(s);
    }
    let mut out = String::with_capacity(s.len() + 8);
    for c in s.chars() {
        match c {
            '\\' => out.push_str("\\\\"),
            c if needs_escape(c) => {
                let _ = write!(out, "\\u{{{:x}}}", c as u32);
            }
            c => out.push(c),
        }
    }
    Cow::Owned(out)
}

fn needs_escape(c: char) -> bool {
    c == '\\'
        || c.is_control()
        || matches!(c, '\u{200e}' | '\u{200f}' | '\u{202a}'..='\u{202e}' | '\u{2066}'..='\u{2069}')
}

#[cfg(test)]
mod tests {
    use super::printable;

    #[test]
    fn terminal_controls_are_shown_escaped() {
        assert_eq!(printable("gpt-4o"), "gpt-4o");
        assert_eq!(printable("é 模型"), "é 模型");
        assert_eq!(printable("a\x1b[2K\rb"), "a\\u{1b}[2K\\u{d}b");
        assert_eq!(
            printable("x\ny\t\u{7f}\u{9b}"),
            "x\\u{a}y\\u{9}\\u{7f}\\u{9b}"
        );
        assert_eq!(printable("\u{202e}evil"), "\\u{202e}evil");
        assert_eq!(printable("a\\u{1b}"), "a\\\\u{1b}");
    }
}
