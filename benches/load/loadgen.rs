//! Load clients for `benches/load/run.py` that wrk cannot be: a fixed-rate latency client, a
//! response-head latency probe for streaming requests, and a holder of thousands of open streams.
//!
//! ```text
//! loadgen rate     --addr A --path P [--method M] [--header H]... [--body B | --body-file F]
//!                  --rate R --conns C --seconds S [--warmup-s W]
//! loadgen sse-head --addr A --path P [--header H]... --count N [--warmup N]
//! loadgen streams  --addr A --path P [--header H]... --count N --pid PID [--hold-s S]
//! loadgen count    --addr A --path P [--method M] [--header H]... [--body B] --count N
//! ```
//!
//! Every mode prints one line of `name value` pairs (times in microseconds) for the script.
//! `rate` is open loop: C connections, each sending on a fixed schedule (together R requests/s)
//! from its own thread; the latency of a request runs from the write of its first byte to the
//! last byte of the response, and how late each send was against its schedule is reported as
//! `lag_p99`, so a server that falls behind shows up. Everything is bounded in count and time.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

const TIMEOUT: Duration = Duration::from_secs(10);

#[derive(Default)]
struct Args {
    mode: String,
    addr: Option<SocketAddr>,
    method: String,
    path: String,
    headers: Vec<String>,
    body: String,
    rate: f64,
    conns: usize,
    seconds: f64,
    warmup_s: f64,
    count: usize,
    warmup: usize,
    pid: u32,
    hold_s: f64,
}

fn args() -> Args {
    let mut a = Args {
        method: "GET".into(),
        conns: 16,
        seconds: 5.0,
        warmup_s: 1.0,
        warmup: 200,
        hold_s: 2.0,
        ..Args::default()
    };
    let argv: Vec<String> = std::env::args().skip(1).collect();
    let mut it = argv.into_iter();
    a.mode = it.next().unwrap_or_default();
    while let Some(flag) = it.next() {
        let v = it
            .next()
            .unwrap_or_else(|| fail(&format!("{flag} needs a value")));
        let num = |v: &str| -> f64 { v.parse().unwrap_or_else(|_| fail(&format!("{flag}: {v}"))) };
        match flag.as_str() {
            "--addr" => a.addr = Some(v.parse().unwrap_or_else(|_| fail("--addr"))),
            "--method" => a.method = v,
            "--path" => a.path = v,
            "--header" => a.headers.push(v),
            "--body" => a.body = v,
            // A body too big for the command line (a vision request of several MB).
            "--body-file" => {
                a.body = std::fs::read_to_string(&v).unwrap_or_else(|e| fail(&format!("{v}: {e}")))
            }
            "--rate" => a.rate = num(&v),
            "--conns" => a.conns = num(&v) as usize,
            "--seconds" => a.seconds = num(&v),
            "--warmup-s" => a.warmup_s = num(&v),
            "--count" => a.count = num(&v) as usize,
            "--warmup" => a.warmup = num(&v) as usize,
            "--pid" => a.pid = num(&v) as u32,
            "--hold-s" => a.hold_s = num(&v),
            _ => fail(&format!("unknown flag {flag}")),
        }
    }
    if a.addr.is_none() || a.path.is_empty() {
        fail("--addr and --path are required");
    }
    a
}

fn fail(msg: &str) -> ! {
    eprintln!("loadgen: {msg}");
    std::process::exit(2)
}

fn request(a: &Args) -> Vec<u8> {
    let mut r = format!("{} {} HTTP/1.1\r\nhost: bench\r\n", a.method, a.path);
    for h in &a.headers {
        r.push_str(h);
        r.push_str("\r\n");
    }
    if !a.body.is_empty() || a.method == "POST" {
        r.push_str(&format!("content-length: {}\r\n", a.body.len()));
    }
    r.push_str("\r\n");
    r.push_str(&a.body);
    r.into_bytes()
}

fn main() {
    let a = args();
    match a.mode.as_str() {
        "rate" => rate(&a),
        "sse-head" => sse_head(&a),
        "streams" => streams(&a),
        "count" => count(&a),
        _ => fail("mode: rate, sse-head, streams or count"),
    }
}

