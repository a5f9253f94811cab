//! The dialect bridge's conformance suite (issue 32): one table (`conformance!`) runs, for each
//! direction, every cell of {JSON, stream, stream cut} × {text, tool call round trip, parallel
//! tool calls, image, thinking}. A cell has the same conversation twice on one gateway:
//! through the bridge (a service with `translate`, whose upstream is sent the target dialect)
//! and natively (a service without, whose upstream is sent the client's dialect). The upstream
//! is the demo model, which answers all three dialects alike and refuses malformed bodies of
//! each: an answered bridged call proves the upstream got a valid body of its own dialect.
//!
//! The client's answers are compared normalized (`normalize`): content blocks / output items
//! with their text or arguments, tool names, the stop reason (`finish_reason`, `status`), the
//! usage; ids, timestamps, signatures and item statuses aside. Streams are accumulated as the
//! official SDKs accumulate them (`accumulate`) and held to the JSON answer and to the native
//! stream. Every usage the client sees is the one the access log records. A cut stream (the
//! upstream drops after `?cut_after=K` events) must end in the client dialect's error form,
//! having said only a prefix of the full answer, and count as a cut translation.
//!
//! Where the demo model's native answer legitimately differs from a bridged one, only what is
//! comparable is compared:
//! - Cached prompt tokens: the demo reads Messages' `system` as a cache read and Responses'
//!   `instructions` as cached tokens (a cached system prompt), while a chat server reports no
//!   cache; so the prompt's total is compared, never its split (chat clients compare cached
//!   tokens too: the chat → Responses bridge keeps system messages in place, uncached).
//! - Reasoning text: a Responses server hides it (the demo, as OpenAI: `summary: []`) while a
//!   chat server shows it (`reasoning_content`), so a Responses client compares that a
//!   reasoning item is there, a chat client its reasoning token count.
//! - Thinking on Messages: a request silent about thinking gets, through the bridge, the chat
//!   server's default (the demo thinks, as Qwen3 does), and natively none (as Anthropic's
//!   models do); the bridge asks a chat server nothing the client did not say, so the
//!   Messages cells other than thinking turn it off outright.

use std::sync::Mutex;
use std::time::Duration;

use serde_json::{json, Value};
use testkit::{Gateway, Service, Upstream};

use crate::metering::access_log;

/// The clients' dialects, and the bridge's targets.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Dialect {
    Messages,
    Responses,
    Chat,
}

impl Dialect {
    /// Its name in `translate = { <client> = "<target>" }`.
    fn key(self) -> &'static str {
        match self {
            Dialect::Messages => "messages",
            Dialect::Responses => "responses",
            Dialect::Chat => "chat",
        }
    }

    fn endpoint(self) -> &'static str {
        match self {
            Dialect::Messages => "messages",
            Dialect::Responses => "responses",
            Dialect::Chat => "chat/completions",
        }
    }

    fn api(self) -> &'static str {
        match self {
            Dialect::Messages => "\"anthropic\"",
            _ => "\"openai\"",
        }
    }

    /// How many of the demo model's events in this dialect reach past the answer's start, so
    /// that a cut there falls mid-answer: chat's role chunk and reasoning, Responses' created,
    /// in_progress and reasoning item, Messages' message_start, block start and ping.
    fn cut_after(self) -> usize {
        match self {
            Dialect::Messages => 5,
            Dialect::Responses => 7,
            Dialect::Chat => 6,
        }
    }
}

/// A row of the matrix: how the conversation's last turn is sent.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Mode {
    Json,
    Stream,
    Cut,
}

/// A column of the matrix: what the conversation is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Scenario {
    Text,
    /// A call, its result sent back, the echo of the result.
    RoundTrip,
    /// Two calls at once, both results sent back, the echo of the last.
    Parallel,
    Image,
    /// Thinking asked for: Messages `thinking` enabled, Responses `reasoning.effort`, chat
    /// `reasoning_effort` (chat and Responses reason in every cell: the demo reasons unless
    /// told not to, and only its chat endpoint has a switch for that).
    Thinking,
}

