//! The writer: each worker thread appends its lines to a buffer of its own, and a dedicated
//! thread takes the buffers in turn and writes them, so a slow disk or a blocked stdout never
//! stalls a request and no request takes a lock or writes an atomic another worker thread
//! takes too (issue 33). When a thread already has `buffer_lines` lines waiting, its new ones
//! are dropped (and counted). A file destination is reopened on SIGHUP (for logrotate) and can
//! rotate itself by size.
//!
//! How a line reaches the file: the request formats it straight into its thread's buffer
//! (`Shard`, a mutex only the writer ever contends, when it takes the buffer), noting when
//! (a monotonic stamp) and where the line ends. The writer takes every buffer each `SWEEP`, at
//! once when a buffer passes `BATCH_BYTES` or a line is logged with `log_promptly`, and when
//! asked by `flush`; an idle writer sleeps until the next line. It takes them all under all
//! their locks at once, so what it takes is every line appended before some instant and none
//! after, and writes them merged by stamp: the file has the lines in the order they were
//! logged, as when they went one by one through a channel (a thread's lines, and so a
//! connection's, in their order; the newest in the newest file when it rotates).

use std::fs::{File, OpenOptions};
use std::io::{self, BufWriter, Write};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, OnceLock};
use std::thread::Thread;
use std::time::{Duration, Instant};

use async_trait::async_trait;
use pingora::server::ShutdownWatch;
use pingora::services::background::BackgroundService;

use super::Record;
use crate::config::{AccessLogDestination, AccessLogSettings};
use crate::observe::thread_shards::{self, Padded};

/// How often the writer takes the buffers while lines come.
const SWEEP: Duration = Duration::from_millis(50);
/// A buffer this full wakes the writer before its `SWEEP`: writes stay large and a busy
/// thread's buffer small.
const BATCH_BYTES: usize = 64 * 1024;
/// Sweeps that found nothing before the writer sleeps until woken by a line.
const IDLE_SWEEPS: u32 = 2;

/// One worker thread's lines (threads beyond `thread_shards::SHARDS` share one), kept on a
/// cache line of its own (`Padded`).
#[derive(Default)]
struct Shard {
    pending: Mutex<Pending>,
}

#[derive(Default)]
struct Pending {
    lines: Lines,
    /// The writer was woken for this batch already.
    woke: bool,
}

/// Whole lines, each ending in a newline, and for each its stamp and where it ends.
#[derive(Default)]
struct Lines {
    buf: Vec<u8>,
    ends: Vec<(u64, usize)>,
}

impl Shard {
    fn lock(&self) -> MutexGuard<'_, Pending> {
        self.pending.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// What the request path and the writer share.
struct Shared {
    shards: Box<[Padded<Shard>]>,
    /// `buffer_lines`: the most lines one thread's buffer holds.
    bound: usize,
    /// What the lines' stamps count from.
    epoch: Instant,
    /// The writer thread, once started.
    writer: OnceLock<Thread>,
    /// Set (by SIGHUP) to have the writer reopen its file.
    reopen: AtomicBool,
    /// Set while the writer sleeps until a line wakes it.
    dozing: AtomicBool,
    /// Flushes asked for, and (under the mutex) the count the writer has answered.
    asked: AtomicU64,
    answered: Mutex<u64>,
    swept: Condvar,
}

impl Shared {
    fn wake(&self) {
        if let Some(writer) = self.writer.get() {
            writer.unpark();
        }
    }
}

/// The request path's handle: cheap to clone, never blocks on the writer.
#[derive(Clone)]
pub(crate) struct AccessLog {
    shared: Option<Arc<Shared>>,
}

impl AccessLog {
    pub(crate) fn off() -> AccessLog {
        AccessLog { shared: None }
    }

    pub(crate) fn enabled(&self) -> bool {
        self.shared.is_some()
    }

    /// Queues the record's line in this thread's buffer; false if it had to be dropped (the
    /// thread has `buffer_lines` lines waiting).
    pub(crate) fn log(&self, record: &Record<'_>) -> bool {
        self.append(false, |buf| record.write_line(buf))
    }