// ---- a blocking HTTP/1.1 response reader ---------------------------------------------------

struct Conn {
    sock: TcpStream,
    buf: Vec<u8>,
}

struct Head {
    status: u16,
    len: usize,
    content_length: Option<usize>,
    chunked: bool,
    event_stream: bool,
}

impl Conn {
    fn open(addr: SocketAddr) -> std::io::Result<Conn> {
        let sock = TcpStream::connect_timeout(&addr, TIMEOUT)?;
        sock.set_nodelay(true)?;
        sock.set_read_timeout(Some(TIMEOUT))?;
        sock.set_write_timeout(Some(TIMEOUT))?;
        Ok(Conn {
            sock,
            buf: Vec::with_capacity(16 * 1024),
        })
    }

    fn fill(&mut self) -> std::io::Result<()> {
        let mut tmp = [0u8; 16 * 1024];
        let n = self.sock.read(&mut tmp)?;
        if n == 0 {
            return Err(std::io::ErrorKind::UnexpectedEof.into());
        }
        self.buf.extend_from_slice(&tmp[..n]);
        Ok(())
    }

    /// Reads until a whole response head is buffered.
    fn head(&mut self) -> std::io::Result<Head> {
        loop {
            let mut headers = [httparse::EMPTY_HEADER; 64];
            let mut resp = httparse::Response::new(&mut headers);
            match resp.parse(&self.buf) {
                Ok(httparse::Status::Complete(len)) => {
                    let get = |name: &str| {
                        resp.headers
                            .iter()
                            .find(|h| h.name.eq_ignore_ascii_case(name))
                            .and_then(|h| std::str::from_utf8(h.value).ok())
                    };
                    return Ok(Head {
                        status: resp.code.unwrap_or(0),
                        len,
                        content_length: get("content-length").and_then(|v| v.trim().parse().ok()),
                        chunked: get("transfer-encoding")
                            .is_some_and(|v| v.to_ascii_lowercase().contains("chunked")),
                        event_stream: get("content-type")
                            .is_some_and(|v| v.starts_with("text/event-stream")),
                    });
                }
                Ok(httparse::Status::Partial) => self.fill()?,
                Err(e) => return Err(std::io::Error::other(e.to_string())),
            }
        }
    }

    /// Reads the body after `head` and drops the whole response from the buffer.
    fn body(&mut self, head: &Head) -> std::io::Result<()> {
        let mut pos = head.len;
        if head.chunked {
            loop {
                // Chunk-size line, then the data and its CRLF; size 0 ends (no trailers here).
                let line_end = loop {
                    if let Some(i) = self.buf[pos..].windows(2).position(|w| w == b"\r\n") {
                        break pos + i;
                    }
                    self.fill()?;
                };
                let size_text = std::str::from_utf8(&self.buf[pos..line_end]).unwrap_or("");
                let size_text = size_text.split(';').next().unwrap_or("").trim();
                let size = usize::from_str_radix(size_text, 16)
                    .map_err(|_| std::io::Error::other("bad chunk size"))?;
                let end = line_end + 2 + size + 2;
                while self.buf.len() < end {
                    self.fill()?;
                }
                pos = end;
                if size == 0 {
                    break;
                }
            }
        } else {
            let end = pos + head.content_length.unwrap_or(0);
            while self.buf.len() < end {
                self.fill()?;
            }
            pos = end;
        }
        self.buf.drain(..pos);
        Ok(())
    }
}

// ---- statistics --------------------------------------------------------------------------

fn percentile(sorted: &[f64], p: f64) -> f64 {
    if sorted.is_empty() {
        return f64::NAN;
    }
    let rank = ((p / 100.0) * (sorted.len() - 1) as f64).round() as usize;
    sorted[rank.min(sorted.len() - 1)]
}