impl Scenario {
    /// What the user says (the demo calls two tools when it reads `parallel`).
    fn text(self) -> &'static str {
        match self {
            Scenario::Text => "Say hello to the gateway",
            Scenario::RoundTrip => "What is the weather in Paris?",
            Scenario::Parallel => "Check both in parallel please",
            Scenario::Image => "What is in this picture?",
            Scenario::Thinking => "Think it over first",
        }
    }

    fn tools(self) -> bool {
        matches!(self, Scenario::RoundTrip | Scenario::Parallel)
    }

    /// The turns of its conversation: the tool cells send the results back.
    fn turns(self) -> usize {
        if self.tools() {
            2
        } else {
            1
        }
    }

    /// The turn a cut cell cuts, ending the conversation: the parallel cell its calls, mid-
    /// arguments (the hard part of a streamed tool call), the others their last turn.
    fn cut_turn(self) -> usize {
        match self {
            Scenario::Parallel => 0,
            _ => self.turns() - 1,
        }
    }
}

/// Which service the conversation goes through.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Via {
    Bridge,
    Native,
}

const MODEL: &str = "demo-1";
const SYSTEM: &str = "You are terse.";
/// An image's bytes: the demo reads only its media type, so the PNG signature will do.
const PNG_BASE64: &str = "iVBORw0KGgo=";

/// A tool's result, by the call's place in its turn: distinct, so the echo shows the order.
fn tool_result(i: usize) -> String {
    format!("Result {i}: sunny and 21 degrees")
}

/// One answer as the client got it.
struct Answer {
    /// The client-dialect answer: the JSON body, or the stream's accumulation.
    message: Value,
    normalized: Value,
    end: End,
}

/// How a stream ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum End {
    /// Its dialect's last event (`message_stop`, `response.completed`, `[DONE]`); JSON answers.
    Complete,
    /// Its dialect's error form (`error`, `response.failed`, an error chunk).
    Error,
    /// Neither: the body just stopped.
    Truncated,
}

/// The kit of one cell: the demo model, a gateway with the bridged and the native service,
/// and the usages the client saw, to be found in the access log.
struct Kit {
    client: Dialect,
    target: Dialect,
    scenario: Scenario,
    name: String,
    _upstream: Upstream,
    gateway: Gateway,
    key: String,
    /// (request id, normalized usage) of every complete answer.
    seen: Mutex<Vec<(String, Value)>>,
}

impl Kit {
    fn start(client: Dialect, target: Dialect, mode: Mode, scenario: Scenario) -> Kit {
        let upstream = Upstream::model("demo", testkit::net::local_addr(), Duration::ZERO);
        let translate = format!("{{ {} = \"{}\" }}", client.key(), target.key());
        let bridge = Service::new("bridge", upstream.url(""))
            .scope("conformance")
            .set("api", client.api())
            .set("translate", translate);
        let native = Service::new("native", upstream.url(""))
            .scope("conformance")
            .set("api", client.api());
        let gateway = Gateway::builder()
            .service(bridge)
            .service(native)
            .max_body(1 << 20)
            .extra("[access_log]\ndestination = \"{dir}/access.log\"\n")
            .start();
        let (key, _) = gateway.create_key("conformance", &[]);
        Kit {
            client,
            target,
            scenario,
            name: format!("{}-{}-{mode:?}-{scenario:?}", client.key(), target.key()),
            _upstream: upstream,
            gateway,
            key,
            seen: Mutex::new(Vec::new()),
        }
    }

    /// The conversation through `via`, each turn's answer: as JSON, streamed, or streamed
    /// until the cut turn, which is cut and ends it.
    async fn converse(&self, via: Via, mode: Mode) -> Vec<Answer> {
        let turns = match mode {
            Mode::Cut => self.scenario.cut_turn() + 1,
            _ => self.scenario.turns(),
        };
        let mut history = vec![user_turn(self.client, self.scenario)];
        let mut answers = Vec::new();
        for turn in 0..turns {
            let this = match mode {
                Mode::Cut if turn + 1 < turns => Mode::Stream,
                mode => mode,
            };
            let id = format!("{}-{via:?}-{mode:?}-{turn}", self.name);
            let answer = self.ask(via, this, &history, &id).await;
            if turn + 1 < turns {
                history.extend(replay(self.client, &answer.message));
                history.extend(tool_results(self.client, &answer.message));
            }
            answers.push(answer);
        }
        answers
    }

