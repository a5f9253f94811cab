//! The two wrappers that put an HTTP app behind its listener's gate: `Admitted` gives each
//! connection its place (or closes it) and its timed stream, `HeadTimed` tells that stream
//! when each request's head is due.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;

use async_trait::async_trait;
use pingora::apps::{HttpServerApp, HttpServerOptions, ReusedHttpStream, ServerApp};
use pingora::protocols::http::v2::server::H2Options;
use pingora::protocols::http::ServerSession;
use pingora::protocols::Stream;
use pingora::server::ShutdownWatch;

use super::conn::Conn;
use super::gate::Gate;

/// An HTTP app whose connections are counted, limited and head-timed by `gate`.
pub(crate) struct Admitted<A> {
    inner: Arc<HeadTimed<A>>,
    gate: Arc<Gate>,
}

impl<A> Admitted<A> {
    pub(super) fn new(app: A, gate: Arc<Gate>) -> Admitted<A> {
        Admitted {
            inner: Arc::new(HeadTimed(Arc::new(app))),
            gate,
        }
    }
}

#[async_trait]
impl<A: HttpServerApp + Send + Sync + 'static> ServerApp for Admitted<A> {
    async fn process_new(
        self: &Arc<Self>,
        stream: Stream,
        shutdown: &ShutdownWatch,
    ) -> Option<Stream> {
        let digest = stream.get_socket_digest();
        let peer = digest.as_ref().and_then(|d| d.peer_addr()?.as_inet());
        // Refused: the stream is dropped, which closes the connection.
        let slot = self.gate.claim(peer).ok()?;
        let mut next = Some(Box::new(Conn::new(stream, slot, self.gate.clone())) as Stream);
        // Pingora's HTTP apps keep a connection alive themselves and hand nothing back; were
        // one to, it must come back here, not to Pingora, which would admit it a second time.
        while let Some(stream) = next {
            next = self.inner.process_new(stream, shutdown).await;
        }
        None
    }

    async fn cleanup(&self) {
        self.inner.cleanup().await
    }
}

/// Marks each request's head as due on the connection's `Conn` before the app reads it.
pub(crate) struct HeadTimed<A>(Arc<A>);

#[async_trait]
impl<A: HttpServerApp + Send + Sync + 'static> HttpServerApp for HeadTimed<A> {
    // Written out rather than `async fn`: the inner app's boxed future is returned as it is,
    // so a request costs no second allocation here.
    fn process_new_http<'life0, 'life1, 'async_trait>(
        self: &'life0 Arc<Self>,
        session: ServerSession,
        shutdown: &'life1 ShutdownWatch,
    ) -> Pin<Box<dyn Future<Output = Option<ReusedHttpStream>> + Send + 'async_trait>>
    where
        'life0: 'async_trait,
        'life1: 'async_trait,
        Self: 'async_trait,
    {
        let conn = session
            .stream()
            .and_then(|s| (**s).as_any().downcast_ref::<Conn>());
        if let Some(conn) = conn {
            conn.expect_head();
        }
        self.0.process_new_http(session, shutdown)
    }

    fn h2_options(&self) -> Option<H2Options> {
        self.0.h2_options()
    }

    fn server_options(&self) -> Option<&HttpServerOptions> {
        self.0.server_options()
    }

    async fn http_cleanup(&self) {
        self.0.http_cleanup().await
    }

    async fn process_custom_session(
        self: Arc<Self>,
        stream: Stream,
        shutdown: &ShutdownWatch,
    ) -> Option<Stream> {
        self.0
            .clone()
            .process_custom_session(stream, shutdown)
            .await
    }
}