    /// `log`, and the writer woken to write it now: for the rare lines someone may look for
    /// at once (the key API's).
    pub(crate) fn log_promptly(&self, record: &Record<'_>) -> bool {
        self.append(true, |buf| record.write_line(buf))
    }

    fn append(&self, promptly: bool, write: impl FnOnce(&mut Vec<u8>)) -> bool {
        let Some(shared) = &self.shared else {
            return true;
        };
        let shard = &shared.shards[thread_shards::shard()];
        let mut guard = shard.lock();
        let pending = &mut *guard;
        let lines = &mut pending.lines;
        if lines.ends.len() >= shared.bound {
            return false;
        }
        write(&mut lines.buf);
        // Taken under the lock, so the writer's taking of every buffer at once falls between
        // two stamps (see `Writer::run`).
        let stamp = shared.epoch.elapsed().as_nanos() as u64;
        lines.ends.push((stamp, lines.buf.len()));
        let full = lines.buf.len() >= BATCH_BYTES && !pending.woke;
        pending.woke |= full;
        drop(guard);
        // Read after the line is in: a writer that went to sleep before finding it set the
        // flag before it looked (see `Writer::run`).
        if full || promptly || shared.dozing.load(Ordering::SeqCst) {
            shared.wake();
        }
        true
    }

    /// Waits, at most `within`, until every line queued so far is written. For the exit path.
    pub(crate) fn flush(&self, within: Duration) {
        let Some(shared) = &self.shared else { return };
        let deadline = Instant::now() + within;
        let ticket = shared.asked.fetch_add(1, Ordering::SeqCst) + 1;
        shared.wake();
        let mut answered = shared.answered.lock().unwrap_or_else(|e| e.into_inner());
        while *answered < ticket {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return;
            }
            answered = match shared.swept.wait_timeout(answered, left) {
                Ok((guard, _)) => guard,
                Err(e) => e.into_inner().0,
            };
        }
    }

    fn reopen(&self) {
        if let Some(shared) = &self.shared {
            shared.reopen.store(true, Ordering::SeqCst);
            shared.wake();
        }
    }
}

/// Opens the destination now, so a bad path fails at start-up; the writer thread starts with
/// the returned service.
pub(crate) fn open(settings: &AccessLogSettings) -> io::Result<(AccessLog, AccessLogService)> {
    let sink = match &settings.destination {
        AccessLogDestination::Off => None,
        AccessLogDestination::Stdout => Some(Sink::Stdout(BufWriter::new(io::stdout()))),
        AccessLogDestination::File {
            path,
            max_bytes,
            max_files,
        } => Some(Sink::File(FileSink::open(
            path.clone(),
            *max_bytes,
            *max_files,
        )?)),
    };
    let (log, writer) = match sink {
        None => (AccessLog::off(), None),
        Some(sink) => {
            let shared = Arc::new(Shared {
                shards: (0..thread_shards::SHARDS)
                    .map(|_| Padded::default())
                    .collect(),
                bound: settings.buffer_lines,
                epoch: Instant::now(),
                writer: OnceLock::new(),
                reopen: AtomicBool::new(false),
                dozing: AtomicBool::new(false),
                asked: AtomicU64::new(0),
                answered: Mutex::new(0),
                swept: Condvar::new(),
            });
            let writer = Writer {
                shared: shared.clone(),
                out: Out {
                    sink,
                    failing: false,
                },
            };
            (
                AccessLog {
                    shared: Some(shared),
                },
                Some(writer),
            )
        }
    };
    let service = AccessLogService {
        writer: Mutex::new(writer),
        log: log.clone(),
    };
    Ok((log, service))
}

/// Starts the writer thread and reopens the file on SIGHUP.
pub(crate) struct AccessLogService {
    writer: Mutex<Option<Writer>>,
    log: AccessLog,
}

impl AccessLogService {
    /// Starts the writer thread, once; false if it cannot.
    fn start_writer(&self) -> bool {
        let writer = self.writer.lock().ok().and_then(|mut w| w.take());
        let Some(writer) = writer else { return true };
        match std::thread::Builder::new()
            .name("access-log".into())
            .spawn(move || writer.run())
        {
            Ok(_) => true,
            Err(e) => {
                log::error!("cannot start the access-log writer: {e}");
                false
            }
        }
    }
}

