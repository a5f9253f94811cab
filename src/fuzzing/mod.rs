//! The invariants every parser that reads client bytes promises, as checks that panic when
//! one is broken. One definition serves the libFuzzer targets (`fuzz/`), the replay of their
//! corpora in `make test` (`tests/it/fuzz_corpus.rs`) and the property tests.
//! Each check takes arbitrary bytes and must never panic for a reason other than a broken
//! invariant.

mod agent_bodies;
mod agent_usage;
mod model_body;
mod requests;
mod translate;
mod usage;
mod usage_oracle;

#[cfg(test)]
pub(crate) use usage::usage_in_chunks;

pub use agent_usage::{messages_usage, responses_usage};
pub use model_body::{messages_body, model_body, responses_body};
pub use requests::{
    access_log_json, api_key, bearer_token, config_loader, jwt_precheck, path_classifier,
};
pub use translate::{
    chat_stream_to_messages, chat_stream_to_responses, chat_to_responses_request,
    messages_to_chat_request, responses_stream_to_chat, responses_to_chat_request,
};
pub use usage::usage_scanner;

/// One invariant check over arbitrary input bytes.
pub type Check = fn(&[u8]);

/// Every fuzz target by name, for the corpus replay.
pub const TARGETS: [(&str, Check); 18] = [
    ("path_classifier", path_classifier),
    ("bearer_token", bearer_token),
    ("api_key", api_key),
    ("jwt_precheck", jwt_precheck),
    ("config_loader", config_loader),
    ("access_log_json", access_log_json),
    ("model_body", model_body),
    ("responses_body", responses_body),
    ("messages_body", messages_body),
    ("usage_scanner", usage_scanner),
    ("responses_usage", responses_usage),
    ("messages_usage", messages_usage),
    ("messages_to_chat_request", messages_to_chat_request),
    ("chat_stream_to_messages", chat_stream_to_messages),
    ("responses_to_chat_request", responses_to_chat_request),
    ("chat_stream_to_responses", chat_stream_to_responses),
    ("chat_to_responses_request", chat_to_responses_request),
    ("responses_stream_to_chat", responses_stream_to_chat),
];