    async fn ask(&self, via: Via, mode: Mode, history: &[Value], id: &str) -> Answer {
        let (service, upstream) = match via {
            Via::Bridge => ("bridge", self.target),
            Via::Native => ("native", self.client),
        };
        let mut path = format!("/v1/{service}/v1/{}", self.client.endpoint());
        if mode == Mode::Cut {
            path.push_str(&format!("?cut_after={}", upstream.cut_after()));
        }
        let body = request(self.client, self.scenario, history, mode != Mode::Json);
        let (status, bytes) = post(&self.gateway.url(&path), &self.key, &body, id).await;
        let text = String::from_utf8_lossy(&bytes);
        assert_eq!(status, 200, "{id}: {text}");
        let (message, end) = if mode == Mode::Json {
            let message = serde_json::from_slice(&bytes).unwrap_or_else(|_| panic!("{id}: {text}"));
            (message, End::Complete)
        } else {
            accumulate(self.client, &sse(&bytes))
        };
        let normalized = normalize(self.client, &message);
        if end == End::Complete {
            let seen = (id.to_string(), normalized["usage"].clone());
            self.seen.lock().unwrap().push(seen);
        }
        Answer {
            message,
            normalized,
            end,
        }
    }

    /// Every usage the client saw is the one the gateway recorded for its call.
    fn assert_the_log_records_the_usage_the_client_saw(&self) {
        let seen = self.seen.lock().unwrap();
        let ids: Vec<&str> = seen.iter().map(|(id, _)| id.as_str()).collect();
        let log = access_log(&self.gateway.dir.path().join("access.log"), &ids);
        for (id, usage) in seen.iter() {
            let line = &log[id];
            assert_eq!(line["prompt_tokens"], usage["prompt"], "{id}: {line}");
            assert_eq!(
                line["completion_tokens"], usage["completion"],
                "{id}: {line}"
            );
            // Messages usage states no reasoning tokens of its own.
            if let Some(reasoning) = usage.get("reasoning") {
                assert_eq!(&line["reasoning_tokens"], reasoning, "{id}: {line}");
            }
            let bridged = id.contains("-Bridge-");
            let pair = format!("{}>{}", self.client.key(), self.target.key());
            assert_eq!(
                line.get("translated"),
                bridged.then(|| json!(pair)).as_ref(),
                "{line}"
            );
        }
    }
}

/// One cell of the matrix.
async fn cell(client: Dialect, target: Dialect, mode: Mode, scenario: Scenario) {
    let kit = Kit::start(client, target, mode, scenario);
    match mode {
        Mode::Json => {
            let native = kit.converse(Via::Native, Mode::Json).await;
            assert_the_cell_is_exercised(client, scenario, &native);
            let bridged = kit.converse(Via::Bridge, Mode::Json).await;
            assert_same_answers(&bridged, &native, "bridged JSON", "native JSON");
        }
        Mode::Stream => {
            let native = kit.converse(Via::Native, Mode::Stream).await;
            assert_the_cell_is_exercised(client, scenario, &native);
            let bridged = kit.converse(Via::Bridge, Mode::Stream).await;
            let json = kit.converse(Via::Bridge, Mode::Json).await;
            for answer in bridged.iter().chain(&native) {
                assert_eq!(answer.end, End::Complete, "{}", answer.message);
            }
            assert_same_answers(&bridged, &json, "bridged stream", "bridged JSON");
            assert_same_answers(&bridged, &native, "bridged stream", "native stream");
        }
        Mode::Cut => {
            let full = kit.converse(Via::Native, Mode::Json).await;
            assert_the_cell_is_exercised(client, scenario, &full);
            let full = &full[scenario.cut_turn()].normalized;
            let native = kit.converse(Via::Native, Mode::Cut).await;
            let native = native.last().unwrap();
            assert_ne!(native.end, End::Complete, "native: {}", native.message);
            assert_said_a_prefix_of(&native.normalized, full, "native");
            let bridged = kit.converse(Via::Bridge, Mode::Cut).await;
            let bridged = bridged.last().unwrap();
            // Chat's error form may be no more than the missing `[DONE]`.
            let error_forms: &[End] = match client {
                Dialect::Chat => &[End::Error, End::Truncated],
                _ => &[End::Error],
            };
            assert!(
                error_forms.contains(&bridged.end),
                "a cut bridged stream ends in {client:?}'s error form, not {:?}: {}",
                bridged.end,
                bridged.message
            );
            assert_said_a_prefix_of(&bridged.normalized, full, "bridged");
            let pair = format!("{}>{}", client.key(), target.key());
            kit.gateway.metrics_with(&[&format!(
                "portcullis_translations_total{{pair=\"{pair}\",result=\"cut\",service=\"bridge\"}} 1"
            )]);
        }
    }
    kit.assert_the_log_records_the_usage_the_client_saw();
}