#[async_trait]
impl BackgroundService for AccessLogService {
    async fn start(&self, _shutdown: ShutdownWatch) {
        // Spawned here, after Pingora has daemonised: a thread from before the fork would not
        // exist in the daemon. Lines logged until then wait in their threads' buffers.
        self.start_writer();
        // Handled even without a file: SIGHUP's default action would kill the gateway.
        let mut hangup = match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::hangup())
        {
            Ok(s) => s,
            Err(e) => {
                log::error!("cannot handle SIGHUP: {e}");
                return;
            }
        };
        while hangup.recv().await.is_some() {
            log::info!("SIGHUP: reopening the access log");
            self.log.reopen();
        }
    }
}

struct Writer {
    shared: Arc<Shared>,
    out: Out,
}

/// The sink, and whether it is failing.
struct Out {
    sink: Sink,
    /// Set while writes fail, so the error is logged once, not per line.
    failing: bool,
}

impl Writer {
    fn run(self) {
        let Writer { shared, mut out } = self;
        // Set before the writer can doze: a thread that sees it dozing finds it to wake.
        let _ = shared.writer.set(std::thread::current());
        // The buffers handed to the shards in exchange for their lines: two per shard in all,
        // reused, so a steady load allocates nothing.
        let mut taken: Vec<Lines> = shared.shards.iter().map(|_| Lines::default()).collect();
        let mut idle = 0;
        loop {
            let asked = shared.asked.load(Ordering::SeqCst);
            if shared.reopen.swap(false, Ordering::SeqCst) {
                let result = out.sink.reopen();
                out.note(result);
            }
            {
                // Every lock held at once (each for a moment: two swaps a shard): a line
                // stamped before this instant is taken, one after waits for the next sweep.
                let mut all: Vec<_> = shared.shards.iter().map(|s| s.lock()).collect();
                for (pending, mine) in all.iter_mut().zip(taken.iter_mut()) {
                    if !pending.lines.ends.is_empty() {
                        std::mem::swap(&mut pending.lines, mine);
                        pending.woke = false;
                    }
                }
            }
            let lines: usize = taken.iter().map(|t| t.ends.len()).sum();
            out.write_merged(&mut taken);
            if lines > 0 {
                let result = out.sink.flush();
                out.note(result);
            }
            {
                let mut answered = shared.answered.lock().unwrap_or_else(|e| e.into_inner());
                if *answered < asked {
                    *answered = asked;
                    shared.swept.notify_all();
                }
            }
            // Every handle gone but this (a test's log dropped): nothing more can come.
            if Arc::strong_count(&shared) == 1 {
                return;
            }
            if lines > 0 || shared.asked.load(Ordering::SeqCst) != asked {
                idle = 0;
            } else {
                idle += 1;
            }
            if shared.dozing.load(Ordering::SeqCst) {
                // The flag was set before the sweep just made, which found nothing: a line
                // appended since sees it and wakes this thread (a wake-up before `park` is
                // kept for it).
                if idle > 0 {
                    std::thread::park();
                }
                shared.dozing.store(false, Ordering::SeqCst);
                idle = 0;
            } else if idle >= IDLE_SWEEPS {
                // Sweep once more with the flag set before sleeping on it.
                shared.dozing.store(true, Ordering::SeqCst);
            } else {
                std::thread::park_timeout(SWEEP);
            }
        }
    }
}

impl Out {
    /// The lines of every shard in the order of their stamps (a shard's are in order
    /// already): runs of one shard's lines at a time, all of them at once when only one
    /// shard has any. Leaves the buffers empty.
    fn write_merged(&mut self, taken: &mut [Lines]) {
        let mut next = vec![0; taken.len()];
        loop {
            // The shard whose next line is the oldest, and the oldest stamp of the others.
            let mut first: Option<(usize, u64)> = None;
            let mut others = u64::MAX;
            for (i, lines) in taken.iter().enumerate() {
                let Some(&(stamp, _)) = lines.ends.get(next[i]) else {
                    continue;
                };
                match first {
                    Some((_, oldest)) if oldest <= stamp => others = others.min(stamp),
                    _ => {
                        if let Some((_, oldest)) = first {
                            others = others.min(oldest);
                        }
                        first = Some((i, stamp));
                    }
                }
            }
            let Some((i, _)) = first else { break };
            let lines = &taken[i];
            let from = next[i];
            let to = from + lines.ends[from..].partition_point(|&(stamp, _)| stamp <= others);
            let start = if from == 0 { 0 } else { lines.ends[from - 1].1 };
            let result = self
                .sink
                .write_batch(&lines.buf[start..lines.ends[to - 1].1]);
            self.note(result);
            next[i] = to;
        }
        for lines in taken {
            lines.buf.clear();
            lines.ends.clear();
        }
    }

