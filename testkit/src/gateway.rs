//! The real gateway binary as a child process on loopback: started from a typed config,
//! waited for, signalled, and driven through its real CLI (keys made as an operator would).

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use crate::config::{GatewayConfig, Service};
use crate::http::{client, raw, try_raw, RawResponse};
use crate::net::free_port;

/// The gateway binary: `$PORTCULLIS_BIN`, or `portcullis` in the cargo profile directory the
/// running test or bench was built into (its executable sits in `<profile>/deps/`).
pub fn gateway_bin() -> PathBuf {
    if let Some(bin) = std::env::var_os("PORTCULLIS_BIN") {
        return bin.into();
    }
    let exe = std::env::current_exe().expect("the test's own path");
    let profile = exe
        .parent()
        .and_then(Path::parent)
        .expect("target/<profile>/deps/<test>");
    profile.join("portcullis")
}

pub struct Gateway {
    pub port: u16,
    pub metrics_port: u16,
    pub dir: tempfile::TempDir,
    pub config: PathBuf,
    child: Child,
}

pub struct GatewayBuilder<'a> {
    config: GatewayConfig<'a>,
    env: Vec<(String, String)>,
    args: Vec<String>,
}

impl<'a> GatewayBuilder<'a> {
    pub fn service(mut self, s: Service<'a>) -> Self {
        self.config.services.push(s);
        self
    }

    /// Extra TOML appended after the generated sections; `{dir}` stands for the gateway's
    /// temporary directory.
    pub fn extra(mut self, toml: &str) -> Self {
        self.config.extra.push_str(toml);
        self
    }

    pub fn env(mut self, k: &str, v: &str) -> Self {
        self.env.push((k.into(), v.into()));
        self
    }

    pub fn cache_ttl(mut self, seconds: u64) -> Self {
        self.config.cache_ttl = Some(seconds);
        self
    }

    /// A key store shared with other gateways, e.g. a Postgres URL.
    pub fn key_store(mut self, database: &str) -> Self {
        self.config.key_store = Some(database.to_string());
        self
    }

    pub fn max_body(mut self, bytes: u64) -> Self {
        self.config.max_body = Some(bytes);
        self
    }

    /// Any `key = value` of `[server]`; `value` is TOML as written.
    pub fn server(mut self, key: &str, value: impl ToString) -> Self {
        self.config
            .server
            .push((key.to_string(), value.to_string()));
        self
    }

    /// `server.grace_period_seconds` (default 5).
    pub fn grace_period(mut self, seconds: u64) -> Self {
        self.config.grace_period = Some(seconds);
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
        let config = dir.path().join("portcullis.toml");
        std::fs::write(
            &config,
            self.config.render(dir.path(), port, Some(metrics_port)),
        )
        .unwrap();
        let log = std::fs::File::create(dir.path().join("gateway.log")).unwrap();
        let mut cmd = Command::new(gateway_bin());
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
            config: GatewayConfig::default(),
            env: Vec::new(),
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

    /// The metrics once they hold every one of `lines` (a request's are counted once its
    /// answer is sent, so just after it); panics naming the first missing after 10 s.
    pub fn metrics_with(&self, lines: &[&str]) -> String {
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            let metrics = self.metrics();
            let missing = lines.iter().find(|l| !metrics.contains(*l));
            match missing {
                None => return metrics,
                Some(line) if Instant::now() > deadline => {
                    panic!("{line} not in the metrics:\n{metrics}")
                }
                Some(_) => std::thread::sleep(Duration::from_millis(50)),
            }
        }
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
        let child = Command::new(gateway_bin())
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
        self.spawn_upgrade_logging_to(config, "new.log")
    }

    /// `spawn_upgrade` with the new process logging to `<dir>/<log_name>`: a run of many
    /// upgrades gives each generation its own file rather than truncating the serving one's.
    pub fn spawn_upgrade_logging_to(&self, config: &Path, log_name: &str) -> Proc {
        use std::os::unix::fs::FileTypeExt;
        let sock = self.dir.path().join("upgrade.sock");
        let _ = std::fs::remove_file(&sock);
        let mut new = self.spawn_serve(config, &["-u"], log_name);
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

/// Writes `toml` to `dir/c.toml` and runs `serve -t` on it: (succeeded, stderr).
pub fn check_config(dir: &Path, toml: &str) -> (bool, String) {
    let config = dir.join("c.toml");
    std::fs::write(&config, toml).unwrap();
    let out = Command::new(gateway_bin())
        .args(["serve", "-t", "--config"])
        .arg(&config)
        .output()
        .unwrap();
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// Runs the CLI with `--config` appended to the subcommand's arguments.
pub fn cli(config: &Path, args: &[&str]) -> std::process::Output {
    Command::new(gateway_bin())
        .args(args)
        .arg("--config")
        .arg(config)
        .stdin(Stdio::null())
        .output()
        .unwrap()
}
