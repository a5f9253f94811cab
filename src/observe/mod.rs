//! What the gateway tells its operators: Prometheus metrics (`metrics`, served by
//! `metrics_app`), the access log (one JSON line per request, written off the request path)
//! and the process log (`logging`).

pub(crate) mod access_log;
pub(crate) mod logging;
pub(crate) mod metrics;
pub(crate) mod metrics_app;
mod sharded;

/// Which worker thread is writing, for state kept per thread (the meter's rows).
pub(crate) mod thread_shards {
    pub(crate) use super::sharded::{shard, Padded, SHARDS};
}