fn assert_same_answers(got: &[Answer], want: &[Answer], got_name: &str, want_name: &str) {
    assert_eq!(got.len(), want.len());
    for (turn, (got, want)) in got.iter().zip(want).enumerate() {
        assert_eq!(
            got.normalized, want.normalized,
            "turn {turn}: {got_name} (left) differs from {want_name} (right)\n{got_name}: {}\n{want_name}: {}",
            got.message, want.message
        );
    }
}

/// The native answers show what the cell is about, so that a cell cannot pass by comparing
/// two answers that both missed it.
fn assert_the_cell_is_exercised(client: Dialect, scenario: Scenario, native: &[Answer]) {
    let blocks = |turn: usize| {
        native[turn].normalized["blocks"]
            .as_array()
            .unwrap()
            .clone()
    };
    let of_type = |turn: usize, kind: &str| {
        (blocks(turn).into_iter())
            .filter(|b| b["type"] == kind)
            .collect::<Vec<_>>()
    };
    let text = |turn: usize| {
        of_type(turn, "text")[0]["text"]
            .as_str()
            .unwrap()
            .to_string()
    };
    match scenario {
        Scenario::Text => assert_eq!(text(0), format!("Echo: {}", scenario.text())),
        Scenario::RoundTrip | Scenario::Parallel => {
            let calls = if scenario == Scenario::Parallel { 2 } else { 1 };
            assert_eq!(of_type(0, "tool").len(), calls, "{:?}", blocks(0));
            assert_eq!(text(1), format!("Echo: {}", tool_result(calls - 1)));
        }
        Scenario::Image => assert!(text(0).ends_with(" [image:image/png]"), "{}", text(0)),
        Scenario::Thinking => match client {
            Dialect::Messages => assert_eq!(of_type(0, "thinking").len(), 1),
            Dialect::Responses => assert_eq!(of_type(0, "reasoning").len(), 1),
            Dialect::Chat => assert!(native[0].normalized["usage"]["reasoning"].as_u64() > Some(0)),
        },
    }
}

/// A cut answer said something, and nothing but the start of the full answer: its blocks the
/// full answer's, the last one's text or arguments cut anywhere.
fn assert_said_a_prefix_of(partial: &Value, full: &Value, name: &str) {
    let (got, want) = (
        partial["blocks"].as_array().unwrap(),
        full["blocks"].as_array().unwrap(),
    );
    let context = format!("{name} cut answer {partial} against the full {full}");
    assert!(!got.is_empty() && got.len() <= want.len(), "{context}");
    let last = got.len() - 1;
    assert_eq!(got[..last], want[..last], "{context}");
    let (got, want) = (&got[last], &want[last]);
    assert_eq!(
        (&got["type"], &got["name"]),
        (&want["type"], &want["name"]),
        "{context}"
    );
    for key in ["text", "arguments"] {
        if let Some(said) = got[key].as_str() {
            assert!(want[key].as_str().unwrap().starts_with(said), "{context}");
        }
    }
}

// --- Requests, in each dialect -------------------------------------------------------------

fn user_turn(client: Dialect, scenario: Scenario) -> Value {
    let text = scenario.text();
    let image = scenario == Scenario::Image;
    let data_url = format!("data:image/png;base64,{PNG_BASE64}");
    match client {
        Dialect::Messages => {
            let mut content = vec![json!({"type": "text", "text": text})];
            if image {
                content.push(json!({"type": "image", "source": {"type": "base64",
                    "media_type": "image/png", "data": PNG_BASE64}}));
            }
            json!({"role": "user", "content": content})
        }
        Dialect::Responses => {
            let mut content = vec![json!({"type": "input_text", "text": text})];
            if image {
                content
                    .push(json!({"type": "input_image", "image_url": data_url, "detail": "auto"}));
            }
            json!({"type": "message", "role": "user", "content": content})
        }
        Dialect::Chat if image => json!({"role": "user", "content": [
            {"type": "text", "text": text},
            {"type": "image_url", "image_url": {"url": data_url}}]}),
        Dialect::Chat => json!({"role": "user", "content": text}),
    }
}

