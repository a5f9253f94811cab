//! Portcullis: an authenticated HTTP gateway for LLM APIs on Pingora.

pub mod access_log;
pub mod admin;
pub mod auth;
pub mod cli;
pub mod config;
pub mod errors;
#[doc(hidden)]
pub mod fuzzing;
pub mod logging;
pub mod metrics;
pub mod model_policy;
pub mod proxy;
pub mod rate_limit;
pub mod replicas;
pub mod routing;
pub mod scope;
pub mod server;
pub mod shutdown;
pub mod time;
pub mod usage;
