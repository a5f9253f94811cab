//! The fake model server: one configurable OpenAI-style upstream for every test and bench.
//! It records what it gets, answers by path (see `serve.rs`), paces SSE, and plays a replica:
//! it listens on any 127.0.0.x (on Linux the whole 127.0.0.0/8 is loopback, so two replicas can
//! share a port on 127.0.0.2 and 127.0.0.3), can fail its health check, reset instead of
//! answering, be killed (listener closed and every open connection reset, mid-stream included)
//! and start again on the same address. Replicas of one test may share one `HitLog`.
//! Under `/oa/` it answers as the OpenAI API does (`openai.rs`): the token counts it reports
//! are the constants below, the bodies it sends `json_body`, `sse_body` and `embeddings_body`,
//! in the content coding negotiated or forced (`Coding`); the agent APIs (OpenAI Responses,
//! Anthropic Messages) likewise, in `agents.rs`.
//! In model mode (`Upstream::model`) it answers as the demo model of `model.rs` instead, in
//! sim mode (`Upstream::sim`) as a model server with a prefix cache (`sim.rs`).

mod agents;
mod coding;
mod model;
mod openai;
mod serve;
mod sim;
mod wire;

#[cfg(test)]
mod tests;
#[cfg(test)]
mod tests_agents;

pub use agents::{
    agent_json_body, agent_sse_body, responses_usage_json, AgentEndpoint, MessagesUsage,
    COUNT_TOKENS, MESSAGES_JSON_USAGE, MESSAGES_SSE_USAGE, RESPONSES_JSON_USAGE,
    RESPONSES_SSE_USAGE,
};
pub use coding::Coding;
pub use openai::{
    embeddings_body, json_body, sse_body, Endpoint, Usage, CHAT_JSON_USAGE, CHAT_SSE_USAGE,
    COMPLETIONS_JSON_USAGE, COMPLETIONS_SSE_USAGE, CREATED, EMBEDDINGS_USAGE,
};
pub use sim::{SimSettings, BLOCK as SIM_BLOCK};

use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

use tokio::net::TcpListener;
use tokio::sync::watch;

/// One request as the upstream received it.
#[derive(Debug, Clone)]
pub struct Hit {
    /// The name of the upstream (replica) that received it.
    pub replica: String,
    pub method: String,
    /// Request target as received: path and query.
    pub target: String,
    /// Names lower-cased, in order.
    pub headers: Vec<(String, String)>,
    pub body: Vec<u8>,
    pub at: Instant,
}

impl Hit {
    pub fn path(&self) -> &str {
        self.target.split('?').next().unwrap_or_default()
    }

    /// The path percent-decoded as uvicorn decodes it (every `%XX`, invalid UTF-8 replaced):
    /// what the fake upstream routes on.
    pub fn decoded_path(&self) -> String {
        percent_encoding::percent_decode_str(self.path())
            .decode_utf8_lossy()
            .into_owned()
    }

    pub fn is_health_check(&self) -> bool {
        self.decoded_path().ends_with("/health")
    }

    pub fn header(&self, name: &str) -> Option<&str> {
        crate::http::header(&self.headers, name)
    }

    pub fn header_count(&self, name: &str) -> usize {
        self.headers
            .iter()
            .filter(|(k, _)| k.eq_ignore_ascii_case(name))
            .count()
    }
}

/// Every request any upstream sharing the log received, in arrival order.
#[derive(Clone, Default)]
pub struct HitLog(Arc<Mutex<Vec<Hit>>>);

impl HitLog {
    pub fn new() -> HitLog {
        HitLog::default()
    }

    pub fn all(&self) -> Vec<Hit> {
        self.0.lock().unwrap().clone()
    }

    /// Requests other than health checks.
    pub fn requests(&self) -> Vec<Hit> {
        self.all()
            .into_iter()
            .filter(|h| !h.is_health_check())
            .collect()
    }

    /// Requests (not health checks) whose target contains `needle`.
    pub fn matching(&self, needle: &str) -> Vec<Hit> {
        self.requests()
            .into_iter()
            .filter(|h| h.target.contains(needle))
            .collect()
    }

    /// Replica names that received a request whose target contains `needle`.
    pub fn replicas_for(&self, needle: &str) -> Vec<String> {
        self.matching(needle)
            .into_iter()
            .map(|h| h.replica)
            .collect()
    }

    /// Requests (not health checks) received by `replica`.
    pub fn count(&self, replica: &str) -> usize {
        self.requests()
            .iter()
            .filter(|h| h.replica == replica)
            .count()
    }

    pub fn health_checks(&self, replica: &str) -> usize {
        self.all()
            .iter()
            .filter(|h| h.replica == replica && h.is_health_check())
            .count()
    }

    /// Forgets everything recorded so far: a run of hours clears it now and then, so the
    /// record does not grow without bound.
    pub fn clear(&self) {
        self.0.lock().unwrap().clear();
    }

    fn push(&self, hit: Hit) {
        self.0.lock().unwrap().push(hit);
    }
}