/// The request for the conversation so far: the system prompt, the history, tools in the tool
/// cells, thinking asked for in the thinking cell.
fn request(client: Dialect, scenario: Scenario, history: &[Value], stream: bool) -> Value {
    let thinking = scenario == Scenario::Thinking;
    let schema = json!({"type": "object", "properties": {"text": {"type": "string"}},
        "required": ["text"]});
    let tools = ["get_weather", "lookup"].map(|name| (name, format!("The {name} tool.")));
    let mut body = match client {
        Dialect::Messages => {
            let thinking = if thinking {
                json!({"type": "enabled", "budget_tokens": 2048})
            } else {
                json!({"type": "disabled"})
            };
            json!({"model": MODEL, "max_tokens": 4096, "system": SYSTEM, "messages": history,
                "thinking": thinking})
        }
        Dialect::Responses => {
            let mut body = json!({"model": MODEL, "instructions": SYSTEM, "input": history,
                "store": false});
            if thinking {
                body["reasoning"] = json!({"effort": "high"});
            }
            body
        }
        Dialect::Chat => {
            let mut messages = vec![json!({"role": "system", "content": SYSTEM})];
            messages.extend_from_slice(history);
            let mut body = json!({"model": MODEL, "messages": messages});
            if thinking {
                body["reasoning_effort"] = json!("high");
            }
            if stream {
                body["stream_options"] = json!({"include_usage": true});
            }
            body
        }
    };
    if scenario.tools() {
        body["tools"] = (tools.iter())
            .map(|(name, description)| match client {
                Dialect::Messages => {
                    json!({"name": name, "description": description, "input_schema": schema})
                }
                Dialect::Responses => json!({"type": "function", "name": name,
                    "description": description, "parameters": schema}),
                Dialect::Chat => json!({"type": "function", "function": {"name": name,
                    "description": description, "parameters": schema}}),
            })
            .collect();
    }
    if stream {
        body["stream"] = json!(true);
    }
    body
}

/// The answer as the client puts it back into the conversation.
fn replay(client: Dialect, answer: &Value) -> Vec<Value> {
    match client {
        Dialect::Messages => vec![json!({"role": "assistant", "content": answer["content"]})],
        // Stateless: every output item goes back, reasoning included, as Codex sends them.
        Dialect::Responses => answer["output"].as_array().unwrap().clone(),
        Dialect::Chat => vec![answer["choices"][0]["message"].clone()],
    }
}

/// A result for each of the answer's calls.
fn tool_results(client: Dialect, answer: &Value) -> Vec<Value> {
    let ids: Vec<&Value> = match client {
        Dialect::Messages => (answer["content"].as_array().unwrap().iter())
            .filter(|b| b["type"] == "tool_use")
            .map(|b| &b["id"])
            .collect(),
        Dialect::Responses => (answer["output"].as_array().unwrap().iter())
            .filter(|i| i["type"] == "function_call")
            .map(|i| &i["call_id"])
            .collect(),
        Dialect::Chat => (answer["choices"][0]["message"]["tool_calls"].as_array())
            .unwrap()
            .iter()
            .map(|c| &c["id"])
            .collect(),
    };
    assert!(!ids.is_empty(), "no call to answer in {answer}");
    let results = ids.iter().enumerate().map(|(i, id)| match client {
        Dialect::Messages => {
            json!({"type": "tool_result", "tool_use_id": id, "content": tool_result(i)})
        }
        Dialect::Responses => {
            json!({"type": "function_call_output", "call_id": id, "output": tool_result(i)})
        }
        Dialect::Chat => json!({"role": "tool", "tool_call_id": id, "content": tool_result(i)}),
    });
    match client {
        // One user turn holds every result.
        Dialect::Messages => vec![json!({"role": "user", "content": results.collect::<Vec<_>>()})],
        _ => results.collect(),
    }
}

/// POSTs `body`; the status and whatever body came before the end or a failure (a cut
/// passthrough stream fails the read).
async fn post(url: &str, key: &str, body: &Value, id: &str) -> (u16, Vec<u8>) {
    let mut resp = testkit::client()
        .post(url)
        .bearer_auth(key)
        .header("content-type", "application/json")
        .header("accept-encoding", "identity")
        .header("x-request-id", id)
        .body(body.to_string())
        .send()
        .await
        .unwrap();
    let status = resp.status().as_u16();
    let mut bytes = Vec::new();
    while let Ok(Some(chunk)) = resp.chunk().await {
        bytes.extend_from_slice(&chunk);
    }
    (status, bytes)
}

