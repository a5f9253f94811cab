//! The downstream stream of an admitted connection. It holds the connection's place in the
//! counts until Pingora drops it, and cuts a request head that does not arrive whole within
//! `header_timeout_seconds`: Pingora's own read timeouts apply per read, so a client sending a
//! byte now and then could hold a connection forever.
//!
//! The clock of a connection's first head starts when the connection reaches HTTP (after any
//! TLS handshake, which Pingora bounds itself); the clock of each later head on a kept-alive
//! connection starts with its first byte, the wait for that byte being Pingora's keep-alive
//! timeout. `HeadTimed` says when a new head is due; the end of a head is found here, in the
//! bytes as they are read, where httparse finds it: the first empty line after the request line.

use std::fmt;
use std::future::Future;
use std::io;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::task::{ready, Context, Poll};

use async_trait::async_trait;
use pingora::protocols::raw_connect::ProxyDigest;
use pingora::protocols::tls::{SslDigest, TlsRef};
use pingora::protocols::{GetProxyDigest, GetSocketDigest, GetTimingDigest, SocketDigest};
use pingora::protocols::{Peek, Shutdown, Ssl, Stream, TimingDigest, UniqueID, UniqueIDType, ALPN};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::time::{Instant, Sleep};

use super::count::Slot;
use super::gate::Gate;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Head {
    /// Reading a head that must be complete by `deadline`.
    Reading,
    /// A kept-alive connection's next head is due: its clock starts with its first byte.
    Due,
    /// The head is in; bodies and responses are not timed here.
    Done,
    TimedOut,
}

pub(crate) struct Conn {
    /// Given back before the socket closes (fields drop in order, and a shutdown gives it back
    /// first): a client that saw the close may reconnect at once and find its place free.
    slot: Option<Slot>,
    inner: Stream,
    gate: Arc<Gate>,
    head: Head,
    end: HeadEnd,
    deadline: Instant,
    /// Polled only while a head is being read and the socket has nothing more.
    timer: Pin<Box<Sleep>>,
    /// Set by `HeadTimed` through a shared reference before every request.
    next_head: AtomicBool,
}

impl Conn {
    pub(super) fn new(inner: Stream, slot: Option<Slot>, gate: Arc<Gate>) -> Conn {
        let deadline = Instant::now() + gate.header_timeout;
        Conn {
            slot,
            inner,
            gate,
            head: Head::Reading,
            end: HeadEnd::default(),
            deadline,
            timer: Box::pin(tokio::time::sleep_until(deadline)),
            next_head: AtomicBool::new(false),
        }
    }

    /// A request head is due now (called before every request; the first one's clock is
    /// already running since the connection started).
    pub(super) fn expect_head(&self) {
        self.next_head.store(true, Ordering::Relaxed);
    }

    fn time_out(&mut self) -> Poll<io::Result<()>> {
        if self.head != Head::TimedOut {
            self.head = Head::TimedOut;
            self.gate.header_timeouts.inc();
        }
        Poll::Ready(Err(io::Error::new(
            io::ErrorKind::TimedOut,
            "request head not complete within server.header_timeout_seconds",
        )))
    }
}

impl AsyncRead for Conn {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = &mut *self;
        if std::mem::take(this.next_head.get_mut()) && this.head == Head::Done {
            this.head = Head::Due;
            this.end = HeadEnd::default();
        }
        match this.head {
            Head::Done => return Pin::new(&mut this.inner).poll_read(cx, buf),
            Head::TimedOut => return this.time_out(),
            Head::Reading | Head::Due => {}
        }
        let before = buf.filled().len();
        let read = Pin::new(&mut this.inner).poll_read(cx, buf);
        if read.is_pending() {
            if this.head == Head::Reading && this.timer.as_mut().poll(cx).is_ready() {
                return this.time_out();
            }
            return Poll::Pending;
        }
        ready!(read)?;
        let bytes = &buf.filled()[before..];
        if bytes.is_empty() {
            return Poll::Ready(Ok(()));
        }
        let now = Instant::now();
        if this.head == Head::Reading && now >= this.deadline {
            return this.time_out();
        }
        if this.end.found_in(bytes) {
            this.head = Head::Done;
        } else if this.head == Head::Due {
            // Only a head that takes more than one read arms the timer.
            this.deadline = now + this.gate.header_timeout;
            this.timer.as_mut().reset(this.deadline);
            this.head = Head::Reading;
        }
        Poll::Ready(Ok(()))
    }
}

