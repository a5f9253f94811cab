//! A simulated model server with a prefix cache (testkit/src/upstream/sim.rs) as a program,
//! for the routing benchmark (benches/load/stages_routing.py).
//!
//!   sim-replica --port PORT [--name NAME] [--cache-blocks 4096] [--prefill-us-per-token 20]
//!               [--decode-us-per-token 2000]
//!
//! Listens on 127.0.0.1 only. Port 0 picks a free port. Prints exactly one line
//! `LISTENING <port>` once bound, then serves until SIGTERM or SIGINT, and exits 0.

use std::net::{SocketAddr, TcpListener};
use std::process::ExitCode;
use std::time::Duration;

use testkit::{SimSettings, Upstream};

const USAGE: &str = "usage: sim-replica --port PORT [--name NAME] [--cache-blocks N] \
                     [--prefill-us-per-token US] [--decode-us-per-token US]";

fn parse_args() -> Result<(u16, String, SimSettings), String> {
    let mut argv = std::env::args().skip(1);
    let (mut port, mut name, mut s) = (None, "sim".to_string(), SimSettings::default());
    while let Some(flag) = argv.next() {
        let value = argv.next().ok_or(format!("{flag} expects a value"))?;
        let number = || {
            value
                .parse::<u64>()
                .map_err(|_| format!("{flag}: not a number: {value}"))
        };
        match flag.as_str() {
            "--port" => port = Some(u16::try_from(number()?).map_err(|_| "--port out of range")?),
            "--name" => name = value.clone(),
            "--cache-blocks" => s.cache_blocks = number()? as usize,
            "--prefill-us-per-token" => s.prefill_per_token = Duration::from_micros(number()?),
            "--decode-us-per-token" => s.decode_per_token = Duration::from_micros(number()?),
            _ => return Err(format!("unrecognized argument: {flag}")),
        }
    }
    Ok((port.ok_or("--port is required")?, name, s))
}

fn main() -> ExitCode {
    let (port, name, settings) = match parse_args() {
        Ok(a) => a,
        Err(e) => {
            eprintln!("{USAGE}\nsim-replica: error: {e}");
            return ExitCode::from(2);
        }
    };
    let addr = match TcpListener::bind(SocketAddr::from(([127, 0, 0, 1], port))) {
        Ok(probe) => probe.local_addr().unwrap(),
        Err(e) => {
            eprintln!("sim-replica: cannot listen on port {port}: {e}");
            return ExitCode::FAILURE;
        }
    };
    testkit::upstream::serve_until_signal(addr, || Upstream::sim(&name, addr, settings));
    ExitCode::SUCCESS
}
