//! The fake upstream's demo model as a program, for `make run` and the SDK and admin-API suites
//! (the answers: testkit/src/upstream/model.rs).
//!
//!   fake-upstream --port PORT [--host 127.0.0.1] [--token-delay-ms 50] [--name NAME] [--verbose]
//!
//! Port 0 picks a free port. Prints exactly one line `LISTENING <port>` to stdout once bound,
//! then serves until SIGTERM or SIGINT, and exits 0. `--name` comes back in every answer's
//! `X-Demo-Upstream` header; `--verbose` writes a line per request to stderr.

use std::net::{TcpListener, ToSocketAddrs};
use std::process::ExitCode;
use std::time::Duration;

use testkit::Upstream;

const USAGE: &str = "usage: fake-upstream --port PORT [--host 127.0.0.1] [--token-delay-ms 50] \
                     [--name NAME] [--verbose]";

struct Args {
    port: u16,
    host: String,
    token_delay_ms: i64,
    name: String,
    verbose: bool,
}

fn parse_args(mut argv: impl Iterator<Item = String>) -> Result<Args, String> {
    let mut args = Args {
        port: 0,
        host: "127.0.0.1".into(),
        token_delay_ms: 50,
        name: "demo".into(),
        verbose: false,
    };
    let mut port = None;
    while let Some(arg) = argv.next() {
        // `--flag value` and `--flag=value`, as argparse takes them.
        let (flag, inline) = match arg.split_once('=') {
            Some((f, v)) if f.starts_with("--") => (f.to_string(), Some(v.to_string())),
            _ => (arg, None),
        };
        if flag == "--verbose" && inline.is_none() {
            args.verbose = true;
            continue;
        }
        if flag == "-h" || flag == "--help" {
            println!("{USAGE}");
            std::process::exit(0);
        }
        let mut value = || {
            inline
                .clone()
                .or_else(|| argv.next())
                .ok_or(format!("{flag} expects a value"))
        };
        let number = |v: String| {
            v.parse::<i64>()
                .map_err(|_| format!("{flag}: not a number: {v}"))
        };
        match flag.as_str() {
            "--port" => {
                let v = number(value()?)?;
                port = Some(u16::try_from(v).map_err(|_| format!("--port out of range: {v}"))?);
            }
            "--host" => args.host = value()?,
            "--token-delay-ms" => args.token_delay_ms = number(value()?)?,
            "--name" => args.name = value()?,
            _ => return Err(format!("unrecognized argument: {flag}")),
        }
    }
    args.port = port.ok_or("the following arguments are required: --port")?;
    Ok(args)
}

fn main() -> ExitCode {
    let args = match parse_args(std::env::args().skip(1)) {
        Ok(args) => args,
        Err(e) => {
            eprintln!("{USAGE}\nfake-upstream: error: {e}");
            return ExitCode::from(2);
        }
    };
    let addr = match (args.host.as_str(), args.port).to_socket_addrs() {
        Ok(mut addrs) => addrs.next(),
        Err(_) => None,
    };
    let Some(mut addr) = addr else {
        eprintln!("fake-upstream: cannot resolve {}", args.host);
        return ExitCode::FAILURE;
    };
    // Bind once here to fail at once on a taken port and to learn the port 0 picks; the
    // upstream binds the same address right after.
    match TcpListener::bind(addr) {
        Ok(probe) => addr = probe.local_addr().unwrap(),
        Err(e) => {
            eprintln!("fake-upstream: cannot listen on {addr}: {e}");
            return ExitCode::FAILURE;
        }
    }
    let delay = Duration::from_millis(args.token_delay_ms.max(0) as u64);
    testkit::upstream::serve_until_signal(addr, || {
        let upstream = Upstream::model(&args.name, addr, delay);
        upstream.set_verbose(args.verbose);
        upstream
    });
    ExitCode::SUCCESS
}