/// Where a request head ends, fed the bytes as they arrive: at the first empty line (LF or
/// CRLF) after a line with text; empty lines before the request line are skipped, as httparse
/// skips them.
#[derive(Default)]
struct HeadEnd {
    /// The current line has something other than CR.
    line_has_text: bool,
    /// A line with text has ended: the request line is in.
    after_text: bool,
}

impl HeadEnd {
    fn found_in(&mut self, mut bytes: &[u8]) -> bool {
        while let Some(lf) = memchr::memchr(b'\n', bytes) {
            let text = self.line_has_text || bytes[..lf].iter().any(|&b| b != b'\r');
            if !text && self.after_text {
                return true;
            }
            self.after_text |= text;
            self.line_has_text = false;
            bytes = &bytes[lf + 1..];
        }
        self.line_has_text |= bytes.iter().any(|&b| b != b'\r');
        false
    }
}

impl AsyncWrite for Conn {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.inner).poll_write(cx, buf)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.inner).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        // Pingora closes a connection it will not reuse this way, before dropping it.
        self.slot = None;
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }
}

// The rest of Pingora's `IO` is the inner stream's.

#[async_trait]
impl Shutdown for Conn {
    async fn shutdown(&mut self) {
        self.slot = None;
        self.inner.shutdown().await
    }
}

impl UniqueID for Conn {
    fn id(&self) -> UniqueIDType {
        self.inner.id()
    }
}

impl Ssl for Conn {
    fn get_ssl(&self) -> Option<&TlsRef> {
        self.inner.get_ssl()
    }
    fn get_ssl_digest(&self) -> Option<Arc<SslDigest>> {
        self.inner.get_ssl_digest()
    }
    fn selected_alpn_proto(&self) -> Option<ALPN> {
        self.inner.selected_alpn_proto()
    }
}

impl GetTimingDigest for Conn {
    fn get_timing_digest(&self) -> Vec<Option<TimingDigest>> {
        self.inner.get_timing_digest()
    }
    fn get_read_pending_time(&self) -> std::time::Duration {
        self.inner.get_read_pending_time()
    }
    fn get_write_pending_time(&self) -> std::time::Duration {
        self.inner.get_write_pending_time()
    }
}

impl GetProxyDigest for Conn {
    fn get_proxy_digest(&self) -> Option<Arc<ProxyDigest>> {
        self.inner.get_proxy_digest()
    }
    fn set_proxy_digest(&mut self, digest: ProxyDigest) {
        self.inner.set_proxy_digest(digest)
    }
}

impl GetSocketDigest for Conn {
    fn get_socket_digest(&self) -> Option<Arc<SocketDigest>> {
        self.inner.get_socket_digest()
    }
    fn set_socket_digest(&mut self, digest: SocketDigest) {
        self.inner.set_socket_digest(digest)
    }
}

#[async_trait]
impl Peek for Conn {
    async fn try_peek(&mut self, buf: &mut [u8]) -> io::Result<bool> {
        self.inner.try_peek(buf).await
    }
}

impl fmt::Debug for Conn {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Conn")
            .field("inner", &self.inner)
            .field("head", &self.head)
            .finish_non_exhaustive()
    }
}

#[cfg(test)]
mod tests {
    use super::HeadEnd;

    /// Where `HeadEnd` finds the end when `head` arrives in pieces of `step` bytes.
    fn end_in_steps(head: &[u8], step: usize) -> Option<usize> {
        let mut end = HeadEnd::default();
        let mut read = 0;
        for piece in head.chunks(step) {
            read += piece.len();
            if end.found_in(piece) {
                return Some(read);
            }
        }
        None
    }

    #[test]
    fn the_end_of_a_head_is_found_however_it_is_split() {
        let cases: [(&[u8], Option<usize>); 6] = [
            (b"GET / HTTP/1.1\r\nHost: a\r\n\r\n", Some(27)),
            (b"GET / HTTP/1.0\n\n", Some(16)),
            (b"GET / HTTP/1.1\r\nHost: a\n\r\n", Some(26)),
            // Empty lines before the request line are skipped, as httparse skips them.
            (b"\r\n\r\n\nGET / HTTP/1.1\r\n\r\n", Some(23)),
            (b"GET / HTTP/1.1\r\nHost: a\r\n", None),
            (b"\r\n\r\n", None),
        ];
        for (head, want) in cases {
            for step in 1..=head.len() {
                let found = end_in_steps(head, step);
                // In pieces, the end is found in the piece that holds it.
                let want = want
                    .map(|at| at.div_ceil(step) * step)
                    .map(|at| at.min(head.len()));
                assert_eq!(
                    found,
                    want,
                    "{:?} in steps of {step}",
                    String::from_utf8_lossy(head)
                );
            }
        }
    }
}
