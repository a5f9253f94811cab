//! The `/metrics` listener's one endpoint.

use async_trait::async_trait;
use http::Response;
use pingora::apps::http_app::ServeHttp;
use pingora::protocols::http::ServerSession;

use crate::observe::metrics::Metrics;

/// The `/metrics` endpoint.
pub(crate) struct MetricsApp(pub std::sync::Arc<Metrics>);

#[async_trait]
impl ServeHttp for MetricsApp {
    async fn response(&self, session: &mut ServerSession) -> Response<Vec<u8>> {
        let path = session.req_header().uri.path();
        let (status, content_type, body) = if path == "/metrics" {
            (200, "text/plain; version=0.0.4", self.0.render())
        } else {
            (
                404,
                "application/json",
                br#"{"error":"not_found"}"#.to_vec(),
            )
        };
        Response::builder()
            .status(status)
            .header("content-type", content_type)
            .header("content-length", body.len())
            .body(body)
            .expect("static response parts are valid")
    }
}
