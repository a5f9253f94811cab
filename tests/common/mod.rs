//! Test harness: a recording upstream on real TCP, the real gateway binary as a child
//! process on loopback, API keys made through the real CLI, and a raw HTTP client for
//! requests no well-behaved client library would send.
#![allow(dead_code)]

pub mod dns;
pub mod idp;
pub mod postgres;
pub mod redis;
pub mod replica;
pub mod upstream;

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// Status, lower-cased headers in order, body.
pub type RawResponse = (u16, Vec<(String, String)>, Vec<u8>);

pub const BIN: &str = env!("CARGO_BIN_EXE_portcullis");

pub fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

pub struct Service<'a> {
    pub name: &'a str,
    pub upstream: String,
    pub scope: &'a str,
    /// Extra lines inside the service's table, e.g. `read_timeout_seconds = 1`.
    pub extra: &'a str,
}

impl<'a> Service<'a> {
    pub fn new(name: &'a str, upstream: impl Into<String>) -> Service<'a> {
        Service {
            name,
            upstream: upstream.into(),
            scope: name,
            extra: "",
        }
    }

    /// A service with a list of replicas: `upstream = ["url1", "url2", …]`.
    pub fn replicas(name: &'a str, urls: &[String]) -> Service<'a> {
        let list: Vec<String> = urls.iter().map(|u| format!("\"{u}\"")).collect();
        Service::new(name, format!("[{}]", list.join(", ")))
    }
}

pub struct Gateway {
    pub port: u16,
    pub metrics_port: u16,
    pub dir: tempfile::TempDir,
    pub config: PathBuf,
    child: Child,
}

pub struct GatewayBuilder<'a> {
    services: Vec<Service<'a>>,
    extra: String,
    env: Vec<(String, String)>,
    cache_ttl: u64,
    grace_period: u64,
    max_body: u64,
    /// `[auth.api_keys] database`; a SQLite file of the gateway's own by default.
    key_store: Option<String>,
    args: Vec<String>,
}

impl<'a> GatewayBuilder<'a> {
    pub fn service(mut self, s: Service<'a>) -> Self {
        self.services.push(s);
        self
    }

    /// Extra TOML appended after the generated sections; `{dir}` stands for the gateway's
    /// temporary directory.
    pub fn extra(mut self, toml: &str) -> Self {
        self.extra.push_str(toml);
        self
    }

    pub fn env(mut self, k: &str, v: &str) -> Self {
        self.env.push((k.into(), v.into()));
        self
    }

    pub fn cache_ttl(mut self, seconds: u64) -> Self {
        self.cache_ttl = seconds;
        self
    }

    /// `server.grace_period_seconds` (default 5).
    /// A key store shared with other gateways, e.g. a Postgres URL.
    pub fn key_store(mut self, database: &str) -> Self {
        self.key_store = Some(database.to_string());
        self
    }

    pub fn max_body(mut self, bytes: u64) -> Self {
        self.max_body = bytes;
        self
    }

    pub fn grace_period(mut self, seconds: u64) -> Self {
        self.grace_period = seconds;
        self
    }

    /// An extra argument to `serve`, e.g. `-d`.
    pub fn arg(mut self, arg: &str) -> Self {
        self.args.push(arg.into());
        self
    }

