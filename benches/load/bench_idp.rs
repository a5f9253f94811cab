//! The test kit's IdP (`testkit::idp`) as a process, for the load benchmark: serves discovery
//! and JWKS on 127.0.0.1 with one RSA key, and prints the issuer and one long-lived RS256 access
//! token (scopes `infer chatx`, audience `portcullis`), then serves until killed or `--max-life-s`.
//!
//! Output, one per line: `issuer <url>`, `token <jwt>`.

use testkit::idp;

use std::io::Write;
use std::time::Duration;

use serde_json::json;

fn main() {
    let mut max_life = Duration::from_secs(3600);
    let args: Vec<String> = std::env::args().skip(1).collect();
    if let [flag, value] = args.as_slice() {
        assert_eq!(flag, "--max-life-s", "usage: bench_idp [--max-life-s S]");
        max_life = Duration::from_secs(value.parse().expect("a number of seconds"));
    }
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async move {
        let key = idp::TestKey::rsa("bench-rs256");
        let server = idp::Idp::start(&[&key]).await;
        // Valid for a day; the gateway still re-verifies it every 10 minutes at most.
        let token = key.access_token(&server, json!({"exp": idp::unix_now() + 86_400}));
        let mut out = std::io::stdout().lock();
        writeln!(out, "issuer {}", server.issuer).unwrap();
        writeln!(out, "token {token}").unwrap();
        out.flush().unwrap();
        drop(out);
        tokio::time::sleep(max_life).await;
    });
}
