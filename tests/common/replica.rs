//! Model-server replicas for the load-balancing tests: each listens on a given `ip:port`
//! (any 127.0.0.x: on Linux the whole 127.0.0.0/8 is loopback, so two replicas can share a
//! port on 127.0.0.2 and 127.0.0.3), can be killed (listener closed and every open connection
//! reset, mid-stream included) and started again on the same address, and records what it
//! gets in a log shared by all replicas of a test.
//!
//!   GET …/health          200 `{"status":"ok","replica":NAME}`, or 503 after `set_healthy(false)`
//!   …/sse?n=N&gap_ms=G    text/event-stream: N events `data: {"replica":NAME,"i":I}` G ms
//!                         apart (the first at once), then `data: [DONE]`
//!   …?…ms=M               (any other path) waits M ms, then the JSON answer below
//!   anything else         200 `{"replica":NAME,"method":…,"target":…}` (Content-Length, keep-alive)
//!
//! With `set_reset_before_answer(true)` every request but `/health` is read in full, recorded,
//! and answered by a TCP reset (SO_LINGER 0): the "accepted, then died" replica.

use std::net::{Ipv4Addr, SocketAddr};
use std::os::fd::AsRawFd;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;

#[derive(Debug, Clone)]
pub struct Hit {
    pub replica: String,
    pub method: String,
    /// Request target as received: path and query.
    pub target: String,
    pub body: Vec<u8>,
    pub at: Instant,
}

impl Hit {
    pub fn path(&self) -> &str {
        self.target.split('?').next().unwrap_or_default()
    }

    pub fn is_health_check(&self) -> bool {
        self.path().ends_with("/health")
    }
}

/// Every request any replica of a test received, in arrival order.
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

    fn push(&self, hit: Hit) {
        self.0.lock().unwrap().push(hit);
    }
}

struct State {
    name: String,
    log: HitLog,
    healthy: AtomicBool,
    reset: AtomicBool,
    /// Requests between their first byte arriving and their answer's last byte leaving.
    in_flight: AtomicUsize,
    /// Open connections.
    conns: AtomicUsize,
    /// Of the connections the last kill cut: how many had a request in flight (being
    /// answered, partly received, or unread bytes in the socket buffer).
    cut_in_flight: AtomicUsize,
}

struct Running {
    kill: watch::Sender<bool>,
    accept_done: std::sync::mpsc::Receiver<()>,
}

pub struct Replica {
    pub name: String,
    pub addr: SocketAddr,
    state: Arc<State>,
    rt: tokio::runtime::Handle,
    rt_stop: Option<tokio::sync::oneshot::Sender<()>>,
    running: Mutex<Option<Running>>,
}

impl Replica {
    /// A replica serving on `addr` from now on.
    pub fn start(name: &str, addr: SocketAddr, log: &HitLog) -> Replica {
        let r = Replica::stopped(name, addr, log);
        r.restart();
        r
    }

    /// A replica serving on 127.0.0.1 and a free port.
    pub fn local(name: &str, log: &HitLog) -> Replica {
        let port = super::free_port();
        Replica::start(name, SocketAddr::from(([127, 0, 0, 1], port)), log)
    }

    /// A replica that does not listen yet (connections to `addr` are refused): `restart` starts it.
    pub fn stopped(name: &str, addr: SocketAddr, log: &HitLog) -> Replica {
        let state = Arc::new(State {
            name: name.to_string(),
            log: log.clone(),
            healthy: AtomicBool::new(true),
            reset: AtomicBool::new(false),
            in_flight: AtomicUsize::new(0),
            conns: AtomicUsize::new(0),
            cut_in_flight: AtomicUsize::new(0),
        });
        // Its own runtime on its own thread: independent of the test's runtime and unaffected
        // by a test blocking its thread.
        let (handle_tx, handle_rx) = std::sync::mpsc::channel();
        let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
        std::thread::spawn(move || {
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .unwrap();
            handle_tx.send(rt.handle().clone()).unwrap();
            rt.block_on(async move {
                let _ = stop_rx.await;
            });
        });
        Replica {
            name: name.to_string(),
            addr,
            state,
            rt: handle_rx.recv().unwrap(),
            rt_stop: Some(stop_tx),
            running: Mutex::new(None),
        }
    }