/// One streamed answer as the upstream wrote it.
#[derive(Default)]
pub struct StreamLog {
    /// When each event was written.
    pub sent: Vec<Instant>,
    /// When a write first failed because the peer closed the connection.
    pub aborted: Option<Instant>,
    pub finished: bool,
}

struct State {
    name: String,
    log: HitLog,
    streams: Mutex<Vec<Arc<Mutex<StreamLog>>>>,
    healthy: AtomicBool,
    reset: AtomicBool,
    /// Requests between their first byte arriving and their answer's last byte leaving.
    in_flight: AtomicUsize,
    /// Open connections.
    conns: AtomicUsize,
    /// Of the connections the last kill cut: how many had a request in flight (being
    /// answered, partly received, or unread bytes in the socket buffer).
    cut_in_flight: AtomicUsize,
    /// Set in model mode: every request but `/health` is answered by `model.rs`.
    model: OnceLock<model::Model>,
    /// Set in sim mode: every request but `/health` is answered by `sim.rs`.
    sim: OnceLock<sim::Sim>,
}

impl State {
    fn set_busy(&self, busy: &AtomicBool, on: bool) {
        if busy.swap(on, Ordering::SeqCst) != on {
            if on {
                self.in_flight.fetch_add(1, Ordering::SeqCst);
            } else {
                self.in_flight.fetch_sub(1, Ordering::SeqCst);
            }
        }
    }
}

struct Running {
    kill: watch::Sender<bool>,
    accept_done: std::sync::mpsc::Receiver<()>,
}

pub struct Upstream {
    pub name: String,
    pub addr: SocketAddr,
    pub port: u16,
    state: Arc<State>,
    rt: tokio::runtime::Handle,
    rt_stop: Option<tokio::sync::oneshot::Sender<()>>,
    running: Mutex<Option<Running>>,
}

impl Upstream {
    /// An upstream of its own on 127.0.0.1 and a free port, named `upstream`.
    pub fn start() -> Upstream {
        Upstream::local("upstream", &HitLog::new())
    }

    /// A replica serving on `addr` from now on, recording into `log`.
    pub fn replica(name: &str, addr: SocketAddr, log: &HitLog) -> Upstream {
        let r = Upstream::stopped(name, addr, log);
        r.restart();
        r
    }

    /// A replica serving on 127.0.0.1 and a free port.
    pub fn local(name: &str, log: &HitLog) -> Upstream {
        Upstream::replica(name, crate::net::local_addr(), log)
    }

    /// A replica on 127.0.0.1 and a free port that does not listen yet.
    pub fn stopped_local(name: &str, log: &HitLog) -> Upstream {
        Upstream::stopped(name, crate::net::local_addr(), log)
    }

    /// A replica that does not listen yet (connections to `addr` are refused): `restart`
    /// starts it.
    pub fn stopped(name: &str, addr: SocketAddr, log: &HitLog) -> Upstream {
        let state = Arc::new(State {
            name: name.to_string(),
            log: log.clone(),
            streams: Mutex::new(Vec::new()),
            healthy: AtomicBool::new(true),
            reset: AtomicBool::new(false),
            in_flight: AtomicUsize::new(0),
            conns: AtomicUsize::new(0),
            cut_in_flight: AtomicUsize::new(0),
            model: OnceLock::new(),
            sim: OnceLock::new(),
        });
        // Its own runtime on its own threads: independent of the test's runtime and unaffected
        // by a test blocking its thread.
        let (handle_tx, handle_rx) = std::sync::mpsc::channel();
        let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
        std::thread::spawn(move || {
            let rt = tokio::runtime::Builder::new_multi_thread()
                .worker_threads(2)
                .enable_all()
                .build()
                .unwrap();
            handle_tx.send(rt.handle().clone()).unwrap();
            rt.block_on(async move {
                let _ = stop_rx.await;
            });
        });
        Upstream {
            name: name.to_string(),
            addr,
            port: addr.port(),
            state,
            rt: handle_rx.recv().unwrap(),
            rt_stop: Some(stop_tx),
            running: Mutex::new(None),
        }
    }

    /// The demo model on `addr` (see `model.rs`), streaming `token_delay` apart: what `make
    /// run` and the SDK suites talk to. `/health`, kill, restart and reset work as in test mode.
    pub fn model(name: &str, addr: SocketAddr, token_delay: Duration) -> Upstream {
        let u = Upstream::stopped(name, addr, &HitLog::new());
        let _ = u.state.model.set(model::Model::new(token_delay));
        u.restart();
        u
    }

    /// A simulated model server with a prefix cache on `addr` (see `sim.rs`): what the
    /// affinity tests and the routing benchmark measure cache hits and time to first token on.
    pub fn sim(name: &str, addr: SocketAddr, settings: SimSettings) -> Upstream {
        let u = Upstream::stopped(name, addr, &HitLog::new());
        let _ = u.state.sim.set(sim::Sim::new(settings));
        u.restart();
        u
    }

    /// In model mode: one line per request on stderr.
    pub fn set_verbose(&self, on: bool) {
        if let Some(model) = self.state.model.get() {
            model.verbose.store(on, Ordering::Relaxed);
        }
    }

    /// `http://ip:port` followed by `base` (a base path, or "").
    pub fn url(&self, base: &str) -> String {
        format!("http://{}{base}", self.addr)
    }

