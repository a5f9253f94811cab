//! `api = "openai"` services against the real binary: strict body validation, the model
//! policy (default, aliases) with correct upstream framing, and token usage accounting.

use std::io::Write;
use std::net::TcpStream;
use std::path::Path;
use std::time::{Duration, Instant};

use serde_json::{json, Value};
use testkit::{header, read_response, Gateway, RawResponse, Service};
use testkit::{Hit, Upstream};

const CHAT: &str = "/v1/infer/v1/chat/completions";
const CHATX: &str = "/v1/chatx/v1/chat/completions";
const EMBED: &str = "/v1/embed/v1/embeddings";

/// Upstream paths start with `/oa/`, where the recording upstream answers like an
/// OpenAI-compatible server. `infer` and `embed` validate only, `chatx` has a default and two aliases, and `plain` is the
/// same upstream without `api`: the control.
fn gateway(up: &Upstream) -> (Gateway, String) {
    let gw = Gateway::builder()
        .service(Service::new("infer", up.url("/oa/infer")).openai())
        .service(Service::new("chatx", up.url("/oa/chatx")).openai().models(
            "x-large-2",
            &[("large", "x-large-2"), ("small", "x-small-1")],
        ))
        .service(Service::new("embed", up.url("/oa/embed")).openai())
        .service(Service::new("plain", up.url("/oa/plain")))
        .max_body(8 * 1024 * 1024)
        .extra("[access_log]\ndestination = \"{dir}/access.log\"\n")
        .start();
    let (key, _) = gw.create_key("infer,chatx,embed,plain", &[]);
    (gw, key)
}

fn request(key: &str, path: &str, body: &[u8], request_id: &str, keep_alive: bool) -> Vec<u8> {
    let mut req = format!(
        "POST {path} HTTP/1.1\r\nHost: gw\r\nAuthorization: Bearer {key}\r\n\
         Content-Type: application/json\r\nX-Request-Id: {request_id}\r\ncontent-length: {}\r\n{}\r\n",
        body.len(),
        if keep_alive { "" } else { "Connection: close\r\n" }
    )
    .into_bytes();
    req.extend_from_slice(body);
    req
}

fn post(gw: &Gateway, key: &str, path: &str, body: &[u8]) -> RawResponse {
    gw.raw(&request(key, path, body, "t", false))
}

fn message_of(body: &[u8]) -> String {
    let v: Value = serde_json::from_slice(body).unwrap();
    assert_eq!(v["error"], "bad_request", "{v}");
    v["message"].as_str().unwrap().to_string()
}

/// The upstream's framing must match the bytes it got: an exact Content-Length, or chunked.
fn assert_framing_consistent(r: &Hit) {
    match (r.header("content-length"), r.header("transfer-encoding")) {
        (Some(len), None) => assert_eq!(len.parse::<usize>().unwrap(), r.body.len()),
        (None, Some(te)) => assert!(te.contains("chunked"), "{te}"),
        other => panic!("inconsistent upstream framing {other:?}"),
    }
}

