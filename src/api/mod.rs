//! Everything the gateway knows about the wire APIs it reads (OpenAI's chat, completions,
//! embeddings and Responses; Anthropic's Messages and token counting): which requests are
//! read, the shapes their bodies must have, the model policy's edits, where each answer puts
//! its usage and where a conversation starts. The proxy calls in here and knows no dialect.
//!
//! - `endpoint`: which path is which endpoint, however it is spelt.
//! - `request/`: the one reader of request bodies; each dialect's members in `openai/` and
//!   `anthropic/`.
//! - `policy/`: the model policy and the body edits (default model, aliases, usage on
//!   streams, the budget's completion cap).
//! - `usage/`: the usage of answers, read (and stripped) as they stream past.
//! - `exchange/`: one call, phase by phase, as the proxy hands it over; its metering.
//! - `conversation`: a conversation's start, hashed for replica affinity.
//! - `unmetered`: what a token-budgeted caller may call besides the endpoints read.
//! - `rate_headers`: the rate-limit headers of a budgeted caller's answers.

use serde::de::MapAccess;

use request::{Problem, Scanned, Seen};

mod anthropic;
mod conversation;
mod endpoint;
mod exchange;
mod openai;
mod policy;
mod rate_headers;
mod request;
mod translate;
mod unmetered;
mod usage;

pub(crate) use conversation::WINDOW as CONVERSATION_WINDOW;
pub use conversation::{body_key as affinity_body_key, session_key as affinity_session_key};
pub use endpoint::{Api, Endpoint};
pub(crate) use exchange::Exchange;
#[cfg(any(test, feature = "fuzzing"))]
pub(crate) use policy::{apply, Applied};
pub use policy::{plan, Models};
pub(crate) use policy::{plan_capped, CapRule, Edit, USAGE_MAX_GROWTH};
pub(crate) use rate_headers::{rate_headers, Line as RateLine};
pub(crate) use request::BodyError;
#[cfg(any(test, feature = "fuzzing"))]
pub(crate) use translate::chat_responses::{
    request::to_responses as chat_to_responses, stream::StreamToChat,
};
#[cfg(any(test, feature = "fuzzing"))]
pub(crate) use translate::messages_chat::{
    request::to_chat as messages_to_chat, stream::StreamToMessages,
};
#[cfg(any(test, feature = "fuzzing"))]
pub(crate) use translate::Asked as TranslatedAsked;
#[cfg(any(test, feature = "fuzzing"))]
pub(crate) use translate::Stream as TranslatedStream;
pub(crate) use translate::{forward_path as translated_path, Pair};
pub(crate) use unmetered::{allowed as unmetered_allowed, refusal_message as unmetered_refusal};
pub(crate) use usage::strip::UsageStripper;
pub(crate) use usage::Usage;
pub use usage::{Encoding, Framing, UsageContainer, UsageScanner};

/// What the gateway knows of one endpoint. Adding an endpoint is a variant of `Endpoint`, a
/// row here and its members' reader (`read_member`).
pub(crate) struct Spec {
    pub(crate) api: Api,
    /// The path suffix that names it (`endpoint` matches every spelling).
    pub(crate) suffix: &'static [u8],
    /// The member its body must have, which also holds the conversation (a Responses
    /// `prompt` template or vLLM's `prompt_embeds` may stand in for it: see `request`).
    pub(crate) required: &'static str,
    /// Whether it generates: its answer may stream, and its request caps what it generates.
    pub(crate) generates: bool,
    /// Whether its stream reports usage only when asked (`stream_options.include_usage`),
    /// and its request states its caps as `max_tokens`, `max_completion_tokens`, `n` and
    /// `best_of`.
    pub(crate) usage_on_request: bool,
    /// Where its answer states its usage; `None`: its answer is not metered.
    pub(crate) usage: Option<UsageContainer>,
    /// The member that caps what it generates, as a budget's cap is inserted.
    pub(crate) cap_field: Option<&'static str>,
    /// Whether its body must state that cap (Messages' `max_tokens`).
    pub(crate) cap_required: bool,
}