    pub fn start(self) -> Gateway {
        let dir = tempfile::tempdir().unwrap();
        let port = free_port();
        let metrics_port = free_port();
        let d = dir.path().display();
        let mut toml = format!(
            "[server]\nlisten = [\"127.0.0.1:{port}\"]\nthreads = 2\n\
             grace_period_seconds = {}\ngraceful_shutdown_timeout_seconds = 1\n\
             upgrade_sock = \"{d}/upgrade.sock\"\npid_file = \"{d}/portcullis.pid\"\n\
             max_request_body_bytes = {}\n\
             [metrics]\nlisten = \"127.0.0.1:{metrics_port}\"\n\
             [auth.api_keys]\ndatabase = \"{}\"\n\
             cache_ttl_seconds = {}\nnegative_cache_ttl_seconds = 1\n",
            self.grace_period,
            self.max_body,
            self.key_store
                .clone()
                .unwrap_or_else(|| format!("sqlite://{d}/keys.db")),
            self.cache_ttl
        );
        for s in &self.services {
            // A list (from `Service::replicas`) is written as it is, a single URL quoted.
            let upstream = if s.upstream.starts_with('[') {
                s.upstream.clone()
            } else {
                format!("\"{}\"", s.upstream)
            };
            toml.push_str(&format!(
                "[services.{}]\nupstream = {}\nscope = \"{}\"\n{}\n",
                s.name, upstream, s.scope, s.extra
            ));
        }
        toml.push_str(&self.extra.replace("{dir}", &d.to_string()));
        let config = dir.path().join("portcullis.toml");
        std::fs::write(&config, toml).unwrap();
        let log = std::fs::File::create(dir.path().join("gateway.log")).unwrap();
        let mut cmd = Command::new(BIN);
        cmd.args(["serve", "--config"])
            .arg(&config)
            .args(&self.args)
            .env("RUST_LOG", "info")
            .stdout(log.try_clone().unwrap())
            .stderr(log);
        for (k, v) in &self.env {
            cmd.env(k, v);
        }
        let child = cmd.spawn().unwrap();
        let gw = Gateway {
            port,
            metrics_port,
            dir,
            config,
            child,
        };
        gw.wait_ready();
        gw
    }
}

impl Gateway {
    pub fn builder<'a>() -> GatewayBuilder<'a> {
        GatewayBuilder {
            services: Vec::new(),
            extra: String::new(),
            env: Vec::new(),
            cache_ttl: 15,
            grace_period: 5,
            max_body: 4096,
            key_store: None,
            args: Vec::new(),
        }
    }