#[test]
fn malformed_bodies_get_400_naming_the_field_and_never_reach_the_upstream() {
    let up = Upstream::start();
    let (gw, key) = gateway(&up);
    let chat_cases: &[(&str, &str)] = &[
        ("{\"messages\": [", "body is not valid JSON (line 1, column 14)"),
        ("", "body is not valid JSON (line 1, column 0)"),
        ("[1,2]", "body must be a JSON object"),
        ("\"text\"", "body must be a JSON object"),
        ("{\"model\":\"m\"}", "messages is required"),
        ("{\"messages\":[]}", "messages must be a non-empty array"),
        ("{\"messages\":{\"role\":\"user\"}}", "messages must be a non-empty array"),
        ("{\"messages\":[\"hi\"]}", "messages[0] must be an object"),
        (
            "{\"messages\":[{\"role\":\"user\",\"content\":\"a\"},{\"content\":\"b\"}]}",
            "messages[1].role must be a string",
        ),
        (
            "{\"messages\":[{\"role\":\"a\",\"content\":\"\"},{\"role\":\"b\",\"content\":null},{\"role\":7}]}",
            "messages[2].role must be a string",
        ),
        (
            "{\"messages\":[{\"role\":\"user\",\"content\":42}]}",
            "messages[0].content must be a string, an array of content parts or null",
        ),
        (
            "{\"messages\":[{\"role\":\"user\",\"content\":[\"x\"]}]}",
            "messages[0].content[0] must be an object",
        ),
        (
            "{\"model\":7,\"messages\":[{\"role\":\"user\",\"content\":\"a\"}]}",
            "model must be a string",
        ),
        (
            "{\"stream\":\"yes\",\"messages\":[{\"role\":\"user\",\"content\":\"a\"}]}",
            "stream must be a boolean",
        ),
        (
            "{\"model\":\"a\",\"model\":\"b\",\"messages\":[{\"role\":\"user\",\"content\":\"a\"}]}",
            "model appears more than once",
        ),
        (
            "{\"model\":\"a\",\"mod\\u0065l\":\"b\",\"messages\":[{\"role\":\"user\",\"content\":\"a\"}]}",
            "model appears more than once",
        ),
    ];
    let embed_cases: &[(&str, &str)] = &[
        ("{\"model\":\"emb-m3\"}", "input is required"),
        (
            "{\"input\":5}",
            "input must be a string, an array of strings, an array of integers or an array of integer arrays",
        ),
        (
            "{\"input\":[\"a\",1]}",
            "input must be a string, an array of strings, an array of integers or an array of integer arrays",
        ),
        (
            "{\"input\":[[1,2],[3.5]]}",
            "input must be a string, an array of strings, an array of integers or an array of integer arrays",
        ),
        ("{\"input\":\"a\",\"model\":[\"m\"]}", "model must be a string"),
    ];
    let cases = chat_cases
        .iter()
        .map(|c| (CHAT, c))
        .chain(chat_cases.iter().map(|c| (CHATX, c)))
        .chain(embed_cases.iter().map(|c| (EMBED, c)));
    for (path, (body, want)) in cases {
        let (status, headers, resp) = post(&gw, &key, path, body.as_bytes());
        assert_eq!(status, 400, "{path} {body}");
        assert_eq!(header(&headers, "content-type"), Some("application/json"));
        assert_eq!(message_of(&resp), *want, "{path} {body}");
    }
    assert!(
        up.requests().is_empty(),
        "the upstream got {:?}",
        up.requests()
    );
    // Only `api = "openai"` services read bodies: the control service forwards anything.
    assert_eq!(
        post(&gw, &key, "/v1/plain/v1/chat/completions", b"[1,2]").0,
        200
    );
    assert_eq!(up.last().body, b"[1,2]");
}

#[test]
fn a_refused_body_leaves_the_connection_usable() {
    let up = Upstream::start();
    let (gw, key) = gateway(&up);
    let mut conn = TcpStream::connect(("127.0.0.1", gw.port)).unwrap();
    conn.set_read_timeout(Some(Duration::from_secs(10)))
        .unwrap();
    let bad = br#"{"messages":[{"role":5}]}"#;
    let good = br#"{"messages":[{"role":"user","content":"hi"}]}"#;
    for (body, status) in [
        (&bad[..], 400),
        (&good[..], 200),
        (&bad[..], 400),
        (&good[..], 200),
    ] {
        conn.write_all(&request(&key, CHAT, body, "ka", true))
            .unwrap();
        let (got, _, _) = read_response(&mut conn)
            .unwrap()
            .expect("the gateway closed a connection it should have kept");
        assert_eq!(got, status);
    }
    assert_eq!(up.requests().len(), 2);
}

