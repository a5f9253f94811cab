//! Problems as one line each: a config file's and a price table's problems are printed one per
//! line on stderr and in the log, and they may echo what the file holds (newlines and other
//! control characters, found by fuzzing) or quote toml's own multi-line messages.

/// `s` with its control characters escaped.
pub(crate) fn one_line(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        if c.is_control() {
            out.extend(c.escape_default());
        } else {
            out.push(c);
        }
    }
    out
}

/// A TOML syntax or shape error of the file shown as `shown` on one line, with its line and
/// column: toml's own message draws the source over several lines.
pub(crate) fn toml_problem(shown: &str, text: &str, e: &toml::de::Error) -> String {
    let message = one_line(&e.message().split_whitespace().collect::<Vec<_>>().join(" "));
    match e.span() {
        Some(span) => {
            let before = &text.as_bytes()[..span.start.min(text.len())];
            let line = before.iter().filter(|&&b| b == b'\n').count() + 1;
            let column = before.iter().rev().take_while(|&&b| b != b'\n').count() + 1;
            format!("{shown}: line {line}, column {column}: {message}")
        }
        None => format!("{shown}: {message}"),
    }
}