/// One row per `Endpoint`, in its order.
const ENDPOINTS: [Spec; 6] = [
    Spec {
        api: Api::OpenAi,
        suffix: b"/chat/completions",
        required: "messages",
        generates: true,
        usage_on_request: true,
        usage: Some(UsageContainer::Root),
        cap_field: Some("max_completion_tokens"),
        cap_required: false,
    },
    Spec {
        api: Api::OpenAi,
        suffix: b"/completions",
        required: "prompt",
        generates: true,
        usage_on_request: true,
        usage: Some(UsageContainer::Root),
        cap_field: Some("max_tokens"),
        cap_required: false,
    },
    Spec {
        api: Api::OpenAi,
        suffix: b"/embeddings",
        required: "input",
        generates: false,
        usage_on_request: false,
        usage: Some(UsageContainer::Root),
        cap_field: None,
        cap_required: false,
    },
    Spec {
        api: Api::OpenAi,
        suffix: b"/responses",
        required: "input",
        generates: true,
        usage_on_request: false,
        usage: Some(UsageContainer::Response),
        cap_field: Some("max_output_tokens"),
        cap_required: false,
    },
    Spec {
        api: Api::Anthropic,
        suffix: b"/messages",
        required: "messages",
        generates: true,
        usage_on_request: false,
        usage: Some(UsageContainer::Message),
        cap_field: Some("max_tokens"),
        cap_required: true,
    },
    Spec {
        api: Api::Anthropic,
        suffix: b"/messages/count_tokens",
        required: "messages",
        generates: false,
        usage_on_request: false,
        usage: None,
        cap_field: None,
        cap_required: false,
    },
];

/// Every endpoint, in `ENDPOINTS`' order.
const ALL: [Endpoint; 6] = [
    Endpoint::Chat,
    Endpoint::Completions,
    Endpoint::Embeddings,
    Endpoint::Responses,
    Endpoint::Messages,
    Endpoint::CountTokens,
];

impl Endpoint {
    /// Its row of the table.
    pub(crate) fn spec(self) -> &'static Spec {
        &ENDPOINTS[self as usize]
    }

    /// Whether the endpoint generates text (so its response may stream and its request caps
    /// what it generates).
    pub fn generates(self) -> bool {
        self.spec().generates
    }
}

/// Reads one top-level member of a body in `endpoint`'s dialect (`model` and `stream`, which
/// every dialect shares, are read by `request`). Here rather than in `request` so that each
/// dialect's reader builds on `request` without `request` depending on them.
fn read_member<'de, A: MapAccess<'de>>(
    endpoint: Endpoint,
    key: &str,
    map: &mut A,
    p: &Problem,
    seen: &mut Seen,
    found: &mut Scanned<'de>,
) -> Result<(), A::Error> {
    match endpoint {
        Endpoint::Chat => openai::chat::member(key, map, p, seen, found),
        Endpoint::Completions => openai::completions::member(key, map, p, seen, found),
        Endpoint::Embeddings => openai::embeddings::member(key, map, p, seen),
        Endpoint::Responses => openai::responses::member(key, map, p, seen, found),
        Endpoint::Messages | Endpoint::CountTokens => {
            anthropic::messages::member(key, endpoint, map, p, seen, found)
        }
    }
}

#[cfg(test)]
mod table_tests {
    use super::*;

    #[test]
    fn the_table_has_one_row_per_endpoint_in_order() {
        for (i, endpoint) in ALL.iter().enumerate() {
            assert_eq!(*endpoint as usize, i);
        }
        // Only endpoints that generate have a cap; only metered ones a usage container.
        for e in ALL {
            assert_eq!(e.spec().cap_field.is_some(), e.generates(), "{e:?}");
        }
    }
}