// --- Streams, accumulated as the SDKs do ---------------------------------------------------

/// The SSE events of a body as (event name or "", data); an event a cut left unfinished is
/// not one.
fn sse(body: &[u8]) -> Vec<(String, String)> {
    let text = String::from_utf8_lossy(body);
    let mut events = Vec::new();
    let mut rest = &*text;
    while let Some(end) = rest.find("\n\n") {
        let (mut name, mut data) = (String::new(), String::new());
        for line in rest[..end].lines() {
            if let Some(v) = line.strip_prefix("event:") {
                name = v.trim().to_string();
            } else if let Some(v) = line.strip_prefix("data:") {
                data.push_str(v.trim_start());
            }
        }
        if !data.is_empty() {
            events.push((name, data));
        }
        rest = &rest[end + 2..];
    }
    events
}

fn accumulate(client: Dialect, events: &[(String, String)]) -> (Value, End) {
    match client {
        Dialect::Messages => accumulate_messages(events),
        Dialect::Responses => accumulate_responses(events),
        Dialect::Chat => accumulate_chat(events),
    }
}

fn parse(data: &str) -> Value {
    serde_json::from_str(data).unwrap_or_else(|e| panic!("{e}: {data}"))
}

fn append(text: &mut Value, more: &Value) {
    let joined = format!(
        "{}{}",
        text.as_str().unwrap_or(""),
        more.as_str().unwrap_or("")
    );
    *text = json!(joined);
}

/// As the `anthropic` SDKs' MessageStream: the message from `message_start`, blocks by index,
/// deltas appended, a tool's JSON parsed when its block stops (kept raw in `partial_json` when
/// a cut came first), `message_delta`'s stop reason and usage counts merged in.
fn accumulate_messages(events: &[(String, String)]) -> (Value, End) {
    let mut message = Value::Null;
    // Each block's tool JSON so far; None once the block stopped.
    let mut json_of: Vec<Option<String>> = Vec::new();
    let mut end = End::Truncated;
    for (name, data) in events {
        let event = parse(data);
        assert_eq!(name, event["type"].as_str().unwrap(), "{data}");
        let index = event["index"].as_u64().unwrap_or(0) as usize;
        match name.as_str() {
            "message_start" => message = event["message"].clone(),
            "content_block_start" => {
                let content = message["content"].as_array_mut().unwrap();
                assert_eq!(index, content.len(), "blocks start in order: {data}");
                content.push(event["content_block"].clone());
                json_of.push(Some(String::new()));
            }
            "content_block_delta" => {
                let block = &mut message["content"][index];
                let delta = &event["delta"];
                match delta["type"].as_str().unwrap() {
                    "text_delta" => append(&mut block["text"], &delta["text"]),
                    "thinking_delta" => append(&mut block["thinking"], &delta["thinking"]),
                    "signature_delta" => block["signature"] = delta["signature"].clone(),
                    "input_json_delta" => {
                        let json = json_of[index].as_mut().expect("a delta after the stop");
                        json.push_str(delta["partial_json"].as_str().unwrap());
                    }
                    other => panic!("unknown delta {other}"),
                }
            }
            "content_block_stop" => {
                let json = json_of[index].take().expect("one stop per block");
                if !json.is_empty() {
                    message["content"][index]["input"] = parse(&json);
                }
            }
            "message_delta" => {
                message["stop_reason"] = event["delta"]["stop_reason"].clone();
                for (k, v) in event["usage"].as_object().unwrap() {
                    if !v.is_null() {
                        message["usage"][k] = v.clone();
                    }
                }
            }
            "message_stop" => end = End::Complete,
            "error" => end = End::Error,
            _ => {}
        }
    }
    // A tool block a cut left open has only the JSON it got (its start's `{}` is no input).
    for (i, json) in json_of.into_iter().enumerate() {
        if let Some(json) = json.filter(|_| message["content"][i]["type"] == "tool_use") {
            message["content"][i]["partial_json"] = json!(json);
        }
    }
    (message, end)
}