    /// A replica on 127.0.0.1 and a free port that does not listen yet.
    pub fn stopped_local(name: &str, log: &HitLog) -> Replica {
        let port = super::free_port();
        Replica::stopped(name, SocketAddr::from(([127, 0, 0, 1], port)), log)
    }

    /// `http://ip:port`
    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// `ip:port`: the `replica` label and access-log field the gateway should use.
    pub fn host_port(&self) -> String {
        self.addr.to_string()
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
                Err(e) if Instant::now() < deadline => {
                    let _ = e;
                    std::thread::sleep(Duration::from_millis(50));
                }
                Err(e) => panic!("replica {} cannot bind {}: {e}", self.name, self.addr),
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
                        tokio::spawn(connection(conn, state.clone(), kill_rx.clone()));
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
            .expect("the replica's accept loop did not stop");
        let deadline = Instant::now() + Duration::from_secs(5);
        while self.state.conns.load(Ordering::SeqCst) > 0 {
            assert!(
                Instant::now() < deadline,
                "replica {}: connections still open after a kill",
                self.name
            );
            std::thread::sleep(Duration::from_millis(5));
        }
        self.state.cut_in_flight.load(Ordering::SeqCst)
    }
}

impl Drop for Replica {
    fn drop(&mut self) {
        if let Some(running) = self.running.lock().unwrap().take() {
            running.kill.send_replace(true);
        }
        if let Some(stop) = self.rt_stop.take() {
            let _ = stop.send(());
        }
    }
}

/// Free port on every one of `ips` (e.g. 127.0.0.2 and 127.0.0.3), for replicas that share a
/// port behind one DNS name.
pub fn free_port_on(ips: &[Ipv4Addr]) -> u16 {
    for _ in 0..100 {
        let first = std::net::TcpListener::bind((ips[0], 0)).unwrap();
        let port = first.local_addr().unwrap().port();
        if ips[1..]
            .iter()
            .all(|ip| std::net::TcpListener::bind((*ip, port)).is_ok())
        {
            return port;
        }
    }
    panic!("no port free on all of {ips:?}");
}

/// Bytes waiting unread in a socket's receive buffer.
fn unread_bytes(conn: &TcpStream) -> usize {
    let mut n: libc::c_int = 0;
    // SAFETY: FIONREAD writes one c_int through the pointer; the fd is open (we hold the stream).
    let rc = unsafe { libc::ioctl(conn.as_raw_fd(), libc::FIONREAD, &mut n) };
    if rc == 0 {
        n.max(0) as usize
    } else {
        0
    }
}

/// Closes with RST rather than FIN: SO_LINGER on, timeout 0.
fn set_reset_on_close(conn: &TcpStream) {
    let linger = libc::linger {
        l_onoff: 1,
        l_linger: 0,
    };
    // SAFETY: a valid linger struct and its size; the fd is open.
    unsafe {
        libc::setsockopt(
            conn.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_LINGER,
            &linger as *const libc::linger as *const libc::c_void,
            std::mem::size_of::<libc::linger>() as libc::socklen_t,
        );
    }
}

enum End {
    /// Peer closed, or an I/O error: a normal close.
    Close,
    /// Close with a reset (reset-before-answer mode).
    Reset,
}

