//! The process log (env_logger, `RUST_LOG`), with every call site limited to a few lines a
//! second. An error that repeats in a tight loop (Pingora's accept loop retries every failed
//! accept at once) must not flood the disk: the excess is counted, and the next line let
//! through from that site says how many were held back.

use std::collections::hash_map::DefaultHasher;
use std::collections::HashMap;
use std::hash::{Hash, Hasher};
use std::sync::{Mutex, PoisonError};
use std::time::{Duration, Instant};

use log::{Log, Metadata, Record};

/// Lines a call site may write per window before the rest are counted instead.
const LINES_PER_WINDOW: u32 = 5;
const WINDOW: Duration = Duration::from_secs(1);
/// Sites remembered at most; past it the map starts afresh (sites are the binary's log calls).
const MAX_SITES: usize = 4096;

struct Site {
    window_start: Instant,
    written: u32,
    suppressed: u64,
}

pub(crate) struct RateLimited {
    inner: env_logger::Logger,
    sites: Mutex<HashMap<u64, Site>>,
}

/// What to do with one record.
enum Verdict {
    Write,
    /// Write it, saying how many lines of this site were held back before it.
    WriteAfter(u64),
    Suppress,
}

impl RateLimited {
    pub(crate) fn new(inner: env_logger::Logger) -> RateLimited {
        RateLimited {
            inner,
            sites: Mutex::new(HashMap::new()),
        }
    }

    fn verdict(&self, record: &Record, now: Instant) -> Verdict {
        let mut hasher = DefaultHasher::new();
        (record.target(), record.file(), record.line()).hash(&mut hasher);
        let key = hasher.finish();
        let mut sites = self.sites.lock().unwrap_or_else(PoisonError::into_inner);
        if sites.len() >= MAX_SITES && !sites.contains_key(&key) {
            sites.clear();
        }
        let site = sites.entry(key).or_insert(Site {
            window_start: now,
            written: 0,
            suppressed: 0,
        });
        let mut held_back = 0;
        if now.duration_since(site.window_start) >= WINDOW {
            held_back = std::mem::take(&mut site.suppressed);
            site.window_start = now;
            site.written = 0;
        }
        if site.written >= LINES_PER_WINDOW {
            site.suppressed += 1;
            return Verdict::Suppress;
        }
        site.written += 1;
        match held_back {
            0 => Verdict::Write,
            n => Verdict::WriteAfter(n),
        }
    }
}

impl Log for RateLimited {
    fn enabled(&self, metadata: &Metadata) -> bool {
        self.inner.enabled(metadata)
    }

    fn log(&self, record: &Record) {
        if !self.inner.matches(record) {
            return;
        }
        match self.verdict(record, Instant::now()) {
            Verdict::Write => self.inner.log(record),
            Verdict::Suppress => {}
            Verdict::WriteAfter(n) => self.inner.log(
                &Record::builder()
                    .args(format_args!(
                        "{} [{n} more line(s) like this held back]",
                        record.args()
                    ))
                    .level(record.level())
                    .target(record.target())
                    .module_path(record.module_path())
                    .file(record.file())
                    .line(record.line())
                    .build(),
            ),
        }
    }

    fn flush(&self) {
        self.inner.flush()
    }
}

/// Installs the logger: `RUST_LOG` as env_logger reads it, `info` by default.
pub fn init() {
    let inner =
        env_logger::Builder::from_env(env_logger::Env::default().default_filter_or("info")).build();
    let max = inner.filter();
    if log::set_boxed_logger(Box::new(RateLimited::new(inner))).is_ok() {
        log::set_max_level(max);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn record_at(line: u32) -> Record<'static> {
        Record::builder()
            .args(format_args!("x"))
            .level(log::Level::Error)
            .target("t")
            .line(Some(line))
            .build()
    }

    #[test]
    fn a_flood_from_one_site_is_cut_to_a_few_lines_a_second_and_counted() {
        let logger = RateLimited::new(env_logger::Builder::new().build());
        let t0 = Instant::now();
        let mut written = 0;
        for _ in 0..16_000 {
            if !matches!(logger.verdict(&record_at(1), t0), Verdict::Suppress) {
                written += 1;
            }
        }
        assert_eq!(written, LINES_PER_WINDOW);
        // Another call site is not held back by the first one's flood.
        assert!(matches!(logger.verdict(&record_at(2), t0), Verdict::Write));
        // The next window starts with a line that tells how many were held back.
        let later = t0 + WINDOW;
        match logger.verdict(&record_at(1), later) {
            Verdict::WriteAfter(n) => assert_eq!(n, 16_000 - u64::from(LINES_PER_WINDOW)),
            _ => panic!("the held-back count was not reported"),
        }
        assert!(matches!(
            logger.verdict(&record_at(1), later),
            Verdict::Write
        ));
    }
}
