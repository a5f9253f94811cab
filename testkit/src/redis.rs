//! A real Redis for the fleet tests, never a mock. `PORTCULLIS_TEST_REDIS_URL`, when set, names
//! one to use; otherwise Debian's `redis-server` (installed by `make test-deps`) is started on
//! a free loopback port in a temporary directory, without persistence, and killed when
//! dropped. `stop` and `start_again` make an outage on the same port.

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

pub const URL_VAR: &str = "PORTCULLIS_TEST_REDIS_URL";

pub struct RedisServer {
    url: String,
    port: u16,
    /// `None` for a server named by `PORTCULLIS_TEST_REDIS_URL`.
    own: Option<Own>,
}

struct Own {
    dir: tempfile::TempDir,
    child: Option<Child>,
}

impl RedisServer {
    /// The server named by `PORTCULLIS_TEST_REDIS_URL`, else one of our own.
    pub fn start() -> RedisServer {
        match std::env::var(URL_VAR) {
            Ok(url) if !url.is_empty() => RedisServer {
                url,
                port: 0,
                own: None,
            },
            _ => RedisServer::start_own(),
        }
    }

    /// One of our own, which `stop` and `start_again` control. `None` only when an external
    /// server is named and `redis-server` is not installed: outage tests cannot run then.
    pub fn start_own_or_skip() -> Option<RedisServer> {
        let external = std::env::var(URL_VAR).is_ok_and(|u| !u.is_empty());
        if external && !installed() {
            eprintln!("skipped: needs redis-server to stop and start ({URL_VAR} names a server this test cannot stop)");
            return None;
        }
        Some(RedisServer::start_own())
    }

    pub fn start_own() -> RedisServer {
        assert!(
            installed(),
            "redis-server not found: install Debian's redis-server (make test-deps) or set {URL_VAR}"
        );
        let port = free_port();
        let mut server = RedisServer {
            url: format!("redis://127.0.0.1:{port}"),
            port,
            own: Some(Own {
                dir: tempfile::tempdir().unwrap(),
                child: None,
            }),
        };
        server.start_again();
        server
    }

    pub fn url(&self) -> &str {
        &self.url
    }

    pub fn is_own(&self) -> bool {
        self.own.is_some()
    }

    /// Kills the server (SIGKILL: a crash, not a shutdown) and waits for it to be gone.
    pub fn stop(&mut self) {
        let own = self
            .own
            .as_mut()
            .expect("an external Redis cannot be stopped");
        if let Some(mut child) = own.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// Starts the server on its port again (empty: nothing is saved) and waits for PING.
    pub fn start_again(&mut self) {
        let port = self.port;
        let own = self
            .own
            .as_mut()
            .expect("an external Redis cannot be started");
        assert!(own.child.is_none(), "redis-server is already running");
        let dir = own.dir.path();
        let log = std::fs::File::create(dir.join("redis.log")).unwrap();
        let child = Command::new("redis-server")
            .args(["--port", &port.to_string(), "--bind", "127.0.0.1"])
            .args(["--save", "", "--appendonly", "no"])
            .arg("--dir")
            .arg(dir)
            .stdin(Stdio::null())
            .stdout(log.try_clone().unwrap())
            .stderr(log)
            .spawn()
            .expect("cannot start redis-server");
        own.child = Some(child);
        let deadline = Instant::now() + Duration::from_secs(10);
        while !self.ping() {
            assert!(
                Instant::now() < deadline,
                "redis-server did not answer PING on port {port}:\n{}",
                self.log()
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// Empties our server (`FLUSHALL`), as an operator's mistake or a failover to an empty
    /// replica would. Only on a server of our own: a named one may be shared.
    pub fn flush_all(&self) {
        assert!(self.own.is_some(), "flush_all needs a server of our own");
        let mut s = TcpStream::connect(("127.0.0.1", self.port)).expect("redis answers");
        s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
        s.write_all(b"FLUSHALL\r\n").unwrap();
        let mut reply = [0u8; 5];
        s.read_exact(&mut reply).unwrap();
        assert_eq!(&reply, b"+OK\r\n");
    }

    /// Whether our server answers `PING` with `PONG`.
    pub fn ping(&self) -> bool {
        let Ok(mut s) = TcpStream::connect(("127.0.0.1", self.port)) else {
            return false;
        };
        let _ = s.set_read_timeout(Some(Duration::from_secs(1)));
        let mut reply = [0u8; 7];
        s.write_all(b"PING\r\n").is_ok()
            && s.read_exact(&mut reply).is_ok()
            && &reply == b"+PONG\r\n"
    }

    pub fn log(&self) -> String {
        self.own
            .as_ref()
            .and_then(|o| std::fs::read_to_string(o.dir.path().join("redis.log")).ok())
            .unwrap_or_default()
    }

    pub fn dir(&self) -> Option<PathBuf> {
        self.own.as_ref().map(|o| o.dir.path().to_path_buf())
    }
}

impl Drop for RedisServer {
    fn drop(&mut self) {
        if let Some(child) = self.own.as_mut().and_then(|o| o.child.as_mut()) {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

/// Whether `redis-server` is on the PATH.
pub fn installed() -> bool {
    Command::new("redis-server")
        .arg("--version")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success())
}

fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}
