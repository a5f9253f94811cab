//! `${VAR}` expansion from the environment, done once at start-up.

/// Expands every `${NAME}` in `value`. Fails naming the first variable that is unset or
/// a `${` that is never closed; `$` not followed by `{` is kept as it is.
pub(crate) fn expand(
    value: &str,
    lookup: impl Fn(&str) -> Option<String>,
) -> Result<String, String> {
    let mut out = String::with_capacity(value.len());
    let mut rest = value;
    while let Some(start) = rest.find("${") {
        out.push_str(&rest[..start]);
        let after = &rest[start + 2..];
        let end = after
            .find('}')
            .ok_or_else(|| "has a `${` without a closing `}`".to_string())?;
        let name = &after[..end];
        let valid =
            !name.is_empty() && name.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_');
        if !valid {
            return Err(format!("names an invalid variable `${{{name}}}`"));
        }
        let var = lookup(name).ok_or_else(|| format!("uses `${{{name}}}`, which is not set"))?;
        out.push_str(&var);
        rest = &after[end + 1..];
    }
    out.push_str(rest);
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::expand;

    fn env(name: &str) -> Option<String> {
        (name == "KEY").then(|| "s3cret".to_string())
    }

    #[test]
    fn expands_set_variables_and_keeps_lone_dollars() {
        assert_eq!(expand("Bearer ${KEY}", env).unwrap(), "Bearer s3cret");
        assert_eq!(
            expand("$5 ${KEY}${KEY}", env).unwrap(),
            "$5 s3cret".to_string() + "s3cret"
        );
    }

    #[test]
    fn refuses_unset_unclosed_and_invalid_names() {
        assert!(expand("${NOPE}", env).unwrap_err().contains("NOPE"));
        assert!(expand("${KEY", env).is_err());
        assert!(expand("${}", env).is_err());
        assert!(expand("${A-B}", env).is_err());
    }
}
