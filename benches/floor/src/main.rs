//! The engine's floor for `make bench`: a bare Pingora 0.9 `ProxyHttp` that does
//! only what no gateway can skip: compare one static bearer, strip the `/v1/infer` prefix, drop
//! `Set-Cookie`, proxy to one upstream. Portcullis's cost per request is measured against it,
//! both on the same core at the same time (benches/load/run.py, paired rounds).
//!
//! Usage: `floor --listen ADDR --upstream ADDR --key TOKEN [--threads N]` (one worker thread
//! by default, like the gateway under test; the scaling stage gives it N, like the gateway's
//! `[server] threads`). Prints `listening ADDR threads N` once configured, so a script can tell
//! a floor that takes `--threads` from an older one that ignores it.

use async_trait::async_trait;
use bytes::Bytes;
use pingora::http::{RequestHeader, ResponseHeader};
use pingora::prelude::*;
use pingora::proxy::{ProxyHttp, Session};
use pingora::server::configuration::{Opt, ServerConf};
use pingora::upstreams::peer::HttpPeer;

struct Floor {
    peer: HttpPeer,
    expected: Vec<u8>,
}

const PREFIX: &[u8] = b"/v1/infer";

#[async_trait]
impl ProxyHttp for Floor {
    type CTX = ();

    fn new_ctx(&self) {}

    async fn request_filter(&self, session: &mut Session, _ctx: &mut ()) -> Result<bool> {
        let ok = session
            .req_header()
            .headers
            .get("authorization")
            .is_some_and(|v| v.as_bytes() == self.expected.as_slice());
        if ok {
            return Ok(false);
        }
        let mut h = ResponseHeader::build(401, Some(2))?;
        h.insert_header("content-length", "0")?;
        session.write_response_header(Box::new(h), true).await?;
        Ok(true)
    }

    async fn upstream_peer(&self, _session: &mut Session, _ctx: &mut ()) -> Result<Box<HttpPeer>> {
        Ok(Box::new(self.peer.clone()))
    }

    async fn upstream_request_filter(
        &self,
        _session: &mut Session,
        upstream: &mut RequestHeader,
        _ctx: &mut (),
    ) -> Result<()> {
        let path = upstream.raw_path();
        if path.starts_with(PREFIX) {
            let rest = Bytes::copy_from_slice(&path[PREFIX.len()..]);
            upstream.set_raw_path(&rest)?;
        }
        upstream.remove_header("authorization");
        Ok(())
    }

    async fn response_filter(
        &self,
        _session: &mut Session,
        response: &mut ResponseHeader,
        _ctx: &mut (),
    ) -> Result<()> {
        response.remove_header("set-cookie");
        Ok(())
    }
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let arg = |name: &str| {
        args.iter()
            .position(|a| a == name)
            .and_then(|i| args.get(i + 1))
            .unwrap_or_else(|| panic!("{name} is required"))
            .clone()
    };
    let (listen, upstream, key) = (arg("--listen"), arg("--upstream"), arg("--key"));
    let threads = worker_threads(&args);
    let conf = ServerConf {
        threads,
        // As the gateway under test runs: one single-threaded runtime per worker.
        work_stealing: false,
        ..ServerConf::default()
    };
    let mut server = Server::new_with_opt_and_conf(Opt::default(), conf);
    server.bootstrap();
    let floor = Floor {
        peer: HttpPeer::new(upstream.as_str(), false, String::new()),
        expected: format!("Bearer {key}").into_bytes(),
    };
    let mut proxy = pingora::proxy::http_proxy_service(&server.configuration, floor);
    proxy.add_tcp(&listen);
    proxy.threads = Some(threads);
    server.add_service(proxy);
    println!("listening {listen} threads {threads}");
    server.run_forever();
}

/// `--threads N` (at least 1), else 1.
fn worker_threads(args: &[String]) -> usize {
    let Some(i) = args.iter().position(|a| a == "--threads") else {
        return 1;
    };
    match args.get(i + 1).and_then(|v| v.parse::<usize>().ok()) {
        Some(n) if n >= 1 => n,
        _ => panic!("--threads needs a whole number of at least 1"),
    }
}