/// As the `openai` SDKs' ResponseStream: the response from `response.created`, items and
/// parts as added, deltas appended; the final response is `response.completed`'s, which must
/// say what the deltas said.
fn accumulate_responses(events: &[(String, String)]) -> (Value, End) {
    let mut snapshot = Value::Null;
    let mut completed = None;
    let mut end = End::Truncated;
    for (name, data) in events {
        let event = parse(data);
        assert_eq!(name, event["type"].as_str().unwrap(), "{data}");
        let at = event["output_index"].as_u64().unwrap_or(0) as usize;
        let part = event["content_index"].as_u64().unwrap_or(0) as usize;
        match name.as_str() {
            "response.created" => snapshot = event["response"].clone(),
            "response.output_item.added" => {
                let output = snapshot["output"].as_array_mut().unwrap();
                assert_eq!(at, output.len(), "items are added in order: {data}");
                output.push(event["item"].clone());
            }
            "response.content_part.added" => {
                let content = snapshot["output"][at]["content"].as_array_mut().unwrap();
                content.push(event["part"].clone());
            }
            "response.output_text.delta" | "response.reasoning_text.delta" => {
                append(
                    &mut snapshot["output"][at]["content"][part]["text"],
                    &event["delta"],
                );
            }
            "response.function_call_arguments.delta" => {
                append(&mut snapshot["output"][at]["arguments"], &event["delta"]);
            }
            "response.completed" | "response.incomplete" => {
                completed = Some(event["response"].clone());
                end = End::Complete;
            }
            "response.failed" | "error" => end = End::Error,
            _ => {}
        }
    }
    let Some(response) = completed else {
        return (snapshot, end);
    };
    assert_eq!(
        normalize(Dialect::Responses, &snapshot)["blocks"],
        normalize(Dialect::Responses, &response)["blocks"],
        "the deltas say what response.completed says"
    );
    (response, end)
}

/// As the `openai` SDKs' ChatCompletionStream: each delta's content, reasoning and tool calls
/// (by index) appended, the finish reason and the usage chunk kept; `[DONE]` ends it.
fn accumulate_chat(events: &[(String, String)]) -> (Value, End) {
    let mut message = json!({"role": "assistant", "content": null});
    let mut calls: Vec<Value> = Vec::new();
    let (mut finish, mut usage) = (Value::Null, Value::Null);
    let mut end = End::Truncated;
    for (_, data) in events {
        if data == "[DONE]" {
            end = End::Complete;
            continue;
        }
        let chunk = parse(data);
        if chunk.get("error").is_some() {
            end = End::Error;
            continue;
        }
        if chunk.get("usage").is_some_and(|u| !u.is_null()) {
            usage = chunk["usage"].clone();
        }
        for choice in chunk["choices"].as_array().unwrap() {
            let delta = &choice["delta"];
            for key in ["content", "reasoning_content"] {
                if delta[key].is_string() {
                    append(&mut message[key], &delta[key]);
                }
            }
            for call in delta["tool_calls"].as_array().into_iter().flatten() {
                let i = call["index"].as_u64().unwrap() as usize;
                if i == calls.len() {
                    calls.push(json!({"id": null, "type": "function",
                        "function": {"name": null, "arguments": ""}}));
                }
                let slot = &mut calls[i];
                for key in ["id", "type"] {
                    if call[key].is_string() {
                        slot[key] = call[key].clone();
                    }
                }
                let function = &call["function"];
                if function["name"].is_string() {
                    slot["function"]["name"] = function["name"].clone();
                }
                append(&mut slot["function"]["arguments"], &function["arguments"]);
            }
            if !choice["finish_reason"].is_null() {
                finish = choice["finish_reason"].clone();
            }
        }
    }
    if !calls.is_empty() {
        message["tool_calls"] = json!(calls);
    }
    let answer = json!({"object": "chat.completion", "usage": usage,
        "choices": [{"index": 0, "message": message, "finish_reason": finish}]});
    (answer, end)
}

// --- Normalized answers --------------------------------------------------------------------

/// Arguments as compact JSON when they parse (so key order and spacing aside), else as sent.
fn arguments(text: &str) -> Value {
    json!(serde_json::from_str::<Value>(text).map_or_else(|_| text.to_string(), |v| v.to_string()))
}

fn count(v: &Value) -> u64 {
    v.as_u64().unwrap_or(0)
}

