//! The dialect bridge (issue 32): converters between the wire APIs, one folder per direction,
//! each with its request, answer and stream converters.
//!
//! A call is translated when its service's `translate` names its endpoint (`Pair`): the
//! call's `api::Exchange` converts its body, its answer and its stream; the proxy only sends
//! it to the target endpoint's path (`forward_path`).

pub(crate) mod messages_chat;

use super::{Api, Endpoint};

/// A translated endpoint: what the client speaks, and what the upstream is sent
/// (`services.<name>.translate`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Pair {
    /// `messages = "chat"` on `api = "anthropic"`.
    MessagesToChat,
    /// `responses = "chat"` on `api = "openai"`.
    ResponsesToChat,
    /// `chat = "responses"` on `api = "openai"`.
    ChatToResponses,
}

/// What the gateway knows of one pair: one row per `Pair`, in its order.
struct Row {
    /// The API of the services it may be configured on.
    api: Api,
    /// Its config key and value: `messages = "chat"`.
    key: &'static str,
    value: &'static str,
    /// As the access log and the metrics name it: `messages>chat`.
    name: &'static str,
    client: Endpoint,
    target: Endpoint,
    /// Built in this release (the others are refused at start-up).
    built: bool,
}

const PAIRS: [Row; 3] = [
    Row {
        api: Api::Anthropic,
        key: "messages",
        value: "chat",
        name: "messages>chat",
        client: Endpoint::Messages,
        target: Endpoint::Chat,
        built: true,
    },
    Row {
        api: Api::OpenAi,
        key: "responses",
        value: "chat",
        name: "responses>chat",
        client: Endpoint::Responses,
        target: Endpoint::Chat,
        built: false,
    },
    Row {
        api: Api::OpenAi,
        key: "chat",
        value: "responses",
        name: "chat>responses",
        client: Endpoint::Chat,
        target: Endpoint::Responses,
        built: false,
    },
];

/// Every pair, in `PAIRS`' order.
const ALL: [Pair; 3] = [
    Pair::MessagesToChat,
    Pair::ResponsesToChat,
    Pair::ChatToResponses,
];

impl Pair {
    fn row(self) -> &'static Row {
        &PAIRS[self as usize]
    }

    /// The pair `key = "value"` names on a service speaking `api`; why not, for the config's
    /// problem list.
    pub(crate) fn configured(api: Api, key: &str, value: &str) -> Result<Pair, String> {
        let on_api = || ALL.into_iter().filter(move |p| p.row().api == api);
        let listed = || {
            let pairs: Vec<String> = on_api()
                .map(|p| format!("`{} = \"{}\"`", p.row().key, p.row().value))
                .collect();
            pairs.join(" or ")
        };
        let shown = |s: &str| serde_json::Value::from(s.chars().take(64).collect::<String>());
        let Some(pair) = on_api().find(|p| p.row().key == key && p.row().value == value) else {
            return Err(format!(
                "{} = {} is not a translation this service's api can make: {} is",
                shown(key),
                shown(value),
                listed()
            ));
        };
        if !pair.row().built {
            return Err(format!(
                "`{key} = \"{value}\"` is not built yet in this release (only `messages = \"chat\"` is)"
            ));
        }
        Ok(pair)
    }

    /// As the access log and the metrics name it: `messages>chat`.
    pub(crate) fn name(self) -> &'static str {
        self.row().name
    }

    /// The endpoint the client calls.
    pub(crate) fn client(self) -> Endpoint {
        self.row().client
    }

    /// The endpoint the upstream is sent.
    pub(crate) fn target(self) -> Endpoint {
        self.row().target
    }
}

/// Why a request cannot be translated: a `400 bad_request` whose message names the field.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Untranslatable(pub(crate) String);

impl Untranslatable {
    fn field(field: &str, why: &str) -> Untranslatable {
        Untranslatable(format!("{field} {why}"))
    }
}

/// The path the upstream is sent for a translated call: everything but the client endpoint's
/// own suffix, which becomes the target's (`…/v1/messages?beta=true` →
/// `…/v1/chat/completions?beta=true`); the query is kept.
pub(crate) fn forward_path(pair: Pair, forward: &[u8]) -> Vec<u8> {
    let (path, query) = match forward.iter().position(|&b| b == b'?') {
        Some(at) => forward.split_at(at),
        None => (forward, &b""[..]),
    };
    let (client, target) = (pair.client().spec().suffix, pair.target().spec().suffix);
    let trimmed = |p: &[u8]| p.len() - p.iter().rev().take_while(|&&b| b == b'/').count();
    let plain = &path[..trimmed(path)];
    // The endpoint was matched however it was spelt; a plain spelling is kept as it is.
    let mut out = match plain.len().checked_sub(client.len()) {
        Some(at) if plain[at..].eq_ignore_ascii_case(client) => plain[..at].to_vec(),
        _ => {
            let normal = super::endpoint::normalized(path);
            let normal = &normal[..trimmed(&normal)];
            normal[..normal.len().saturating_sub(client.len())].to_vec()
        }
    };
    out.extend_from_slice(target);
    out.extend_from_slice(query);
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_table_has_one_row_per_pair_in_order() {
        for (i, pair) in ALL.iter().enumerate() {
            assert_eq!(*pair as usize, i);
            assert_eq!(
                pair.name(),
                format!("{}>{}", pair.row().key, pair.row().value)
            );
        }
    }

    #[test]
    fn the_endpoints_suffix_becomes_the_targets_and_the_rest_is_kept() {
        let path =
            |p: &str| String::from_utf8(forward_path(Pair::MessagesToChat, p.as_bytes())).unwrap();
        assert_eq!(
            path("/v1/messages?beta=true"),
            "/v1/chat/completions?beta=true"
        );
        assert_eq!(path("/v1/messages/"), "/v1/chat/completions");
        assert_eq!(path("/api/v1/Messages"), "/api/v1/chat/completions");
        assert_eq!(path("/v1/%6Dessages?x=1"), "/v1/chat/completions?x=1");
    }
}