    fn note(&mut self, result: io::Result<()>) {
        match result {
            Err(e) if !self.failing => {
                log::error!("access log: {e}; lines are being lost");
                self.failing = true;
            }
            Err(_) => {}
            Ok(()) if self.failing => {
                log::info!("access log: writing again");
                self.failing = false;
            }
            Ok(()) => {}
        }
    }
}

enum Sink {
    Stdout(BufWriter<io::Stdout>),
    File(FileSink),
}

impl Sink {
    /// Whole lines, each ending in a newline.
    fn write_batch(&mut self, lines: &[u8]) -> io::Result<()> {
        match self {
            Sink::Stdout(out) => out.write_all(lines),
            Sink::File(file) => file.write_batch(lines),
        }
    }

    fn flush(&mut self) -> io::Result<()> {
        match self {
            Sink::Stdout(out) => out.flush(),
            Sink::File(file) => file.out.flush(),
        }
    }

    fn reopen(&mut self) -> io::Result<()> {
        match self {
            Sink::Stdout(_) => Ok(()),
            Sink::File(file) => file.reopen(),
        }
    }
}

struct FileSink {
    path: PathBuf,
    out: BufWriter<File>,
    size: u64,
    max_bytes: Option<u64>,
    max_files: usize,
    /// After a failed rotation: no new attempt before this, and lines go on to the open file.
    retry_rotation_at: Option<Instant>,
}

/// How long a failed rotation waits before it is tried again.
const ROTATION_RETRY: Duration = Duration::from_secs(30);

impl FileSink {
    fn open(path: PathBuf, max_bytes: Option<u64>, max_files: usize) -> io::Result<FileSink> {
        let (file, size) = open_append(&path)?;
        Ok(FileSink {
            path,
            out: BufWriter::with_capacity(64 * 1024, file),
            size,
            max_bytes,
            max_files,
            retry_rotation_at: None,
        })
    }

    /// Whole lines, each ending in a newline: at once without `max_bytes`, else line by line,
    /// so a rotation falls between two lines.
    fn write_batch(&mut self, lines: &[u8]) -> io::Result<()> {
        if self.max_bytes.is_none() {
            // BufWriter passes whole lines on: what it holds, then the batch (or both in one).
            self.out.write_all(lines)?;
            self.size += lines.len() as u64;
            return Ok(());
        }
        for line in lines.split_inclusive(|&b| b == b'\n') {
            self.write_line(line)?;
        }
        Ok(())
    }

    fn write_line(&mut self, line: &[u8]) -> io::Result<()> {
        let len = line.len() as u64;
        let due = self
            .max_bytes
            .is_some_and(|max| self.size > 0 && self.size + len > max)
            && self.retry_rotation_at.is_none_or(|at| Instant::now() >= at);
        if due {
            // A failed rotation loses no line: the line goes to the file still open, the
            // failure is reported once, and rotation is tried again later.
            match self.rotate() {
                Ok(()) => {
                    if self.retry_rotation_at.take().is_some() {
                        log::info!("access log: rotating again");
                    }
                }
                Err(e) => {
                    if self.retry_rotation_at.is_none() {
                        log::warn!(
                            "access log: cannot rotate {}: {e}; writing on to the current file, retrying every {}s",
                            self.path.display(),
                            ROTATION_RETRY.as_secs()
                        );
                    }
                    self.retry_rotation_at = Some(Instant::now() + ROTATION_RETRY);
                }
            }
        }
        // One write_all per line: BufWriter never splits a line across two writes, and
        // O_APPEND keeps lines whole when an upgrade's old and new process share the file.
        self.out.write_all(line)?;
        self.size += len;
        Ok(())
    }

