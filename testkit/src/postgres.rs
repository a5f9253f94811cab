//! A real PostgreSQL server for the fleet tests: the one `PORTCULLIS_TEST_POSTGRES_URL` names,
//! or one started here from Debian's server binaries (`make test` installs them), in a
//! temporary directory, on a free loopback port, with password authentication.

use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// The password of the servers started here: tests check it never shows in a log.
pub const PASSWORD: &str = "pg-S3cret-do-not-log";

pub struct Postgres {
    pub url: String,
    local: Option<Local>,
}

struct Local {
    dir: tempfile::TempDir,
    bin: PathBuf,
    port: u16,
    child: Option<Child>,
    /// initdb and postgres refuse to run as root: as root they run as the `postgres` user
    /// (uid, gid), started directly so that signals reach the server itself.
    as_postgres: Option<(u32, u32)>,
}

/// The `postgres` system user the Debian package creates.
fn postgres_user() -> (u32, u32) {
    let name = std::ffi::CString::new("postgres").unwrap();
    let pw = unsafe { libc::getpwnam(name.as_ptr()) };
    assert!(
        !pw.is_null(),
        "no `postgres` user: is the postgresql package installed?"
    );
    unsafe { ((*pw).pw_uid, (*pw).pw_gid) }
}

impl Postgres {
    pub fn start() -> Postgres {
        if let Ok(url) = std::env::var("PORTCULLIS_TEST_POSTGRES_URL") {
            return Postgres { url, local: None };
        }
        let bin = std::fs::read_dir("/usr/lib/postgresql")
            .expect("PostgreSQL server binaries (Debian package postgresql): run `make test`")
            .filter_map(|e| Some(e.ok()?.path().join("bin")))
            .find(|p| p.join("initdb").exists())
            .expect("no /usr/lib/postgresql/*/bin/initdb");
        let dir = tempfile::tempdir().unwrap();
        let as_postgres = (unsafe { libc::geteuid() } == 0).then(postgres_user);
        std::fs::write(dir.path().join("pw"), PASSWORD).unwrap();
        if let Some((uid, gid)) = as_postgres {
            for path in [dir.path().to_path_buf(), dir.path().join("pw")] {
                std::os::unix::fs::chown(&path, Some(uid), Some(gid)).unwrap();
            }
        }
        let mut local = Local {
            dir,
            bin,
            port: crate::net::free_port(),
            child: None,
            as_postgres,
        };
        let data = local.dir.path().join("data");
        let pwfile = local.dir.path().join("pw");
        let out = local
            .command("initdb")
            .arg("-D")
            .arg(&data)
            .args([
                "-U",
                "portcullis",
                "--auth=scram-sha-256",
                "-E",
                "UTF8",
                "--no-sync",
            ])
            .arg(format!("--pwfile={}", pwfile.display()))
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "initdb failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        let url = format!(
            "postgres://portcullis:{PASSWORD}@127.0.0.1:{}/postgres",
            local.port
        );
        local.run();
        Postgres {
            url,
            local: Some(local),
        }
    }

    /// Whether this server can be stopped and started (not an external one).
    pub fn is_local(&self) -> bool {
        self.local.is_some()
    }

    /// A fast shutdown: every connection is cut, as when the server dies.
    pub fn stop(&mut self) {
        if let Some(local) = &mut self.local {
            local.stop();
        }
    }

    /// Starts it again on the same port and data.
    pub fn restart(&mut self) {
        if let Some(local) = &mut self.local {
            local.run();
        }
    }

    /// Runs one SQL statement with psql; its output, unaligned.
    pub fn sql(&self, statement: &str) -> String {
        let out = Command::new("psql")
            .arg(&self.url)
            .args(["-XAtc", statement])
            .output()
            .expect("psql (Debian package postgresql-client)");
        assert!(
            out.status.success(),
            "psql failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout).trim().to_string()
    }
}

impl Local {
    fn command(&self, program: &str) -> Command {
        use std::os::unix::process::CommandExt;
        let mut c = Command::new(self.bin.join(program));
        if let Some((uid, gid)) = self.as_postgres {
            c.uid(uid).gid(gid).env("HOME", self.dir.path());
        }
        c
    }

    fn run(&mut self) {
        let log = std::fs::File::create(self.dir.path().join("server.log")).unwrap();
        let child = self
            .command("postgres")
            .arg("-D")
            .arg(self.dir.path().join("data"))
            .args(["-p", &self.port.to_string(), "-k"])
            .arg(self.dir.path())
            .args(["-c", "listen_addresses=127.0.0.1", "-c", "fsync=off"])
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .unwrap();
        self.child = Some(child);
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            let ready = Command::new(self.bin.join("pg_isready"))
                .args(["-h", "127.0.0.1", "-p", &self.port.to_string(), "-q"])
                .status()
                .is_ok_and(|s| s.success());
            if ready {
                return;
            }
            assert!(
                Instant::now() < deadline,
                "postgres did not start: {}",
                std::fs::read_to_string(self.dir.path().join("server.log")).unwrap_or_default()
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    fn stop(&mut self) {
        if let Some(mut child) = self.child.take() {
            // SIGINT: postgres's fast shutdown; every connection is cut.
            unsafe { libc::kill(child.id() as i32, libc::SIGINT) };
            let _ = child.wait();
        }
    }
}

impl Drop for Local {
    fn drop(&mut self) {
        self.stop();
    }
}