fn summary(mut lat_us: Vec<f64>) -> String {
    lat_us.sort_by(|a, b| a.total_cmp(b));
    format!(
        "count {} p50 {:.1} p90 {:.1} p99 {:.1} p999 {:.1} max {:.1}",
        lat_us.len(),
        percentile(&lat_us, 50.0),
        percentile(&lat_us, 90.0),
        percentile(&lat_us, 99.0),
        percentile(&lat_us, 99.9),
        lat_us.last().copied().unwrap_or(f64::NAN),
    )
}

// ---- modes -------------------------------------------------------------------------------

/// Open-loop fixed rate: connection i sends request k at start + (i + k·C)/R.
fn rate(a: &Args) {
    if a.rate <= 0.0 || a.conns == 0 {
        fail("--rate and --conns must be positive");
    }
    let req = Arc::new(request(a));
    let addr = a.addr.unwrap();
    let (conns, rate, warmup, total) = (a.conns, a.rate, a.warmup_s, a.warmup_s + a.seconds);
    let start = Instant::now() + Duration::from_millis(200);
    let threads: Vec<_> = (0..conns)
        .map(|i| {
            let req = req.clone();
            std::thread::spawn(move || {
                let mut lat = Vec::new();
                let mut lag = Vec::new();
                let mut errors = 0usize;
                let mut conn = Conn::open(addr).ok();
                for k in 0.. {
                    let offset = (i + k * conns) as f64 / rate;
                    if offset >= total {
                        break;
                    }
                    let due = start + Duration::from_secs_f64(offset);
                    let now = Instant::now();
                    if due > now {
                        std::thread::sleep(due - now);
                    }
                    let sent = Instant::now();
                    let c = match conn.as_mut() {
                        Some(c) => c,
                        None => match Conn::open(addr) {
                            Ok(c) => conn.insert(c),
                            Err(_) => {
                                errors += 1;
                                continue;
                            }
                        },
                    };
                    let ok = c.sock.write_all(&req).is_ok()
                        && match c.head() {
                            Ok(h) => c.body(&h).is_ok() && h.status == 200,
                            Err(_) => false,
                        };
                    let done = Instant::now();
                    if !ok {
                        errors += 1;
                        conn = None;
                        continue;
                    }
                    if offset >= warmup {
                        lat.push((done - sent).as_secs_f64() * 1e6);
                        lag.push(sent.saturating_duration_since(due).as_secs_f64() * 1e6);
                    }
                }
                (lat, lag, errors)
            })
        })
        .collect();
    let (mut lat, mut lag, mut errors) = (Vec::new(), Vec::new(), 0);
    for t in threads {
        let (l, g, e) = t.join().unwrap();
        lat.extend(l);
        lag.extend(g);
        errors += e;
    }
    lag.sort_by(|a, b| a.total_cmp(b));
    let achieved = lat.len() as f64 / a.seconds;
    println!(
        "{} errors {errors} rate {achieved:.0} lag_p99 {:.1}",
        summary(lat),
        percentile(&lag, 99.0)
    );
}

/// Sequential streaming requests on one kept-alive connection: time from the request's write
/// to its complete response head; each (short) stream is read to its end before the next.
fn sse_head(a: &Args) {
    let req = request(a);
    let addr = a.addr.unwrap();
    let mut conn = Conn::open(addr).unwrap_or_else(|e| fail(&format!("connect: {e}")));
    let mut lat = Vec::with_capacity(a.count);
    let mut errors = 0;
    let deadline = Instant::now() + Duration::from_secs(120);
    for i in 0..a.warmup + a.count {
        if Instant::now() > deadline {
            fail("sse-head: over 120 s");
        }
        let sent = Instant::now();
        let head = conn.sock.write_all(&req).and_then(|_| conn.head());
        let at_head = Instant::now();
        let ok = match head {
            Ok(h) => h.status == 200 && h.event_stream && conn.body(&h).is_ok(),
            Err(_) => false,
        };
        if !ok {
            errors += 1;
            if errors > 10 {
                fail("sse-head: too many failed requests");
            }
            conn = Conn::open(addr).unwrap_or_else(|e| fail(&format!("connect: {e}")));
            continue;
        }
        if i >= a.warmup {
            lat.push((at_head - sent).as_secs_f64() * 1e6);
        }
    }
    println!("{} errors {errors}", summary(lat));
}