async fn connection(mut conn: TcpStream, state: Arc<State>, mut kill: watch::Receiver<bool>) {
    let _ = conn.set_nodelay(true);
    // Set while a request of this connection is in flight; read after `serve` is dropped.
    let busy = AtomicBool::new(false);
    let killed = tokio::select! {
        end = serve(&mut conn, &state, &busy) => {
            if let End::Reset = end {
                set_reset_on_close(&conn);
            }
            false
        }
        _ = kill.changed() => true,
    };
    if busy.swap(false, Ordering::SeqCst) {
        state.in_flight.fetch_sub(1, Ordering::SeqCst);
        if killed {
            state.cut_in_flight.fetch_add(1, Ordering::SeqCst);
        }
    } else if killed && unread_bytes(&conn) > 0 {
        // A request sent before the kill that this task had not read yet: in flight too.
        state.cut_in_flight.fetch_add(1, Ordering::SeqCst);
    }
    if killed {
        set_reset_on_close(&conn);
    }
    drop(conn);
    state.conns.fetch_sub(1, Ordering::SeqCst);
}

fn set_busy(state: &State, busy: &AtomicBool, on: bool) {
    if busy.swap(on, Ordering::SeqCst) != on {
        if on {
            state.in_flight.fetch_add(1, Ordering::SeqCst);
        } else {
            state.in_flight.fetch_sub(1, Ordering::SeqCst);
        }
    }
}

struct Request {
    method: String,
    target: String,
    body: Vec<u8>,
}

async fn serve(conn: &mut TcpStream, state: &State, busy: &AtomicBool) -> End {
    let mut buf = Vec::new();
    loop {
        let Some(req) = read_request(conn, &mut buf, state, busy).await else {
            return End::Close;
        };
        let hit = Hit {
            replica: state.name.clone(),
            method: req.method.clone(),
            target: req.target.clone(),
            body: req.body.clone(),
            at: Instant::now(),
        };
        state.log.push(hit);
        let path = req.target.split('?').next().unwrap_or_default();
        let ok = if path.ends_with("/health") {
            let (code, status) = if state.healthy.load(Ordering::Relaxed) {
                ("200 OK", "ok")
            } else {
                ("503 Service Unavailable", "unhealthy")
            };
            let body = serde_json::json!({"status": status, "replica": state.name}).to_string();
            write_json(conn, code, &body).await
        } else if state.reset.load(Ordering::Relaxed) {
            return End::Reset;
        } else if path.ends_with("/sse") {
            sse(conn, &req.target, &state.name).await
        } else {
            let ms = query_param(&req.target, "ms", 0);
            if ms > 0 {
                tokio::time::sleep(Duration::from_millis(ms)).await;
            }
            let body = serde_json::json!({"replica": state.name, "method": req.method,
                "target": req.target})
            .to_string();
            write_json(conn, "200 OK", &body).await
        };
        set_busy(state, busy, !buf.is_empty());
        if !ok {
            return End::Close;
        }
    }
}

fn query_param(target: &str, name: &str, default: u64) -> u64 {
    let query = target.split_once('?').map(|(_, q)| q).unwrap_or_default();
    query
        .split('&')
        .find_map(|kv| kv.strip_prefix(name)?.strip_prefix('=')?.parse().ok())
        .unwrap_or(default)
}

async fn write_json(conn: &mut TcpStream, status: &str, body: &str) -> bool {
    let msg = format!(
        "HTTP/1.1 {status}\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n{body}",
        body.len()
    );
    conn.write_all(msg.as_bytes()).await.is_ok()
}

async fn sse(conn: &mut TcpStream, target: &str, name: &str) -> bool {
    let n = query_param(target, "n", 5);
    let gap = Duration::from_millis(query_param(target, "gap_ms", 100));
    let head = "HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ncache-control: no-cache\r\n\
                transfer-encoding: chunked\r\n\r\n";
    if conn.write_all(head.as_bytes()).await.is_err() {
        return false;
    }
    for i in 0..=n {
        if i > 0 {
            tokio::time::sleep(gap).await;
        }
        let event = if i == n {
            "data: [DONE]\n\n".to_string()
        } else {
            format!("data: {}\n\n", serde_json::json!({"replica": name, "i": i}))
        };
        let chunk = format!("{:x}\r\n{event}\r\n", event.len());
        if conn.write_all(chunk.as_bytes()).await.is_err() || conn.flush().await.is_err() {
            return false;
        }
    }
    conn.write_all(b"0\r\n\r\n").await.is_ok()
}

