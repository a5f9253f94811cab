//! Portcullis: an authenticated HTTP gateway for LLM APIs on Pingora.
//!
//! The modules are private; what the binary, the tests and the benchmarks use is re-exported
//! below, by name. Everything else is `pub(crate)` at most: `unreachable_pub` warns here and
//! `make lint` (clippy with `-D warnings`) denies it, so a `pub` item is one this list re-exports.

#![warn(unreachable_pub)]

mod admin;
mod admission;
mod api;
mod auth;
mod cli;
mod config;
mod errors;
mod limits;
mod metering;
mod observe;
mod one_line;
mod pricing;
mod proxy;
mod replicas;
mod scope;
mod server;
mod shutdown;
mod store;
mod time;

/// Invariants the fuzz targets and the corpus replay check; not part of the shipped library.
#[cfg(any(test, feature = "fuzzing"))]
pub mod fuzzing;

// The binary.
pub use cli::{run, Cli};
pub use observe::logging::init as init_logging;

// Benchmarks and property tests of the request path's parts.
pub use api::{affinity_body_key, affinity_session_key};
pub use api::{plan as plan_body, Api, Bridge, Endpoint, Models};
pub use api::{Encoding, Framing, UsageContainer, UsageScanner};
pub use auth::api_keys::{create_key, ApiKeyVerifier};
pub use auth::jwt::JwtVerifier;
pub use auth::token::{classify as classify_bearer, Bearer};
pub use config::{Config, JwtSettings};
pub use errors::GatewayError;
pub use observe::metrics::Metrics;
pub use pricing::{Price, Prices, Pricing, Tokens, Unpriced};
pub use proxy::{classify_path, peer_for, Target};
pub use replicas::Replicas;
pub use store::{
    open_store, BudgetStore, Grouping, KeyStore, LedgerStore, Store, UsageCounts, UsageQuery,
    UsageRow,
};
