//! The access log: one JSON line per request, local responses included, and one per key event
//! of the key API and the CLI. `record` is the line's one shape, filled in by whoever answered
//! (the data plane, the admin listener, the CLI); `writer` takes lines off the request path.

mod record;
mod writer;

pub(crate) use record::{
    millis, path_only, HttpFields, KeyEventFields, ProxiedFields, Record, Time,
};
pub(crate) use writer::{open, AccessLog};