    fn wait_ready(&self) {
        let deadline = Instant::now() + Duration::from_secs(20);
        while Instant::now() < deadline {
            if let Ok((200, _, _)) = try_raw(
                self.port,
                b"GET /healthz HTTP/1.1\r\nHost: t\r\nConnection: close\r\n\r\n",
            ) {
                return;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        panic!("gateway did not start:\n{}", self.log());
    }

    pub fn url(&self, path: &str) -> String {
        format!("http://127.0.0.1:{}{}", self.port, path)
    }

    pub fn log(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("gateway.log")).unwrap_or_default()
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Creates a key through the real CLI; returns (full key, key id).
    pub fn create_key(&self, scopes: &str, extra: &[&str]) -> (String, String) {
        let out = cli(
            &self.config,
            &[
                &["keys", "create", "--name", "test", "--scopes", scopes],
                extra,
            ]
            .concat(),
        );
        assert!(
            out.status.success(),
            "keys create failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        let stdout = String::from_utf8(out.stdout).unwrap();
        let key = stdout.lines().last().unwrap().to_string();
        let id = key
            .strip_prefix("ak_")
            .and_then(|k| k.split('.').next())
            .unwrap()
            .to_string();
        (key, id)
    }

    pub fn revoke(&self, key_id: &str) {
        let out = cli(&self.config, &["keys", "revoke", key_id]);
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
    }

    pub fn raw(&self, request: &[u8]) -> RawResponse {
        raw(self.port, request)
    }

    /// Starts an authorised GET stream and returns it once its first chunk has arrived.
    pub async fn open_sse(&self, key: &str, path: &str) -> reqwest::Response {
        let mut resp = client()
            .get(self.url(path))
            .bearer_auth(key)
            .send()
            .await
            .unwrap();
        assert_eq!(resp.status(), 200, "{path}");
        resp.chunk()
            .await
            .unwrap()
            .expect("the stream ended before its first event");
        resp
    }

    pub fn metrics(&self) -> String {
        let (status, _, body) = raw(
            self.metrics_port,
            b"GET /metrics HTTP/1.1\r\nHost: m\r\nConnection: close\r\n\r\n",
        );
        assert_eq!(status, 200);
        String::from_utf8(body).unwrap()
    }

    pub fn signal(&self, signal: &str) {
        let ok = Command::new("kill")
            .args([&format!("-{signal}"), &self.child.id().to_string()])
            .status()
            .unwrap()
            .success();
        assert!(ok);
    }

    /// Waits for the process to exit; None if it is still running after `within`.
    pub fn wait_exit(&mut self, within: Duration) -> Option<std::process::ExitStatus> {
        let deadline = Instant::now() + within;
        while Instant::now() < deadline {
            if let Some(status) = self.child.try_wait().unwrap() {
                return Some(status);
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        None
    }
}

impl Drop for Gateway {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Another gateway process in a gateway's directory, e.g. the new one of an upgrade (`-u`).
/// Killed when dropped.
pub struct Proc {
    child: Child,
    pub log: PathBuf,
}

impl Gateway {
    /// Starts `portcullis serve --config CONFIG ARGS…` (RUST_LOG=info), logging to `<dir>/<log_name>`.
    pub fn spawn_serve(&self, config: &Path, args: &[&str], log_name: &str) -> Proc {
        let log = self.dir.path().join(log_name);
        let file = std::fs::File::create(&log).unwrap();
        let child = Command::new(BIN)
            .args(["serve", "--config"])
            .arg(config)
            .args(args)
            .env("RUST_LOG", "info")
            .stdout(file.try_clone().unwrap())
            .stderr(file)
            .spawn()
            .unwrap();
        Proc { child, log }
    }
}

impl Gateway {
    /// Starts the new process of a graceful upgrade (`serve -u`) and returns once it listens
    /// on `upgrade_sock`, ready for the old one's sockets: the same wait as the systemd unit's
    /// ExecReload, so SIGQUIT is never sent to a process with nobody to hand over to.
    pub fn spawn_upgrade(&self, config: &Path) -> Proc {
        use std::os::unix::fs::FileTypeExt;
        let sock = self.dir.path().join("upgrade.sock");
        let _ = std::fs::remove_file(&sock);
        let mut new = self.spawn_serve(config, &["-u"], "new.log");
        let deadline = Instant::now() + Duration::from_secs(20);
        while !std::fs::metadata(&sock).is_ok_and(|m| m.file_type().is_socket()) {
            assert!(
                new.wait_exit(Duration::ZERO).is_none(),
                "the new process exited:\n{}",
                new.log()
            );
            assert!(
                Instant::now() < deadline,
                "no upgrade socket:\n{}",
                new.log()
            );
            std::thread::sleep(Duration::from_millis(20));
        }
        new
    }
}

impl Proc {
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    pub fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    pub fn signal(&self, signal: &str) {
        signal_pid(self.child.id(), signal);
    }

    /// Waits for the process to exit; None if it is still running after `within` (checked at
    /// least once, so `Duration::ZERO` asks "still running?").
    pub fn wait_exit(&mut self, within: Duration) -> Option<std::process::ExitStatus> {
        let deadline = Instant::now() + within;
        loop {
            if let Some(status) = self.child.try_wait().unwrap() {
                return Some(status);
            }
            if Instant::now() >= deadline {
                return None;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// `kill -SIGNAL pid`.
pub fn signal_pid(pid: u32, signal: &str) {
    let ok = Command::new("kill")
        .args([&format!("-{signal}"), &pid.to_string()])
        .status()
        .unwrap()
        .success();
    assert!(ok, "kill -{signal} {pid} failed");
}

/// Whether a process (not necessarily our child) is running: a zombie nobody reaped is not.
pub fn pid_alive(pid: u32) -> bool {
    let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else {
        return false;
    };
    // The state follows the parenthesised command name, which may itself hold spaces.
    let state = stat
        .rsplit_once(')')
        .and_then(|(_, rest)| rest.trim_start().chars().next());
    !matches!(state, Some('Z') | Some('X') | None)
}

/// Reads one response with a Content-Length from a connection that may be kept alive.
/// `Ok(None)` when the server closed the connection before sending a byte of it.
pub fn read_response(s: &mut TcpStream) -> std::io::Result<Option<RawResponse>> {
    let mut buf = Vec::new();
    let mut chunk = [0u8; 16 * 1024];
    loop {
        match s.read(&mut chunk) {
            Ok(0) if buf.is_empty() => return Ok(None),
            Ok(0) => break,
            Ok(n) => buf.extend_from_slice(&chunk[..n]),
            Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset && buf.is_empty() => {
                return Ok(None)
            }
            Err(e) => return Err(e),
        }
        if let Some(done) = complete_response(&buf) {
            buf.truncate(done);
            break;
        }
    }
    parse_response(&buf).map(Some).ok_or_else(|| {
        std::io::Error::other(format!(
            "unparsable response: {:?}",
            String::from_utf8_lossy(&buf)
        ))
    })
}

/// Writes `toml` to `dir/c.toml` and runs `serve -t` on it: (succeeded, stderr).
pub fn check_config(dir: &Path, toml: &str) -> (bool, String) {
    let config = dir.join("c.toml");
    std::fs::write(&config, toml).unwrap();
    let out = Command::new(BIN)
        .args(["serve", "-t", "--config"])
        .arg(&config)
        .output()
        .unwrap();
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// A gateway whose `infer` upstream refuses connections and whose `embed` upstream is `up`
/// with a one-second read timeout: the shapes of 502 and 504.
pub fn failing_gateway(up: &upstream::Upstream) -> Gateway {
    let dead = format!("http://127.0.0.1:{}", free_port());
    Gateway::builder()
        .service(Service::new("infer", dead))
        .service(Service {
            extra: "read_timeout_seconds = 1",
            ..Service::new("embed", up.url(""))
        })
        .start()
}

/// Runs the CLI with `--config` appended to the subcommand's arguments.
pub fn cli(config: &Path, args: &[&str]) -> std::process::Output {
    Command::new(BIN)
        .args(args)
        .arg("--config")
        .arg(config)
        .stdin(Stdio::null())
        .output()
        .unwrap()
}

pub fn header<'a>(headers: &'a [(String, String)], name: &str) -> Option<&'a str> {
    headers
        .iter()
        .find(|(k, _)| k.eq_ignore_ascii_case(name))
        .map(|(_, v)| v.as_str())
}

/// Sends raw bytes (the request should say `Connection: close`) and parses the response.
pub fn raw(port: u16, request: &[u8]) -> RawResponse {
    try_raw(port, request).unwrap_or_else(|e| panic!("raw request failed: {e}"))
}

pub fn try_raw(port: u16, request: &[u8]) -> std::io::Result<RawResponse> {
    let mut s = TcpStream::connect(("127.0.0.1", port))?;
    s.set_read_timeout(Some(Duration::from_secs(15)))?;
    s.write_all(request)?;
    let mut buf = Vec::new();
    let mut chunk = [0u8; 16 * 1024];
    loop {
        match s.read(&mut chunk) {
            Ok(0) => break,
            Ok(n) => buf.extend_from_slice(&chunk[..n]),
            Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset && !buf.is_empty() => break,
            Err(e) => return Err(e),
        }
        if let Some(done) = complete_response(&buf) {
            buf.truncate(done);
            break;
        }
    }
    parse_response(&buf).ok_or_else(|| {
        std::io::Error::other(format!(
            "unparsable response: {:?}",
            String::from_utf8_lossy(&buf)
        ))
    })
}

/// Length of a complete response with a Content-Length, so keep-alive replies need no close.
fn complete_response(buf: &[u8]) -> Option<usize> {
    let mut headers = [httparse::EMPTY_HEADER; 64];
    let mut resp = httparse::Response::new(&mut headers);
    let httparse::Status::Complete(head) = resp.parse(buf).ok()? else {
        return None;
    };
    let len: usize = resp
        .headers
        .iter()
        .find(|h| h.name.eq_ignore_ascii_case("content-length"))
        .and_then(|h| std::str::from_utf8(h.value).ok()?.parse().ok())?;
    (buf.len() >= head + len).then_some(head + len)
}

/// Header names lowercased, values as text: how the test servers and clients record headers.
pub fn header_pairs(headers: &[httparse::Header]) -> Vec<(String, String)> {
    headers
        .iter()
        .map(|h| {
            (
                h.name.to_ascii_lowercase(),
                String::from_utf8_lossy(h.value).into_owned(),
            )
        })
        .collect()
}

fn parse_response(buf: &[u8]) -> Option<RawResponse> {
    let mut headers = [httparse::EMPTY_HEADER; 64];
    let mut resp = httparse::Response::new(&mut headers);
    let httparse::Status::Complete(head) = resp.parse(buf).ok()? else {
        return None;
    };
    let headers = header_pairs(resp.headers);
    Some((resp.code?, headers, buf[head..].to_vec()))
}

pub fn client() -> reqwest::Client {
    reqwest::Client::builder()
        .timeout(Duration::from_secs(30))
        .build()
        .unwrap()
}