fn png_data_uri(bytes: usize) -> String {
    use base64::Engine;
    let raw: Vec<u8> = (0..bytes).map(|i| (i * 7 % 251) as u8).collect();
    format!(
        "data:image/png;base64,{}",
        base64::engine::general_purpose::STANDARD.encode(raw)
    )
}

/// Request bodies as the OpenAI SDKs and other real clients send them.
fn real_world_chat_bodies() -> Vec<Value> {
    let user = json!({"role": "user", "content": "What's the weather in Paris?"});
    vec![
        json!({"model": "alpha3.6-vl", "messages": [user]}),
        json!({"model": "alpha3.6-vl", "messages": [{"role": "system", "content": "Be brief."}, user],
               "temperature": 0.2, "top_p": 0.9, "max_tokens": 64, "stop": ["\n\n"], "n": 1, "seed": 7}),
        json!({"model": "alpha3.6-vl", "messages": [user], "tool_choice": "auto", "tools": [{"type": "function",
               "function": {"name": "get_weather", "description": "Weather for a city",
               "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}]}),
        json!({"model": "alpha3.6-vl", "messages": [user,
               {"role": "assistant", "tool_calls": [{"id": "call_1", "type": "function",
                "function": {"name": "get_weather", "arguments": "{\"city\":\"Paris\"}"}}]},
               {"role": "tool", "tool_call_id": "call_1", "content": "18°C, sunny"}]}),
        json!({"model": "alpha3.6-vl", "messages": [{"role": "user", "content": [
               {"type": "text", "text": "What is in this image?"},
               {"type": "image_url", "image_url": {"url": png_data_uri(3000), "detail": "low"}}]}]}),
        json!({"model": "alpha3.6-vl", "messages": [user], "stream": true, "stream_options": {"include_usage": true}}),
        json!({"model": "alpha3.6-vl", "messages": [user], "response_format": {"type": "json_schema",
               "json_schema": {"name": "w", "schema": {"type": "object", "properties": {"t": {"type": "number"}}}}}}),
        json!({"model": "alpha3.6-vl", "messages": [user], "logprobs": true, "top_logprobs": 3}),
        json!({"model": "alpha3.6-vl", "messages": [user], "chat_template_kwargs": {"enable_thinking": false}}),
        json!({"model": "alpha3.6-vl", "messages": [{"role": "user", "content": null},
               {"role": "developer", "content": "ünïcödé \u{1F600} \"quoted\" \\ back\nslash"}],
               "metadata": {"trace": "x"}, "user": "u-1", "vendor_extension": [1, {"deep": [null]}]}),
    ]
}

#[test]
fn valid_real_world_bodies_reach_the_upstream_byte_for_byte() {
    let up = Upstream::start();
    let (gw, key) = gateway(&up);
    let mut bodies: Vec<(&str, String)> = real_world_chat_bodies()
        .into_iter()
        .map(|b| (CHAT, b.to_string()))
        .collect();
    // Pretty-printed, with odd spacing: bytes, not values, must survive.
    bodies.push((
        CHAT,
        serde_json::to_string_pretty(&real_world_chat_bodies()[2]).unwrap(),
    ));
    for input in [
        json!("one text"),
        json!(["a", "b"]),
        json!([1, 2, 3]),
        json!([[1, 2], [3]]),
        json!([]),
    ] {
        bodies.push((
            EMBED,
            json!({"model": "emb-m3", "input": input, "encoding_format": "float"}).to_string(),
        ));
    }
    for (path, body) in &bodies {
        let (status, _, _) = post(&gw, &key, path, body.as_bytes());
        assert_eq!(status, 200, "{body}");
        let got = up.last();
        assert_eq!(
            String::from_utf8_lossy(&got.body),
            *body,
            "changed on the way"
        );
        assert_eq!(got.header("content-length"), Some(&*body.len().to_string()));
        assert_framing_consistent(&got);
    }
}

#[test]
fn the_model_policy_inserts_the_default_replaces_aliases_and_passes_the_rest() {
    let up = Upstream::start();
    let (gw, key) = gateway(&up);
    let messages = r#""messages":[{"role":"user","content":"hi"}]"#;
    let cases = [
        // (body sent, body the upstream must get, model echoed back)
        (
            format!("{{{messages}}}"),
            format!("{{\"model\":\"x-large-2\",{messages}}}"),
            "x-large-2",
        ),
        (
            format!(" \n{{ {messages} , \"temperature\":0}}"),
            format!(" \n{{\"model\":\"x-large-2\", {messages} , \"temperature\":0}}"),
            "x-large-2",
        ),
        (
            format!("{{\"temperature\":1, \"model\" : \"large\",{messages}}}"),
            format!("{{\"temperature\":1, \"model\" : \"x-large-2\",{messages}}}"),
            "x-large-2",
        ),
        (
            format!("{{{messages},\"model\":\"sm\\u0061ll\"}}"),
            format!("{{{messages},\"model\":\"x-small-1\"}}"),
            "x-small-1",
        ),
        // Unknown names and names of the other family pass through; the path chose the tier.
        (
            format!("{{\"model\":\"x-medium-9\",{messages}}}"),
            format!("{{\"model\":\"x-medium-9\",{messages}}}"),
            "x-medium-9",
        ),
        (
            format!("{{\"model\":\"y-large\",{messages}}}"),
            format!("{{\"model\":\"y-large\",{messages}}}"),
            "y-large",
        ),
    ];
    for (sent, want, model) in &cases {
        let (status, _, resp) = post(&gw, &key, CHATX, sent.as_bytes());
        assert_eq!(status, 200, "{sent}");
        let got = up.last();
        assert_eq!(got.target, "/oa/chatx/v1/chat/completions");
        assert_eq!(String::from_utf8_lossy(&got.body), *want);
        assert_eq!(got.header("content-length"), Some(&*want.len().to_string()));
        assert_framing_consistent(&got);
        let answer: Value = serde_json::from_slice(&resp).unwrap();
        assert_eq!(answer["model"], *model);
    }
    // A service without a default leaves an omitted model omitted.
    let body = format!("{{{messages}}}");
    assert_eq!(post(&gw, &key, CHAT, body.as_bytes()).0, 200);
    assert_eq!(up.last().body, body.as_bytes());
}

#[test]
fn big_and_chunked_bodies_are_validated_and_rewritten_with_chunked_framing() {
    let up = Upstream::start();
    let (gw, key) = gateway(&up);
    let image = png_data_uri(1536 * 1024); // a 2 MB vision request
    let vision = |model: Option<&str>, role: Value| {
        let mut body = json!({"messages": [{"role": role, "content": [
            {"type": "text", "text": "describe"}, {"type": "image_url", "image_url": {"url": image}}]}],
            "max_tokens": 10});
        if let Some(m) = model {
            body["model"] = json!(m);
        }
        body.to_string()
    };
    // Unchanged: the same bytes, chunked (their length was not known when the head left).
    let body = vision(Some("alpha3.6-vl"), json!("user"));
    assert!(body.len() > 2_000_000);
    assert_eq!(post(&gw, &key, CHAT, body.as_bytes()).0, 200);
    let got = up.last();
    assert!(got.body == body.as_bytes(), "a big body changed on the way");
    assert_eq!(got.header("transfer-encoding"), Some("chunked"));
    assert_framing_consistent(&got);
    // Default inserted into a big body.
    let body = vision(None, json!("user"));
    let (status, _, resp) = post(&gw, &key, CHATX, body.as_bytes());
    assert_eq!(status, 200);
    let got = up.last();
    assert_eq!(&got.body[..21], br#"{"model":"x-large-2","#);
    assert!(got.body[21..] == body.as_bytes()[1..]);
    assert_framing_consistent(&got);
    assert_eq!(
        serde_json::from_slice::<Value>(&resp).unwrap()["model"],
        "x-large-2"
    );
    // Malformed: 400, and the upstream never receives a request.
    let before = up.requests().len();
    let (status, _, resp) = post(&gw, &key, CHAT, vision(None, json!(5)).as_bytes());
    assert_eq!(status, 400);
    assert_eq!(message_of(&resp), "messages[0].role must be a string");
    // A small body sent chunked by the client goes the same way.
    let chunked = |body: &str| {
        format!(
            "POST {CHATX} HTTP/1.1\r\nHost: gw\r\nAuthorization: Bearer {key}\r\nConnection: close\r\n\
             Transfer-Encoding: chunked\r\n\r\n{:x}\r\n{body}\r\n0\r\n\r\n",
            body.len()
        )
    };
    let (status, _, resp) =
        gw.raw(chunked(r#"{"messages":[{"role":"user"}],"model":"small"}"#).as_bytes());
    assert_eq!(status, 200);
    assert_eq!(
        up.last().body,
        br#"{"messages":[{"role":"user"}],"model":"x-small-1"}"#
    );
    assert_eq!(
        serde_json::from_slice::<Value>(&resp).unwrap()["model"],
        "x-small-1"
    );
    let (status, _, resp) = gw.raw(chunked(r#"{"messages":"none"}"#).as_bytes());
    assert_eq!(status, 400);
    assert_eq!(message_of(&resp), "messages must be a non-empty array");
    assert_eq!(
        up.requests().len(),
        before + 1,
        "a refused body reached the upstream"
    );
}

/// Access-log lines by request id, waiting until `ids` are all there.
fn access_log(path: &Path, ids: &[&str]) -> std::collections::HashMap<String, Value> {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let text = std::fs::read_to_string(path).unwrap_or_default();
        let lines: std::collections::HashMap<String, Value> = text
            .lines()
            .map(|l| serde_json::from_str::<Value>(l).unwrap())
            .map(|v| (v["request_id"].as_str().unwrap().to_string(), v))
            .collect();
        if ids.iter().all(|id| lines.contains_key(*id)) {
            return lines;
        }
        assert!(Instant::now() < deadline, "missing lines:\n{text}");
        std::thread::sleep(Duration::from_millis(50));
    }
}

fn tokens(gw: &Gateway, service: &str, kind: &str) -> u64 {
    let needle = format!("portcullis_tokens_total{{kind=\"{kind}\",service=\"{service}\"}} ");
    gw.metrics()
        .lines()
        .find_map(|l| l.strip_prefix(&needle))
        .map_or(0, |v| v.trim().parse().unwrap())
}

#[tokio::test(flavor = "multi_thread")]
async fn usage_is_counted_from_json_and_from_streams_split_across_segments() {
    let up = Upstream::start();
    let (gw, key) = gateway(&up);
    assert_eq!(tokens(&gw, "chatx", "prompt"), 0);
    let chat = br#"{"model":"large","messages":[{"role":"user","content":"hi"}]}"#;
    assert_eq!(gw.raw(&request(&key, CHATX, chat, "u-json", false)).0, 200);
    let embed = br#"{"input":["a","b"],"model":"emb-m3"}"#;
    assert_eq!(
        gw.raw(&request(&key, EMBED, embed, "u-embed", false)).0,
        200
    );
    // The stream's usage event reaches the gateway in two reads 200 ms apart.
    let stream = br#"{"stream":true,"stream_options":{"include_usage":true},"messages":[{"role":"user","content":"hi"}]}"#;
    let resp = testkit::client()
        .post(gw.url(&format!("{CHATX}?n=3&gap_ms=20&split_ms=200")))
        .bearer_auth(&key)
        .header("x-request-id", "u-sse")
        .body(&stream[..])
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 200);
    let text = resp.text().await.unwrap();
    assert!(text.ends_with("data: [DONE]\n\n"), "{text}");
    assert!(text.contains(r#""prompt_tokens":21"#));
    // No usage for the control service, which is not read.
    assert_eq!(
        gw.raw(&request(
            &key,
            "/v1/plain/v1/chat/completions",
            chat,
            "u-plain",
            false
        ))
        .0,
        200
    );
    let log = access_log(
        &gw.dir.path().join("access.log"),
        &["u-json", "u-embed", "u-sse", "u-plain"],
    );
    let usage = |id: &str| {
        let l = &log[id];
        (
            l["model"].clone(),
            l["prompt_tokens"].clone(),
            l["completion_tokens"].clone(),
        )
    };
    assert_eq!(usage("u-json"), (json!("x-large-2"), json!(11), json!(5)));
    assert_eq!(usage("u-embed"), (json!("emb-m3"), json!(7), Value::Null));
    assert_eq!(usage("u-sse"), (json!("x-large-2"), json!(21), json!(9)));
    assert_eq!(usage("u-plain"), (Value::Null, Value::Null, Value::Null));
    assert_eq!(tokens(&gw, "chatx", "prompt"), 11 + 21);
    assert_eq!(tokens(&gw, "chatx", "completion"), 5 + 9);
    assert_eq!(tokens(&gw, "embed", "prompt"), 7);
    assert_eq!(tokens(&gw, "embed", "completion"), 0);
    assert_eq!(tokens(&gw, "plain", "prompt"), 0);
}

/// When each chunk of a stream arrives, relative to the first.
async fn arrivals(gw: &Gateway, key: &str, path: &str, body: &'static [u8]) -> Vec<Duration> {
    let mut resp = testkit::client()
        .post(gw.url(path))
        .bearer_auth(key)
        .body(body)
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 200);
    let mut times = Vec::new();
    let mut text = Vec::new();
    let start = Instant::now();
    while let Some(chunk) = resp.chunk().await.unwrap() {
        text.extend_from_slice(&chunk);
        times.push(start.elapsed());
    }
    assert!(text.ends_with(b"data: [DONE]\n\n"));
    times
}

#[tokio::test(flavor = "multi_thread")]
async fn usage_accounting_never_holds_back_a_stream() {
    let up = Upstream::start();
    let (gw, key) = gateway(&up);
    let query = "?n=4&gap_ms=300&split_ms=300";
    let plain = br#"{"stream":true,"messages":[{"role":"user","content":"hi"}]}"#;
    let asks = br#"{"stream":true,"stream_options":{"include_usage":true},"messages":[{"role":"user","content":"hi"}]}"#;
    let chat = format!("{CHATX}{query}");
    let on = arrivals(&gw, &key, &chat, asks).await;
    let off = arrivals(
        &gw,
        &key,
        &format!("/v1/plain/v1/chat/completions{query}"),
        asks,
    )
    .await;
    // 4 chunks, the usage event (in two segments 300 ms apart) and [DONE], each 300 ms after
    // the one before: each must arrive on its own, about when it was sent, accounting on or off.
    for times in [&on, &off] {
        assert!(times.len() >= 6, "{times:?}");
        let last = *times.last().unwrap();
        assert!(
            last >= Duration::from_millis(1500),
            "the stream arrived in a lump: {times:?}"
        );
        let spread = times
            .windows(2)
            .filter(|w| w[1] - w[0] >= Duration::from_millis(150));
        assert!(spread.count() >= 5, "chunks were held back: {times:?}");
    }
    // A client that did not ask for usage: the gateway asked, and takes the usage event out;
    // the 4 chunks and [DONE] still come each on its own.
    let taken_out = arrivals(&gw, &key, &chat, plain).await;
    assert!(taken_out.len() >= 5, "{taken_out:?}");
    let spread = taken_out
        .windows(2)
        .filter(|w| w[1] - w[0] >= Duration::from_millis(150));
    assert!(spread.count() >= 4, "chunks were held back: {taken_out:?}");
}
