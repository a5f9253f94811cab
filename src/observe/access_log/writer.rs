//! The writer: lines handed over a bounded channel to a dedicated thread, so a slow disk or a
//! blocked stdout never stalls a request; when the channel is full the line is dropped (and
//! counted). A file destination is reopened on SIGHUP (for logrotate) and can rotate itself by
//! size.

use std::fs::{File, OpenOptions};
use std::io::{self, BufWriter, Write};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{self, Receiver, SyncSender, TrySendError};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use async_trait::async_trait;
use pingora::server::ShutdownWatch;
use pingora::services::background::BackgroundService;

use crate::config::{AccessLogDestination, AccessLogSettings};

enum Msg {
    Line(Vec<u8>),
    /// Look at the reopen flag (set by SIGHUP).
    Wake,
    /// Acknowledge once everything queued before it is written and flushed.
    Flush(mpsc::Sender<()>),
}

/// The request path's handle: cheap to clone, never blocks.
#[derive(Clone)]
pub(crate) struct AccessLog {
    tx: Option<SyncSender<Msg>>,
}

impl AccessLog {
    pub(crate) fn off() -> AccessLog {
        AccessLog { tx: None }
    }

    pub(crate) fn enabled(&self) -> bool {
        self.tx.is_some()
    }

    /// Queues a line; false if it had to be dropped (queue full or writer gone).
    pub(crate) fn send(&self, line: Vec<u8>) -> bool {
        match &self.tx {
            Some(tx) => tx.try_send(Msg::Line(line)).is_ok(),
            None => true,
        }
    }

    /// Waits, at most `within`, until every line queued so far is written. For the exit path.
    pub(crate) fn flush(&self, within: Duration) {
        let Some(tx) = &self.tx else { return };
        let deadline = Instant::now() + within;
        let (ack_tx, ack_rx) = mpsc::channel();
        let mut msg = Msg::Flush(ack_tx);
        loop {
            match tx.try_send(msg) {
                Ok(()) => break,
                Err(TrySendError::Full(m)) if Instant::now() < deadline => {
                    msg = m;
                    std::thread::sleep(Duration::from_millis(10));
                }
                Err(_) => return,
            }
        }
        let _ = ack_rx.recv_timeout(deadline.saturating_duration_since(Instant::now()));
    }

    fn wake(&self) {
        if let Some(tx) = &self.tx {
            // A full queue means the writer is busy and will see the flag anyway.
            let _ = tx.try_send(Msg::Wake);
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
    let reopen = Arc::new(AtomicBool::new(false));
    let (log, writer) = match sink {
        None => (AccessLog::off(), None),
        Some(sink) => {
            let (tx, rx) = mpsc::sync_channel(settings.buffer_lines);
            let writer = Writer {
                rx,
                sink,
                reopen: reopen.clone(),
                failing: false,
            };
            (AccessLog { tx: Some(tx) }, Some(writer))
        }
    };
    let service = AccessLogService {
        writer: Mutex::new(writer),
        reopen,
        log: log.clone(),
    };
    Ok((log, service))
}

/// Starts the writer thread and reopens the file on SIGHUP.
pub(crate) struct AccessLogService {
    writer: Mutex<Option<Writer>>,
    reopen: Arc<AtomicBool>,
    log: AccessLog,
}

#[async_trait]
impl BackgroundService for AccessLogService {
    async fn start(&self, _shutdown: ShutdownWatch) {
        // Spawned here, after Pingora has daemonised: a thread from before the fork would not
        // exist in the daemon. Lines logged until then wait in the channel.
        let writer = self.writer.lock().ok().and_then(|mut w| w.take());
        if let Some(writer) = writer {
            if let Err(e) = std::thread::Builder::new()
                .name("access-log".into())
                .spawn(move || writer.run())
            {
                log::error!("cannot start the access-log writer: {e}");
            }
        }
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
            self.reopen.store(true, Ordering::Release);
            self.log.wake();
        }
    }
}

struct Writer {
    rx: Receiver<Msg>,
    sink: Sink,
    reopen: Arc<AtomicBool>,
    /// Set while writes fail, so the error is logged once, not per line.
    failing: bool,
}

impl Writer {
    fn run(mut self) {
        let mut acks = Vec::new();
        while let Ok(first) = self.rx.recv() {
            // Take the whole burst, then flush once: one write call for many lines.
            let mut next = Some(first);
            while let Some(msg) = next {
                if self.reopen.swap(false, Ordering::AcqRel) {
                    let result = self.sink.reopen();
                    self.note(result);
                }
                match msg {
                    Msg::Line(line) => {
                        let result = self.sink.write_line(&line);
                        self.note(result);
                    }
                    Msg::Wake => {}
                    Msg::Flush(ack) => acks.push(ack),
                }
                next = self.rx.try_recv().ok();
            }
            let result = self.sink.flush();
            self.note(result);
            for ack in acks.drain(..) {
                let _ = ack.send(());
            }
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
    fn write_line(&mut self, line: &[u8]) -> io::Result<()> {
        match self {
            Sink::Stdout(out) => out.write_all(line),
            Sink::File(file) => file.write_line(line),
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

    #[test]
    fn a_full_queue_drops_instead_of_blocking() {
        let settings = AccessLogSettings {
            destination: AccessLogDestination::Stdout,
            buffer_lines: 2,
        };
        // The writer is never started, so nothing drains the queue.
        let (log, _service) = open(&settings).unwrap();
        assert!(log.send(b"1\n".to_vec()));
        assert!(log.send(b"2\n".to_vec()));
        assert!(!log.send(b"3\n".to_vec()));
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
