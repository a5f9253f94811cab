//! The rate-limit headers a budgeted caller's answers carry: OpenAI's `x-ratelimit-*`, which
//! the OpenAI SDKs read (and the Anthropic SDKs ignore).

use pingora::http::ResponseHeader;
use pingora::Result;

/// One window as the headers state it: its limit, what is left, seconds until it resets.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Line {
    pub(crate) limit: u64,
    pub(crate) remaining: u64,
    pub(crate) reset: u64,
}

const TOKENS: [&str; 3] = [
    "x-ratelimit-limit-tokens",
    "x-ratelimit-remaining-tokens",
    "x-ratelimit-reset-tokens",
];
const REQUESTS: [&str; 3] = [
    "x-ratelimit-limit-requests",
    "x-ratelimit-remaining-requests",
    "x-ratelimit-reset-requests",
];

/// OpenAI's rate-limit headers for a budgeted caller's tightest windows, replacing the upstream's of the same names. The
/// upstream's token headers go even when no token budget applies (a request budget only):
/// its account's limits are not the caller's.
pub(crate) fn rate_headers(
    response: &mut ResponseHeader,
    tokens: Option<Line>,
    requests: Option<Line>,
) -> Result<()> {
    for (names, line) in [(TOKENS, tokens), (REQUESTS, requests)] {
        let Some(line) = line else {
            if names == TOKENS {
                for name in names {
                    response.remove_header(name);
                }
            }
            continue;
        };
        let Line {
            limit,
            remaining,
            reset,
        } = line;
        response.insert_header(names[0], limit)?;
        response.insert_header(names[1], remaining)?;
        response.insert_header(names[2], openai_duration(reset))?;
    }
    Ok(())
}

/// A duration as OpenAI writes `x-ratelimit-reset-*`: `6m0s`, `1h2m3s`, `45s`.
fn openai_duration(seconds: u64) -> String {
    let (h, m, s) = (seconds / 3600, seconds / 60 % 60, seconds % 60);
    if h > 0 {
        format!("{h}h{m}m{s}s")
    } else if m > 0 {
        format!("{m}m{s}s")
    } else {
        format!("{s}s")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_read_like_openais() {
        assert_eq!(openai_duration(0), "0s");
        assert_eq!(openai_duration(45), "45s");
        assert_eq!(openai_duration(360), "6m0s");
        assert_eq!(openai_duration(3723), "1h2m3s");
        assert_eq!(openai_duration(86_400), "24h0m0s");
    }
}