    /// `ip:port`: the `replica` label and access-log field the gateway should use.
    pub fn host_port(&self) -> String {
        self.addr.to_string()
    }

    /// What this upstream received, health checks included, in arrival order.
    pub fn requests(&self) -> Vec<Hit> {
        let log = self.state.log.all();
        log.into_iter().filter(|h| h.replica == self.name).collect()
    }

    pub fn last(&self) -> Hit {
        self.requests()
            .pop()
            .expect("the upstream received no request")
    }

    /// The `i`-th streamed answer this upstream started.
    pub fn stream(&self, i: usize) -> Arc<Mutex<StreamLog>> {
        self.state.streams.lock().unwrap()[i].clone()
    }

    pub fn set_healthy(&self, healthy: bool) {
        self.state.healthy.store(healthy, Ordering::Relaxed);
    }

    pub fn set_reset_before_answer(&self, reset: bool) {
        self.state.reset.store(reset, Ordering::Relaxed);
    }

    pub fn in_flight(&self) -> usize {
        self.state.in_flight.load(Ordering::Relaxed)
    }

    pub fn is_running(&self) -> bool {
        self.running.lock().unwrap().is_some()
    }

    /// Starts listening on `addr` again (a no-op if it listens). Panics if the address stays
    /// taken for 5 s.
    pub fn restart(&self) {
        let mut running = self.running.lock().unwrap();
        if running.is_some() {
            return;
        }
        let deadline = Instant::now() + Duration::from_secs(5);
        // std sets SO_REUSEADDR on Unix: connections reset by a kill leave nothing behind
        // anyway, but a gracefully closed one may sit in TIME_WAIT.
        let listener = loop {
            match std::net::TcpListener::bind(self.addr) {
                Ok(l) => break l,
                Err(_) if Instant::now() < deadline => {
                    std::thread::sleep(Duration::from_millis(50))
                }
                Err(e) => panic!("upstream {} cannot bind {}: {e}", self.name, self.addr),
            }
        };
        listener.set_nonblocking(true).unwrap();
        let (kill_tx, kill_rx) = watch::channel(false);
        let (done_tx, done_rx) = std::sync::mpsc::channel();
        let state = self.state.clone();
        self.rt.spawn(async move {
            let listener = TcpListener::from_std(listener).unwrap();
            let mut kill = kill_rx.clone();
            loop {
                tokio::select! {
                    _ = kill.changed() => break,
                    accepted = listener.accept() => {
                        let Ok((conn, _)) = accepted else { continue };
                        state.conns.fetch_add(1, Ordering::SeqCst);
                        tokio::spawn(serve::connection(conn, state.clone(), kill_rx.clone()));
                    }
                }
            }
            drop(listener);
            let _ = done_tx.send(());
        });
        *running = Some(Running {
            kill: kill_tx,
            accept_done: done_rx,
        });
    }

    /// Stops listening and resets every open connection at once, streams included. Returns,
    /// once all are gone, how many of them had a request in flight. A no-op (0) if stopped.
    /// Blocks the calling thread for as long as that takes (milliseconds).
    pub fn kill(&self) -> usize {
        let Some(running) = self.running.lock().unwrap().take() else {
            return 0;
        };
        self.state.cut_in_flight.store(0, Ordering::SeqCst);
        running.kill.send_replace(true);
        running
            .accept_done
            .recv_timeout(Duration::from_secs(5))
            .expect("the upstream's accept loop did not stop");
        let deadline = Instant::now() + Duration::from_secs(5);
        while self.state.conns.load(Ordering::SeqCst) > 0 {
            assert!(
                Instant::now() < deadline,
                "upstream {}: connections still open after a kill",
                self.name
            );
            std::thread::sleep(Duration::from_millis(5));
        }
        self.state.cut_in_flight.load(Ordering::SeqCst)
    }
}

/// An upstream as a program (the `fake-upstream` and `sim-replica` binaries): `start` makes it
/// on `addr`, then `LISTENING <port>` is printed and it serves until SIGTERM or SIGINT.
pub fn serve_until_signal(addr: SocketAddr, start: impl FnOnce() -> Upstream) {
    use std::io::Write;
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    // The handlers are in place before LISTENING, so a stop right after it still exits 0.
    let (mut term, mut int) = rt.block_on(async {
        use tokio::signal::unix::{signal, SignalKind};
        (
            signal(SignalKind::terminate()).unwrap(),
            signal(SignalKind::interrupt()).unwrap(),
        )
    });
    let upstream = start();
    let mut out = std::io::stdout();
    let _ = writeln!(out, "LISTENING {}", addr.port());
    let _ = out.flush();
    rt.block_on(async {
        tokio::select! {
            _ = term.recv() => {}
            _ = int.recv() => {}
        }
    });
    drop(upstream);
}

impl Drop for Upstream {
    fn drop(&mut self) {
        if let Some(running) = self.running.lock().unwrap().take() {
            running.kill.send_replace(true);
        }
        if let Some(stop) = self.rt_stop.take() {
            let _ = stop.send(());
        }
    }
}