/// Reads one request (Content-Length or chunked body); marks the connection busy from the
/// first byte of it. None when the peer closed or sent garbage.
async fn read_request(
    conn: &mut TcpStream,
    buf: &mut Vec<u8>,
    state: &State,
    busy: &AtomicBool,
) -> Option<Request> {
    let mut chunk = [0u8; 16 * 1024];
    async fn fill(
        conn: &mut TcpStream,
        buf: &mut Vec<u8>,
        chunk: &mut [u8],
        state: &State,
        busy: &AtomicBool,
    ) -> Option<()> {
        let n = conn.read(chunk).await.ok()?;
        if n == 0 {
            return None;
        }
        buf.extend_from_slice(&chunk[..n]);
        set_busy(state, busy, true);
        Some(())
    }
    let (method, target, headers, head_len) = loop {
        let mut headers = [httparse::EMPTY_HEADER; 64];
        let mut parsed = httparse::Request::new(&mut headers);
        match parsed.parse(buf) {
            Ok(httparse::Status::Complete(n)) => {
                let hs = super::header_pairs(parsed.headers);
                break (parsed.method?.to_string(), parsed.path?.to_string(), hs, n);
            }
            Ok(httparse::Status::Partial) => {}
            Err(_) => return None,
        }
        fill(conn, buf, &mut chunk, state, busy).await?;
    };
    buf.drain(..head_len);
    let header = |name: &str| {
        headers
            .iter()
            .find(|(k, _)| k == name)
            .map(|(_, v)| v.as_str())
    };
    let mut body = Vec::new();
    if let Some(len) = header("content-length").and_then(|v| v.trim().parse::<usize>().ok()) {
        while buf.len() < len {
            fill(conn, buf, &mut chunk, state, busy).await?;
        }
        body = buf.drain(..len).collect();
    } else if header("transfer-encoding").is_some_and(|v| v.contains("chunked")) {
        loop {
            let line_end = loop {
                if let Some(p) = buf.windows(2).position(|w| w == b"\r\n") {
                    break p;
                }
                fill(conn, buf, &mut chunk, state, busy).await?;
            };
            let size_text = String::from_utf8_lossy(&buf[..line_end]).to_string();
            let size = usize::from_str_radix(size_text.split(';').next()?.trim(), 16).ok()?;
            while buf.len() < line_end + 2 + size + 2 {
                fill(conn, buf, &mut chunk, state, busy).await?;
            }
            body.extend_from_slice(&buf[line_end + 2..line_end + 2 + size]);
            buf.drain(..line_end + 2 + size + 2);
            if size == 0 {
                break;
            }
        }
    }
    Some(Request {
        method,
        target,
        body,
    })
}

/// A TCP address that never completes a connection: a listener with a backlog of 0 whose one
/// queue slot is taken, so the kernel drops every further SYN and connects time out (the
/// shape of a host that vanished from the network, as opposed to a refused port).
pub struct Blackhole {
    pub addr: SocketAddr,
    _listener: std::net::TcpListener,
    _filler: Vec<std::net::TcpStream>,
}

impl Blackhole {
    pub fn start() -> Blackhole {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        // SAFETY: listen(2) on our own listening socket just lowers its backlog.
        let rc = unsafe { libc::listen(listener.as_raw_fd(), 0) };
        assert_eq!(rc, 0, "listen(0) failed");
        let addr = listener.local_addr().unwrap();
        let mut filler = Vec::new();
        // Fill the accept queue (one slot with backlog 0); later connects must time out.
        loop {
            match std::net::TcpStream::connect_timeout(&addr, Duration::from_millis(300)) {
                Ok(s) => filler.push(s),
                Err(_) => break,
            }
            assert!(
                filler.len() < 8,
                "the blackhole keeps accepting connections"
            );
        }
        Blackhole {
            addr,
            _listener: listener,
            _filler: filler,
        }
    }

    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    pub fn host_port(&self) -> String {
        self.addr.to_string()
    }
}
