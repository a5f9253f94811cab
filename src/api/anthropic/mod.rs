//! Anthropic's wire API: Messages, whose reader also reads token counting's bodies (a
//! Messages body without `max_tokens`).

pub(crate) mod messages;