    /// `<path>.N-1` → `<path>.N`, …, `<path>` → `<path>.1`, then a fresh `<path>`.
    fn rotate(&mut self) -> io::Result<()> {
        self.out.flush()?;
        let numbered = |n: usize| {
            let mut p = self.path.clone().into_os_string();
            p.push(format!(".{n}"));
            PathBuf::from(p)
        };
        for n in (1..self.max_files).rev() {
            let from = numbered(n);
            if from.exists() {
                std::fs::rename(&from, numbered(n + 1))?;
            }
        }
        match std::fs::rename(&self.path, numbered(1)) {
            // Someone else moved or deleted the file: start a fresh one all the same.
            Err(e) if e.kind() != io::ErrorKind::NotFound => return Err(e),
            _ => {}
        }
        self.reopen()
    }

    fn reopen(&mut self) -> io::Result<()> {
        self.out.flush()?;
        let (file, size) = open_append(&self.path)?;
        self.out = BufWriter::with_capacity(64 * 1024, file);
        self.size = size;
        Ok(())
    }
}

fn open_append(path: &Path) -> io::Result<(File, u64)> {
    let file = OpenOptions::new().create(true).append(true).open(path)?;
    let size = file.metadata()?.len();
    Ok((file, size))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A log to `dir/access.log` holding `bound` lines per thread, its writer not started.
    fn file_log(dir: &Path, bound: usize) -> (AccessLog, AccessLogService, PathBuf) {
        let path = dir.join("access.log");
        let settings = AccessLogSettings {
            destination: AccessLogDestination::File {
                path: path.clone(),
                max_bytes: None,
                max_files: 1,
            },
            buffer_lines: bound,
        };
        let (log, service) = open(&settings).unwrap();
        (log, service, path)
    }

    fn line(log: &AccessLog, text: &str) -> bool {
        log.append(false, |buf| {
            buf.extend_from_slice(text.as_bytes());
            buf.push(b'\n');
        })
    }

    fn read(path: &Path) -> String {
        std::fs::read_to_string(path).unwrap_or_default()
    }

    /// Polls until `path` holds `want` lines; how long that took.
    fn wait_lines(path: &Path, want: usize, within: Duration) -> Duration {
        let start = Instant::now();
        while read(path).lines().count() < want {
            assert!(start.elapsed() < within, "{want} lines: {}", read(path));
            std::thread::sleep(Duration::from_millis(2));
        }
        start.elapsed()
    }

    #[test]
    fn a_full_buffer_drops_instead_of_blocking_and_takes_lines_again_once_written() {
        let dir = tempfile::tempdir().unwrap();
        // The writer is not started yet, so nothing takes the buffer.
        let (log, service, path) = file_log(dir.path(), 2);
        assert!(line(&log, "1"));
        assert!(line(&log, "2"));
        assert!(!line(&log, "3"), "a third line in a buffer of two");
        assert!(!line(&log, "4"));
        // Without a writer, flush gives up after its time.
        let start = Instant::now();
        log.flush(Duration::from_millis(50));
        assert!(start.elapsed() >= Duration::from_millis(50));
        assert!(service.start_writer());
        log.flush(Duration::from_secs(10));
        assert_eq!(read(&path), "1\n2\n");
        assert!(line(&log, "5"), "written lines leave the buffer");
        log.flush(Duration::from_secs(10));
        assert_eq!(read(&path), "1\n2\n5\n");
    }

    #[test]
    fn flush_writes_everything_queued() {
        let dir = tempfile::tempdir().unwrap();
        let (log, service, path) = file_log(dir.path(), 100_000);
        assert!(service.start_writer());
        let want: Vec<String> = (0..20_000).map(|i| format!("line {i}")).collect();
        for l in &want {
            assert!(line(&log, l));
        }
        log.flush(Duration::from_secs(10));
        // Read at once, no polling: flush returned only once all was written.
        assert_eq!(
            read(&path),
            want.iter().map(|l| format!("{l}\n")).collect::<String>()
        );
    }

    #[test]
    fn each_threads_lines_stay_in_order_and_none_is_lost() {
        let dir = tempfile::tempdir().unwrap();
        let (log, service, path) = file_log(dir.path(), 1 << 20);
        assert!(service.start_writer());
        let threads: Vec<_> = (0..6)
            .map(|t| {
                let log = log.clone();
                std::thread::spawn(move || {
                    // Long lines, so buffers pass `BATCH_BYTES` and wake the writer too.
                    let pad = "x".repeat(100);
                    for n in 0..5_000 {
                        assert!(line(&log, &format!("{t} {n} {pad}")));
                        if n % 1000 == 0 {
                            std::thread::sleep(Duration::from_millis(3));
                        }
                    }
                })
            })
            .collect();
        for t in threads {
            t.join().unwrap();
        }
        log.flush(Duration::from_secs(10));
        let mut next = [0; 6];
        for l in read(&path).lines() {
            let mut words = l.split(' ');
            let t: usize = words.next().unwrap().parse().unwrap();
            let n: usize = words.next().unwrap().parse().unwrap();
            assert_eq!(n, next[t], "thread {t}'s lines out of order");
            next[t] += 1;
        }
        assert_eq!(next, [5_000; 6], "lines lost");
    }

    #[test]
    fn an_idle_threads_lines_reach_the_file_without_a_flush() {
        let dir = tempfile::tempdir().unwrap();
        let (log, service, path) = file_log(dir.path(), 100);
        assert!(service.start_writer());
        // A sleeping writer is woken by the line.
        assert!(line(&log, "first"));
        wait_lines(&path, 1, Duration::from_secs(5));
        // A writer that has just written, so not asleep: the next sweep takes the line.
        assert!(line(&log, "second"));
        let took = wait_lines(&path, 2, Duration::from_secs(5));
        assert!(took < SWEEP * 10, "{took:?}");
        // Long after, when the writer sleeps until woken, a line from another thread that
        // then stays idle.
        std::thread::sleep(SWEEP * (IDLE_SWEEPS + 2));
        let other = log.clone();
        let (done, wait) = std::sync::mpsc::channel::<()>();
        let idle = std::thread::spawn(move || {
            assert!(line(&other, "third"));
            let _ = wait.recv();
        });
        wait_lines(&path, 3, Duration::from_secs(5));
        drop(done);
        idle.join().unwrap();
        assert_eq!(read(&path), "first\nsecond\nthird\n");
    }

    #[test]
    fn lines_logged_as_the_writer_falls_asleep_are_not_left_behind() {
        let dir = tempfile::tempdir().unwrap();
        let (log, service, path) = file_log(dir.path(), 100);
        assert!(service.start_writer());
        for i in 0..25 {
            let other = log.clone();
            let t = std::thread::spawn(move || assert!(line(&other, &format!("x{i}"))));
            t.join().unwrap();
            wait_lines(&path, i + 1, Duration::from_secs(5));
            // Pauses around the writer's `IDLE_SWEEPS` before it sleeps.
            std::thread::sleep(Duration::from_millis((i as u64 * 37) % 160));
        }
    }

    #[test]
    fn lines_of_several_threads_are_written_in_the_order_they_were_logged() {
        let dir = tempfile::tempdir().unwrap();
        // Not started yet: the lines wait, each in its thread's buffer, then go in one sweep.
        let (log, service, path) = file_log(dir.path(), 100);
        let (to_a, for_a) = std::sync::mpsc::channel::<String>();
        let (done_tx, done) = std::sync::mpsc::channel::<()>();
        let a_log = log.clone();
        let a = std::thread::spawn(move || {
            for text in for_a {
                assert!(line(&a_log, &text));
                done_tx.send(()).unwrap();
            }
        });
        for n in 0..6 {
            if n % 3 == 0 {
                assert!(line(&log, &format!("{n}")));
            } else {
                to_a.send(format!("{n}")).unwrap();
                done.recv().unwrap();
            }
        }
        drop(to_a);
        a.join().unwrap();
        assert!(service.start_writer());
        log.flush(Duration::from_secs(10));
        assert_eq!(read(&path), "0\n1\n2\n3\n4\n5\n");
    }

    #[test]
    fn the_file_is_reopened_when_asked() {
        let dir = tempfile::tempdir().unwrap();
        let (log, service, path) = file_log(dir.path(), 100);
        assert!(service.start_writer());
        assert!(line(&log, "before"));
        log.flush(Duration::from_secs(10));
        let moved = dir.path().join("access.log.moved");
        std::fs::rename(&path, &moved).unwrap();
        assert!(line(&log, "moved"));
        log.flush(Duration::from_secs(10));
        // The flush after it answers only once the writer has seen the flag.
        log.reopen();
        log.flush(Duration::from_secs(10));
        assert!(line(&log, "after"));
        log.flush(Duration::from_secs(10));
        assert_eq!(read(&moved), "before\nmoved\n");
        assert_eq!(read(&path), "after\n");
    }

    #[test]
    fn a_batch_rotates_between_its_lines() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("access.log");
        let mut sink = FileSink::open(path.clone(), Some(10), 2).unwrap();
        sink.write_batch(b"aaaaaaa\nbbbbbbb\nccccccc\n").unwrap();
        sink.write_batch(b"ddddddd\n").unwrap();
        sink.out.flush().unwrap();
        let read =
            |suffix: &str| std::fs::read_to_string(format!("{}{suffix}", path.display())).unwrap();
        assert_eq!(read(""), "ddddddd\n");
        assert_eq!(read(".1"), "ccccccc\n");
        assert_eq!(read(".2"), "bbbbbbb\n");
    }

    #[test]
    fn files_rotate_by_size_and_keep_max_files() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("access.log");
        let mut sink = FileSink::open(path.clone(), Some(10), 2).unwrap();
        for line in ["aaaaaaa\n", "bbbbbbb\n", "ccccccc\n", "ddddddd\n"] {
            sink.write_line(line.as_bytes()).unwrap();
        }
        sink.out.flush().unwrap();
        let read =
            |suffix: &str| std::fs::read_to_string(format!("{}{suffix}", path.display())).unwrap();
        assert_eq!(read(""), "ddddddd\n");
        assert_eq!(read(".1"), "ccccccc\n");
        assert_eq!(read(".2"), "bbbbbbb\n");
        assert!(!dir.path().join("access.log.3").exists());
    }

    #[test]
    fn a_failed_rotation_loses_no_line_and_is_retried_later() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("access.log");
        // A non-empty directory where `<path>.1` must go: every rename onto it fails.
        let blocker = dir.path().join("access.log.1");
        std::fs::create_dir(&blocker).unwrap();
        std::fs::write(blocker.join("x"), "x").unwrap();
        let mut sink = FileSink::open(path.clone(), Some(10), 1).unwrap();
        let lines: Vec<String> = (0..20).map(|i| format!("line-{i:03}\n")).collect();
        for line in &lines {
            sink.write_line(line.as_bytes()).unwrap();
        }
        sink.out.flush().unwrap();
        assert_eq!(std::fs::read_to_string(&path).unwrap(), lines.concat());
        assert!(sink.retry_rotation_at.is_some());

        // Once the obstacle is gone and the retry is due, rotation works again.
        std::fs::remove_dir_all(&blocker).unwrap();
        sink.retry_rotation_at = Some(Instant::now());
        sink.write_line(b"after\n").unwrap();
        sink.out.flush().unwrap();
        assert_eq!(std::fs::read_to_string(&path).unwrap(), "after\n");
        assert_eq!(std::fs::read_to_string(&blocker).unwrap(), lines.concat());
        assert!(sink.retry_rotation_at.is_none());
    }

    #[test]
    fn a_deleted_file_is_recreated_at_rotation() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("access.log");
        let mut sink = FileSink::open(path.clone(), Some(10), 2).unwrap();
        sink.write_line(b"aaaaaaa\n").unwrap();
        sink.out.flush().unwrap();
        std::fs::remove_file(&path).unwrap();
        sink.write_line(b"bbbbbbb\n").unwrap();
        sink.out.flush().unwrap();
        assert_eq!(std::fs::read_to_string(&path).unwrap(), "bbbbbbb\n");
        assert!(sink.retry_rotation_at.is_none());
    }
}