/// What an answer says, in the client's dialect, with what legitimately differs left out:
/// `blocks` (`text`, `thinking`, `reasoning`, `tool` with name and arguments), `stop`, `usage`
/// (`prompt`, `completion` as the gateway meters them, and `reasoning` where the dialect
/// states it).
fn normalize(client: Dialect, answer: &Value) -> Value {
    let empty = Vec::new();
    match client {
        Dialect::Messages => {
            let blocks: Vec<Value> = (answer["content"].as_array().unwrap_or(&empty).iter())
                .map(|b| match b["type"].as_str().unwrap() {
                    "text" => json!({"type": "text", "text": b["text"]}),
                    "thinking" => json!({"type": "thinking", "text": b["thinking"]}),
                    "tool_use" => {
                        let args = match b["partial_json"].as_str() {
                            Some(partial) => json!(partial),
                            None => json!(b["input"].to_string()),
                        };
                        json!({"type": "tool", "name": b["name"], "arguments": args})
                    }
                    other => json!({"type": other}),
                })
                .collect();
            let u = &answer["usage"];
            let prompt = count(&u["input_tokens"])
                + count(&u["cache_creation_input_tokens"])
                + count(&u["cache_read_input_tokens"]);
            json!({"blocks": blocks, "stop": answer["stop_reason"],
                "usage": {"prompt": prompt, "completion": count(&u["output_tokens"])}})
        }
        Dialect::Responses => {
            let blocks: Vec<Value> = (answer["output"].as_array().unwrap_or(&empty).iter())
                .map(|item| match item["type"].as_str().unwrap() {
                    "message" => {
                        let parts = item["content"].as_array().unwrap_or(&empty);
                        let text: String =
                            (parts.iter()).filter_map(|p| p["text"].as_str()).collect();
                        json!({"type": "text", "text": text})
                    }
                    "function_call" => json!({"type": "tool", "name": item["name"],
                        "arguments": arguments(item["arguments"].as_str().unwrap_or(""))}),
                    other => json!({"type": other}),
                })
                .collect();
            let u = &answer["usage"];
            json!({"blocks": blocks, "stop": answer["status"], "usage": {
                "prompt": count(&u["input_tokens"]), "completion": count(&u["output_tokens"]),
                "reasoning": count(&u["output_tokens_details"]["reasoning_tokens"])}})
        }
        Dialect::Chat => {
            let choice = &answer["choices"][0];
            let message = &choice["message"];
            let mut blocks = Vec::new();
            if let Some(text) = message["content"].as_str().filter(|t| !t.is_empty()) {
                blocks.push(json!({"type": "text", "text": text}));
            }
            for call in message["tool_calls"].as_array().unwrap_or(&empty) {
                let function = &call["function"];
                blocks.push(json!({"type": "tool", "name": function["name"],
                    "arguments": arguments(function["arguments"].as_str().unwrap_or(""))}));
            }
            let u = &answer["usage"];
            json!({"blocks": blocks, "stop": choice["finish_reason"], "usage": {
                "prompt": count(&u["prompt_tokens"]), "completion": count(&u["completion_tokens"]),
                "reasoning": count(&u["completion_tokens_details"]["reasoning_tokens"]),
                "cached": count(&u["prompt_tokens_details"]["cached_tokens"])}})
        }
    }
}

// --- The table -----------------------------------------------------------------------------

/// A module per direction, a module per mode, a test per scenario:
/// `translate_conformance::<direction>::<mode>::<scenario>`.
macro_rules! conformance {
    ($($direction:ident: $client:ident => $target:ident;)*) => {$(
        mod $direction {
            use super::*;
            conformance!(@mode $client => $target, json: Json);
            conformance!(@mode $client => $target, stream: Stream);
            conformance!(@mode $client => $target, cut: Cut);
        }
    )*};
    (@mode $client:ident => $target:ident, $mode:ident: $m:ident) => {
        mod $mode {
            use super::*;
            conformance!(@cell $client => $target, $m, text: Text);
            conformance!(@cell $client => $target, $m, round_trip: RoundTrip);
            conformance!(@cell $client => $target, $m, parallel: Parallel);
            conformance!(@cell $client => $target, $m, image: Image);
            conformance!(@cell $client => $target, $m, thinking: Thinking);
        }
    };
    (@cell $client:ident => $target:ident, $m:ident, $name:ident: $scenario:ident) => {
        #[tokio::test(flavor = "multi_thread")]
        async fn $name() {
            cell(Dialect::$client, Dialect::$target, Mode::$m, Scenario::$scenario).await;
        }
    };
}

conformance! {
    messages_chat: Messages => Chat;
    responses_chat: Responses => Chat;
    chat_responses: Chat => Responses;
}
