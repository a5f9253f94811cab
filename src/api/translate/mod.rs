//! The dialect bridge (issue 32): converters between the wire APIs, one folder per direction,
//! each with its request, answer and stream converters.
//!
//! Built converter by converter and tested on their own; the proxy does not call them yet (the
//! `translate` config key and the wiring come next), hence `dead_code` allowed here only.
#![allow(dead_code)]

pub(crate) mod messages_chat;

/// Why a request cannot be translated: a `400 bad_request` whose message names the field.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Untranslatable(pub(crate) String);

impl Untranslatable {
    fn field(field: &str, why: &str) -> Untranslatable {
        Untranslatable(format!("{field} {why}"))
    }
}
