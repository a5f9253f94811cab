//! What the serving gateway process holds, read from /proc: resident memory, open file
//! descriptors and its TCP connections by kind; sampled every few seconds into a CSV, following
//! the process across upgrades.

use std::collections::HashSet;
use std::io::Write;
use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::{self, JoinHandle};
use std::time::{Duration, Instant};

use super::traffic::Clients;

#[derive(Clone, Copy, Debug, Default)]
pub struct Stats {
    pub rss_kb: u64,
    pub fds: usize,
    pub sockets: usize,
    /// Established connections on the gateway's own port: clients.
    pub tcp_in: usize,
    /// Established connections to elsewhere: replicas, Postgres, Redis, the IdP.
    pub tcp_out: usize,
    pub tcp_listen: usize,
    /// Every other state (CLOSE_WAIT, FIN_WAIT…): a leak of half-closed sockets shows here.
    pub tcp_other: usize,
}

/// `pid`'s figures now; `None` once it has exited.
pub fn read(pid: u32, port: u16) -> Option<Stats> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let rss_kb = status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())?;
    let mut fds = 0;
    let mut inodes = HashSet::new();
    for entry in std::fs::read_dir(format!("/proc/{pid}/fd")).ok()?.flatten() {
        fds += 1;
        let Ok(target) = std::fs::read_link(entry.path()) else {
            continue;
        };
        let target = target.to_string_lossy();
        if let Some(inode) = target
            .strip_prefix("socket:[")
            .and_then(|r| r.strip_suffix(']'))
        {
            inodes.insert(inode.to_string());
        }
    }
    let mut stats = Stats {
        rss_kb,
        fds,
        sockets: inodes.len(),
        ..Stats::default()
    };
    // The namespace's TCP table, kept to the sockets this process holds.
    for table in ["tcp", "tcp6"] {
        let text = std::fs::read_to_string(format!("/proc/{pid}/net/{table}")).unwrap_or_default();
        for line in text.lines().skip(1) {
            let f: Vec<&str> = line.split_whitespace().collect();
            if f.len() < 10 || !inodes.contains(f[9]) {
                continue;
            }
            let local_port = f[1]
                .rsplit(':')
                .next()
                .and_then(|p| u16::from_str_radix(p, 16).ok());
            match f[3] {
                "0A" => stats.tcp_listen += 1,
                "01" if local_port == Some(port) => stats.tcp_in += 1,
                "01" => stats.tcp_out += 1,
                _ => stats.tcp_other += 1,
            }
        }
    }
    Some(stats)
}

/// The fd count when nothing settles it further: the median of five reads 200 ms apart (a
/// request in flight holds two sockets for a moment).
pub fn steady_fds(pid: u32, port: u16) -> Option<usize> {
    let mut reads = Vec::new();
    for _ in 0..5 {
        reads.push(read(pid, port)?.fds);
        thread::sleep(Duration::from_millis(200));
    }
    reads.sort_unstable();
    Some(reads[2])
}

/// One CSV row.
#[derive(Clone, Debug)]
pub struct Row {
    pub t: Duration,
    pub pid: u32,
    pub stats: Stats,
}

/// Faults as they start, for the CSV's `event` column (`name@seconds`).
#[derive(Default)]
pub struct Events(Mutex<Vec<String>>);

impl Events {
    pub fn push(&self, name: &str, at: Duration) {
        let entry = format!("{name}@{:.1}", at.as_secs_f64());
        self.0.lock().unwrap().push(entry);
    }

    fn take(&self) -> String {
        std::mem::take(&mut *self.0.lock().unwrap()).join(" ")
    }
}

pub struct Sampler {
    stop: Arc<AtomicBool>,
    handle: JoinHandle<Vec<Row>>,
}

impl Sampler {
    /// Samples `pid` (whichever process serves now) every `every` into `csv` until `finish`.
    pub fn start(
        csv: &Path,
        pid: Arc<AtomicU32>,
        clients: Arc<Clients>,
        events: Arc<Events>,
        every: Duration,
    ) -> Sampler {
        let mut out = std::fs::File::create(csv)
            .unwrap_or_else(|e| panic!("cannot write {}: {e}", csv.display()));
        writeln!(
            out,
            "t_s,pid,rss_kb,fds,sockets,tcp_in,tcp_out,tcp_listen,tcp_other,requests,failed,event"
        )
        .unwrap();
        let stop = Arc::new(AtomicBool::new(false));
        let flag = stop.clone();
        let handle = thread::spawn(move || {
            let mut rows = Vec::new();
            let mut next = Instant::now();
            while !flag.load(Ordering::Relaxed) {
                let pid = pid.load(Ordering::Relaxed);
                let t = clients.now();
                if let Some(stats) = read(pid, clients.port) {
                    let (sent, failed) = {
                        let outcomes = clients.outcomes.lock().unwrap();
                        let failed = outcomes.iter().filter(|o| o.problem.is_some()).count();
                        (outcomes.len(), failed)
                    };
                    let s = stats;
                    // Written and flushed as it goes: a run that dies still leaves its figures.
                    let _ = writeln!(
                        out,
                        "{:.1},{pid},{},{},{},{},{},{},{},{sent},{failed},{}",
                        t.as_secs_f64(),
                        s.rss_kb,
                        s.fds,
                        s.sockets,
                        s.tcp_in,
                        s.tcp_out,
                        s.tcp_listen,
                        s.tcp_other,
                        events.take()
                    );
                    let _ = out.flush();
                    rows.push(Row { t, pid, stats });
                }
                next += every;
                while Instant::now() < next && !flag.load(Ordering::Relaxed) {
                    thread::sleep(Duration::from_millis(100));
                }
            }
            rows
        });
        Sampler { stop, handle }
    }

    pub fn finish(self) -> Vec<Row> {
        self.stop.store(true, Ordering::Relaxed);
        self.handle.join().expect("the sampler panicked")
    }
}
