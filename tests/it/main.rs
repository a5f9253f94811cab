//! The integration tests, one module per area, in one test binary so that Pingora and the test
//! kit link once per `cargo test`. Every test runs the real gateway binary (`testkit::Gateway`)
//! on loopback in front of real servers from the test kit.

mod access_log;
mod admin_api;
mod affinity;
mod agent_apis;
mod agent_streams;
mod auth;
mod budget_admin;
mod budgets;
mod connections;
mod costs;
mod fleet_keys;
mod fleet_rate_limits;
mod fuzz_corpus;
mod gateway;
mod held_bodies;
mod ledger;
mod metering;
mod metrics;
mod model_policy;
mod null_fields;
mod operations;
mod prices;
mod properties;
mod replicas;
mod soak;
mod tls;
mod translate;
mod translate_chat;
mod translate_conformance;
mod translate_responses;

use testkit::{free_port, Gateway, Service, Upstream};

/// A gateway whose `infer` upstream refuses connections and whose `embed` upstream is `up`
/// with a one-second read timeout: the shapes of 502 and 504.
pub fn failing_gateway(up: &Upstream) -> Gateway {
    let dead = format!("http://127.0.0.1:{}", free_port());
    Gateway::builder()
        .service(Service::new("infer", dead))
        .service(Service::new("embed", up.url("")).read_timeout(1))
        .start()
}
