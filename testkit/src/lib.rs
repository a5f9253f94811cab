//! The one test kit of Portcullis: every Rust test, bench and fuzz replay gets its servers,
//! clients and launchers from here, and the SDK suites start the same fake upstream.
//!
//! - `upstream`: the fake OpenAI-style model server, recording, SSE pacing, replicas
//!   (health, kill and restart, reset instead of answer);
//! - `gateway` and `config`: the real gateway binary as a child process, from a typed config;
//! - `http`: a raw HTTP/1.1 client and header helpers;
//! - `idp`: signing keys, tokens and a JWKS/discovery server; `postgres`, `redis`, `dns`:
//!   real servers (and a scriptable DNS) on loopback in temporary directories;
//! - `net`: free ports, resets, a host that never answers.

pub mod config;
pub mod dns;
pub mod gateway;
pub mod http;
pub mod idp;
pub mod net;
pub mod postgres;
pub mod redis;
pub mod upstream;

pub use config::{GatewayConfig, Service};
pub use gateway::{
    check_config, cli, gateway_bin, pid_alive, signal_pid, Gateway, GatewayBuilder, Proc,
};
pub use http::{client, header, header_pairs, raw, read_response, try_raw, RawResponse};
pub use net::{connect_from, free_port, free_port_on, Blackhole};
pub use upstream::{Coding, Hit, HitLog, SimSettings, StreamLog, Upstream, Usage, SIM_BLOCK};
