//! Which requests have their bodies read: matched the way the servers behind the gateway
//! route, so that no spelling of an endpoint slips past the policy and the meter.
//!
//! uvicorn/Starlette and Go's net/http route the percent-decoded path, and some servers take
//! `/chat/completions/` or `/chat/completions;x=1` for `/chat/completions` too. So the path is
//! compared after decoding percent-escapes, dropping `;` parameters from each segment and
//! trailing slashes, ignoring ASCII case: matching more spellings than a server accepts only
//! means a body is checked that the server would have refused anyway. The bytes forwarded are
//! never changed. (Encoded slashes, backslashes and dot segments never get here: the router
//! refuses them.)

/// The API a service speaks (`api` in its config): which endpoints have their bodies read.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Api {
    /// Chat, completions, embeddings and the Responses API.
    OpenAi,
    /// Anthropic's Messages API and its token counting.
    Anthropic,
}

impl Api {
    /// Each API by its name in the config (`api = "…"`).
    const NAMES: [(&'static str, Api); 2] =
        [("openai", Api::OpenAi), ("anthropic", Api::Anthropic)];

    /// The API a config names.
    pub(crate) fn named(name: &str) -> Option<Api> {
        Api::NAMES
            .iter()
            .find(|(n, _)| *n == name)
            .map(|&(_, api)| api)
    }

    /// The config names, each as `template` writes it (`{}` standing for the name), joined by
    /// `joiner`: for messages.
    pub(crate) fn listed(template: &str, joiner: &str) -> String {
        let names: Vec<String> = (Api::NAMES.iter())
            .map(|(name, _)| template.replace("{}", name))
            .collect();
        names.join(joiner)
    }
}

/// The requests whose bodies the gateway reads.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Endpoint {
    Chat,
    /// Text completions (`/completions`).
    Completions,
    Embeddings,
    /// OpenAI's Responses API (`/responses`).
    Responses,
    /// Anthropic's Messages API (`/messages`).
    Messages,
    /// `/messages/count_tokens`: a Messages body without `max_tokens`; nothing is generated.
    CountTokens,
}

impl Endpoint {
    /// A POST whose path (the part before any '?') ends in one of `api`'s endpoints, however
    /// it is spelt; anything else is not read. (An OpenAI service's `/threads/…/messages` is
    /// not Anthropic's `/messages`: each API has its own list.)
    pub fn of(api: Api, method: &http::Method, forwarded_path: &[u8]) -> Option<Endpoint> {
        if method != http::Method::POST {
            return None;
        }
        let path = match forwarded_path.iter().position(|&b| b == b'?') {
            Some(query) => &forwarded_path[..query],
            None => forwarded_path,
        };
        // Most requests spell the endpoint plainly: no copy then.
        if !path.iter().any(|&b| b == b'%' || b == b';') {
            return matching(api, path);
        }
        matching(api, &normalized(path))
    }
}

/// The endpoint `path` names, compared without case and without trailing slashes.
fn matching(api: Api, path: &[u8]) -> Option<Endpoint> {
    let end = path.iter().rposition(|&b| b != b'/').map_or(0, |i| i + 1);
    let path = &path[..end];
    // The longest suffix that matches: `/messages/count_tokens` is not `/messages`.
    let names = |&endpoint: &Endpoint| {
        let spec = endpoint.spec();
        let tail = path.len().checked_sub(spec.suffix.len())?;
        let named = spec.api == api && path[tail..].eq_ignore_ascii_case(spec.suffix);
        named.then_some((spec.suffix.len(), endpoint))
    };
    super::ALL.iter().filter_map(names).max().map(|(_, e)| e)
}

/// `path` with its percent-escapes decoded and each segment's `;` parameters dropped.
pub(crate) fn normalized(path: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(path.len());
    let mut params = false;
    let mut i = 0;
    while i < path.len() {
        let byte = match path[i] {
            b'%' => match path.get(i + 1..i + 3).and_then(hex_pair) {
                Some(decoded) => {
                    i += 2;
                    decoded
                }
                None => b'%',
            },
            other => other,
        };
        i += 1;
        // A `;` decoded from `%3B` is data to the server, not a parameter.
        let literal_semicolon = byte == b';' && path[i - 1] == b';';
        if byte == b'/' {
            params = false;
        } else if literal_semicolon {
            params = true;
        }
        if !params {
            out.push(byte);
        }
    }
    out
}

fn hex_pair(pair: &[u8]) -> Option<u8> {
    let digit = |b: u8| (b as char).to_digit(16);
    Some((digit(pair[0])? * 16 + digit(pair[1])?) as u8)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn of(path: &str) -> Option<Endpoint> {
        Endpoint::of(Api::OpenAi, &http::Method::POST, path.as_bytes())
    }

    fn anthropic(path: &str) -> Option<Endpoint> {
        Endpoint::of(Api::Anthropic, &http::Method::POST, path.as_bytes())
    }

    #[test]
    fn each_api_reads_its_own_endpoints() {
        assert_eq!(of("/v1/responses"), Some(Endpoint::Responses));
        assert_eq!(of("/v1/Responses/"), Some(Endpoint::Responses));
        assert_eq!(anthropic("/v1/messages"), Some(Endpoint::Messages));
        assert_eq!(anthropic("/v1/messages/"), Some(Endpoint::Messages));
        assert_eq!(
            anthropic("/v1/messages/count_tokens?beta=true"),
            Some(Endpoint::CountTokens)
        );
        assert_eq!(
            anthropic("/v1/messages/count%5Ftokens"),
            Some(Endpoint::CountTokens)
        );
        // Each API's paths only: the Assistants API's thread messages are not Anthropic's.
        assert_eq!(of("/v1/threads/t1/messages"), None);
        assert_eq!(of("/v1/messages"), None);
        assert_eq!(anthropic("/v1/chat/completions"), None);
        assert_eq!(anthropic("/v1/responses"), None);
        assert_eq!(of("/v1/responses/resp_1"), None);
        assert_eq!(of("/v1/responses/input_tokens"), None);
        assert_eq!(anthropic("/v1/messages/batches"), None);
    }

    #[test]
    fn every_spelling_of_an_endpoint_is_read() {
        for path in [
            "/v1/chat/completions",
            "/v1/chat/%63ompletions",
            "/v1/%63%68at/completions?x=1",
            "/v1/chat/completions/",
            "/v1/chat/completions//",
            "/v1/chat/completions;jsessionid=1",
            "/v1/chat;a=b/completions",
            "/v1/Chat/Completions",
            "/v1/chat/completions%2F",
        ] {
            assert_eq!(of(path), Some(Endpoint::Chat), "{path}");
        }
        assert_eq!(of("/v1/completions"), Some(Endpoint::Completions));
        assert_eq!(of("/v1/%63ompletions/"), Some(Endpoint::Completions));
        assert_eq!(of("/v1/embedding%73"), Some(Endpoint::Embeddings));
    }

    #[test]
    fn other_paths_and_methods_are_not_read() {
        for path in [
            "/v1/models",
            "/v1/chat/completions/x",
            "/v1/chat/completions%3Bx",
            "/v1/chat/completions%20",
            "/v1/completionsx",
            "/v1/embeddings%",
            "/v1/embeddings%zz",
            "/v1/x?/chat/completions",
        ] {
            assert_eq!(of(path), None, "{path}");
        }
        assert_eq!(
            Endpoint::of(Api::OpenAi, &http::Method::GET, b"/v1/chat/completions"),
            None
        );
    }
}
