//! The agent APIs' streams keep their timing through the gateway, as chat streams do
//! (`gateway::sse_reaches_the_client_chunk_by_chunk_even_with_gzip_accepted`): an OpenAI
//! Responses stream on an `api = "openai"` service and an Anthropic Messages stream on an
//! `api = "anthropic"` one, read for their usage, reach the client event by event and unchanged.

use std::time::{Duration, Instant};

use testkit::upstream::{agent_sse_body, AgentEndpoint};
use testkit::{Gateway, Service, Upstream};

async fn events_arrive_as_sent(path: &str, body: &str, endpoint: AgentEndpoint, events: usize) {
    let up = Upstream::start();
    let gw = Gateway::builder()
        .service(Service::new("chatx", up.url("")).openai())
        .service(Service::new("claude", up.url("")).set("api", "\"anthropic\""))
        .start();
    let (key, _) = gw.create_key("chatx,claude", &[]);
    let mut resp = testkit::client()
        .post(gw.url(path))
        .bearer_auth(&key)
        .header("content-type", "application/json")
        .header("accept", "text/event-stream")
        .body(body.to_string())
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 200);
    assert_eq!(resp.headers()["content-type"], "text/event-stream");
    let mut arrivals = Vec::new();
    let mut text = Vec::new();
    while let Some(chunk) = resp.chunk().await.unwrap() {
        arrivals.push(Instant::now());
        text.extend_from_slice(&chunk);
    }
    // Unchanged: the gateway only reads these streams.
    let want = agent_sse_body(endpoint, Some("m-1"), 6);
    assert_eq!(String::from_utf8(text).unwrap(), want);
    let log = up.stream(0);
    let sent = log.lock().unwrap().sent.clone();
    assert_eq!(sent.len(), events);
    // Generous bound, not a benchmark: the first event is seen long before the last is sent.
    assert!(
        arrivals[0] + Duration::from_millis(500) < *sent.last().unwrap(),
        "the stream was buffered"
    );
    assert!(
        arrivals.len() >= 4,
        "events were coalesced: {} chunks",
        arrivals.len()
    );
}

#[tokio::test]
async fn a_responses_stream_reaches_the_client_event_by_event() {
    let body = r#"{"model":"m-1","input":"hi","stream":true}"#;
    // created, in_progress, item added, part added, 6 deltas, text done, part done, item done,
    // completed.
    let path = "/v1/chatx/oa/v1/responses?n=6&gap_ms=150";
    events_arrive_as_sent(path, body, AgentEndpoint::Responses, 14).await;
}

#[tokio::test]
async fn a_messages_stream_reaches_the_client_event_by_event() {
    let body = r#"{"model":"m-1","max_tokens":64,"stream":true,
        "messages":[{"role":"user","content":"hi"}]}"#;
    // message_start, block start, ping, 6 deltas, block stop, message_delta, message_stop.
    let path = "/v1/claude/oa/v1/messages?n=6&gap_ms=150";
    events_arrive_as_sent(path, body, AgentEndpoint::Messages, 12).await;
}