/// Exactly `count` sequential requests on one kept-alive connection, each checked to be a 200:
/// a fixed amount of work for instruction counting (benches/load/callgrind.py), so no timing at all.
fn count(a: &Args) {
    let req = request(a);
    let addr = a.addr.unwrap();
    let mut conn = Conn::open(addr).unwrap_or_else(|e| fail(&format!("connect: {e}")));
    for i in 0..a.count {
        let ok = conn.sock.write_all(&req).is_ok()
            && match conn.head() {
                Ok(h) => h.status == 200 && conn.body(&h).is_ok(),
                Err(_) => false,
            };
        if !ok {
            fail(&format!("count: request {i} failed"));
        }
    }
    println!("count {} errors 0", a.count);
}

/// Opens `count` streaming requests at once (at most 256 being set up at a time), waits until
/// each has its response head and first event, then reads the server's memory from /proc.
fn streams(a: &Args) {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let req: Arc<[u8]> = request(a).into();
    let addr = a.addr.unwrap();
    let (count, pid, hold) = (a.count, a.pid, Duration::from_secs_f64(a.hold_s));
    rt.block_on(async move {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let opened = Arc::new(AtomicUsize::new(0));
        let failed = Arc::new(AtomicUsize::new(0));
        let setup = Arc::new(tokio::sync::Semaphore::new(256));
        let t0 = Instant::now();
        for _ in 0..count {
            let (req, opened, failed, setup) =
                (req.clone(), opened.clone(), failed.clone(), setup.clone());
            tokio::spawn(async move {
                let permit = setup.acquire_owned().await;
                let open = async {
                    let mut s = tokio::net::TcpStream::connect(addr).await?;
                    s.write_all(&req).await?;
                    let mut buf = vec![0u8; 2048];
                    let mut have = 0;
                    // The head and the first event: "200" and a "data:" line.
                    loop {
                        let n = s.read(&mut buf[have..]).await?;
                        if n == 0 {
                            return Err(std::io::ErrorKind::UnexpectedEof.into());
                        }
                        have += n;
                        let text = &buf[..have];
                        if !text.starts_with(b"HTTP/1.1 200") {
                            return Err(std::io::Error::other("not 200"));
                        }
                        if text.windows(5).any(|w| w == b"data:") {
                            return Ok::<_, std::io::Error>((s, buf));
                        }
                        if have == buf.len() {
                            return Err(std::io::Error::other("head too long"));
                        }
                    }
                };
                match tokio::time::timeout(Duration::from_secs(30), open).await {
                    Ok(Ok((mut s, mut buf))) => {
                        opened.fetch_add(1, Ordering::Relaxed);
                        drop(permit);
                        // Hold the stream, draining ticks, until the server ends it.
                        while let Ok(n) = s.read(&mut buf).await {
                            if n == 0 {
                                break;
                            }
                        }
                    }
                    _ => {
                        failed.fetch_add(1, Ordering::Relaxed);
                    }
                }
            });
        }
        let deadline = Instant::now() + Duration::from_secs(90);
        while opened.load(Ordering::Relaxed) + failed.load(Ordering::Relaxed) < count {
            if Instant::now() > deadline {
                break;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        let open_s = t0.elapsed().as_secs_f64();
        tokio::time::sleep(hold).await;
        let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
        let kb = |field: &str| -> u64 {
            status
                .lines()
                .find_map(|l| l.strip_prefix(field))
                .and_then(|v| v.split_whitespace().next()?.parse().ok())
                .unwrap_or(0)
        };
        println!(
            "opened {} failed {} open_s {open_s:.2} rss_kb {} hwm_kb {}",
            opened.load(Ordering::Relaxed),
            failed.load(Ordering::Relaxed),
            kb("VmRSS:"),
            kb("VmHWM:"),
        );
    });
    // Leaving closes every stream at once; the runtime is not waited on.
    std::process::exit(0);
}
