//! What the demo model writes: chat completions (a reasoning phase, then an echo) and text
//! completions (an echo of the prompt), as JSON or as the chunks of a stream. Usage follows
//! OpenAI: `completion_tokens_details.reasoning_tokens` when the model reasoned, and with
//! `stream_options.include_usage` a `"usage":null` on every chunk and a last, usage-only chunk
//! (`choices: []`); without it no chunk has a `usage` member.

use std::sync::atomic::Ordering;
use std::time::{SystemTime, UNIX_EPOCH};

use serde_json::{json, Map, Value};

use super::python::{is_space, py_int, py_str, py_truthy};
use super::{check, tools};
use super::{received_model, Answer, Model, Refusal, REASONING};

impl Model {
    /// `PREFIX-demo-N`, N counting the model's answers from 1.
    pub(super) fn next_id(&self, prefix: &str) -> String {
        format!(
            "{prefix}-demo-{}",
            self.ids.fetch_add(1, Ordering::Relaxed) + 1
        )
    }
}

pub(super) fn now() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

/// The usage object: reasoning tokens count as completion tokens and are also stated apart.
fn usage(prompt: usize, answer: usize, reasoning: usize) -> Value {
    let completion = answer + reasoning;
    let mut usage = json!({"prompt_tokens": prompt, "completion_tokens": completion,
        "total_tokens": prompt + completion});
    if reasoning > 0 {
        usage["completion_tokens_details"] = json!({"reasoning_tokens": reasoning});
    }
    usage
}

/// A stream's chunks as OpenAI sends them for the request's `stream_options`: with
/// `include_usage: true`, `"usage": null` on each and a last chunk with `choices: []` and the
/// usage; otherwise unchanged.
fn with_usage(mut chunks: Vec<Value>, body: &Map<String, Value>, usage: Value) -> Vec<Value> {
    let include = matches!(body.get("stream_options"),
        Some(Value::Object(o)) if o.get("include_usage") == Some(&Value::Bool(true)));
    let Some(last) = chunks.last().filter(|_| include).cloned() else {
        return chunks;
    };
    for chunk in &mut chunks {
        chunk["usage"] = Value::Null;
    }
    let mut final_chunk = json!({"choices": [], "usage": usage});
    for key in ["id", "object", "created", "model"] {
        final_chunk[key] = last[key].clone();
    }
    chunks.push(final_chunk);
    chunks
}

pub(super) fn chat(body: &Map<String, Value>, model: &Model) -> Result<Answer, Refusal> {
    let names = check::chat(body)?;
    let Some(Value::Array(messages)) = body.get("messages") else {
        return Err(Refusal::Bad(
            "'messages' must be an array of message objects",
        ));
    };
    let texts: Vec<String> = messages
        .iter()
        .map(|m| content_text(m.get("content")))
        .collect();
    let calls = tools::chat_calls(body, &names, messages, &texts);
    let answer_text = format!("Echo: {}", tools::chat_echoed(messages, &texts));
    let mut answer = fragments(&answer_text);
    let mut finish = "stop";
    if let Some(max) = py_int(body.get("max_tokens")) {
        if 0 < max && (max as u64) < answer.len() as u64 {
            answer.truncate(max as usize);
            finish = "length";
        }
    }
    // Reasoning is on unless the client explicitly sets enable_thinking=false.
    let thinking = !matches!(body.get("chat_template_kwargs"),
        Some(Value::Object(k)) if k.get("enable_thinking") == Some(&Value::Bool(false)));
    let reasoning = if thinking {
        fragments(REASONING)
    } else {
        Vec::new()
    };
    let prompt = texts
        .iter()
        .map(|t| fragments(t).len())
        .sum::<usize>()
        .max(1);
    let answer_tokens = if calls.is_empty() {
        answer.len()
    } else {
        finish = "tool_calls";
        tools::tokens(&calls)
    };
    let usage = usage(prompt, answer_tokens, reasoning.len());
    let (id, created) = (model.next_id("chatcmpl"), now());
    let model_name = received_model(body);

    if !py_truthy(body.get("stream")) {
        let mut message = if calls.is_empty() {
            json!({"role": "assistant", "content": answer.concat()})
        } else {
            json!({"role": "assistant", "content": null,
                "tool_calls": tools::chat_tool_calls(&calls)})
        };
        if thinking {
            message["reasoning_content"] = json!(REASONING);
        }
        return Ok(Answer::Json(json!({"id": id, "object": "chat.completion",
            "created": created, "model": model_name, "usage": usage,
            "choices": [{"index": 0, "finish_reason": finish, "message": message}]})));
    }
    let chunk = |delta: Value, finish: Option<&str>| {
        json!({"id": id, "object": "chat.completion.chunk", "created": created,
            "model": model_name,
            "choices": [{"index": 0, "delta": delta, "finish_reason": finish}]})
    };
    // The first chunk as vLLM sends it, calls or not.
    let mut chunks = vec![chunk(json!({"role": "assistant", "content": ""}), None)];
    chunks.extend(
        reasoning
            .iter()
            .map(|f| chunk(json!({"reasoning_content": f}), None)),
    );
    if calls.is_empty() {
        chunks.extend(answer.iter().map(|f| chunk(json!({"content": f}), None)));
    } else {
        chunks.extend(
            tools::chat_deltas(&calls)
                .into_iter()
                .map(|d| chunk(d, None)),
        );
    }
    chunks.push(chunk(json!({}), Some(finish)));
    Ok(Answer::Stream(with_usage(chunks, body, usage)))
}

/// Text completions: `Echo: <prompt>` for each prompt (a string, or an array of strings, one
/// choice each), cut by `max_tokens`; streamed one fragment per chunk, then a chunk with the
/// choice's `finish_reason`.
pub(super) fn completions(body: &Map<String, Value>, model: &Model) -> Result<Answer, Refusal> {
    let bad = Refusal::Bad("'prompt' must be a string or a non-empty array of strings");
    let prompts: Vec<&str> = match body.get("prompt") {
        Some(Value::String(p)) => vec![p.as_str()],
        Some(Value::Array(items)) if !items.is_empty() => items
            .iter()
            .map(Value::as_str)
            .collect::<Option<_>>()
            .ok_or(bad)?,
        _ => return Err(bad),
    };
    let max = py_int(body.get("max_tokens")).filter(|m| *m > 0);
    let texts: Vec<String> = prompts.iter().map(|p| format!("Echo: {p}")).collect();
    let answers: Vec<(Vec<&str>, &str)> = texts
        .iter()
        .map(|text| {
            let mut answer = fragments(text);
            match max {
                Some(m) if (m as u64) < answer.len() as u64 => {
                    answer.truncate(m as usize);
                    (answer, "length")
                }
                _ => (answer, "stop"),
            }
        })
        .collect();
    let prompt_tokens = prompts
        .iter()
        .map(|p| fragments(p).len())
        .sum::<usize>()
        .max(1);
    let answer_tokens = answers.iter().map(|(a, _)| a.len()).sum();
    let usage = usage(prompt_tokens, answer_tokens, 0);
    let (id, created) = (model.next_id("cmpl"), now());
    let model_name = received_model(body);
    let choice = |index: usize, text: &str, finish: Option<&str>| json!({"index": index, "text": text, "logprobs": null, "finish_reason": finish});
    let object = |choices: Vec<Value>| {
        json!({"id": id, "object": "text_completion", "created": created,
            "model": model_name, "choices": choices})
    };
    if !py_truthy(body.get("stream")) {
        let choices = answers
            .iter()
            .enumerate()
            .map(|(i, (a, finish))| choice(i, &a.concat(), Some(finish)))
            .collect();
        let mut answer = object(choices);
        answer["usage"] = usage;
        return Ok(Answer::Json(answer));
    }
    let mut chunks = Vec::new();
    for (i, (answer, finish)) in answers.iter().enumerate() {
        chunks.extend(answer.iter().map(|f| object(vec![choice(i, f, None)])));
        chunks.push(object(vec![choice(i, "", Some(finish))]));
    }
    Ok(Answer::Stream(with_usage(chunks, body, usage)))
}

/// Word-ish pieces that keep their trailing spaces (the regex `\S+\s*`, so leading spaces are
/// dropped); text of spaces only is one fragment, empty text none.
pub(super) fn fragments(text: &str) -> Vec<&str> {
    let mut out = Vec::new();
    let mut rest = text.trim_start_matches(is_space);
    while !rest.is_empty() {
        let word = rest.find(is_space).unwrap_or(rest.len());
        let next = rest[word..].trim_start_matches(is_space);
        out.push(&rest[..rest.len() - next.len()]);
        rest = next;
    }
    if out.is_empty() && !text.is_empty() {
        out.push(text);
    }
    out
}

/// A message's text: a string, or its parts joined (parts as `check.rs` let them through).
pub(super) fn content_text(content: Option<&Value>) -> String {
    match content {
        Some(Value::String(s)) => s.clone(),
        Some(Value::Array(parts)) => parts.iter().map(part_text).collect(),
        _ => String::new(),
    }
}

fn part_text(part: &Value) -> String {
    match part.get("type").and_then(Value::as_str) {
        Some("text") => part.get("text").map_or(String::new(), py_str),
        Some("image_url") => {
            let url = part
                .get("image_url")
                .and_then(|image| image.get("url")?.as_str())
                .unwrap_or("");
            image_text(url)
        }
        _ => String::new(),
    }
}

/// How the model reads an image at `url`: ` [image:<media type>]` for a data: URL, which names
/// it (up to the first `;` or `,`), ` [image:url]` for any other.
pub(super) fn image_text(url: &str) -> String {
    let media = url
        .strip_prefix("data:")
        .map(|rest| &rest[..rest.find([';', ',']).unwrap_or(rest.len())])
        .filter(|m| !m.is_empty());
    format!(" [image:{}]", media.unwrap_or("url"))
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    fn run(f: fn(&Map<String, Value>, &Model) -> Result<Answer, Refusal>, body: Value) -> Answer {
        let model = Model::new(Duration::ZERO);
        match f(body.as_object().unwrap(), &model) {
            Ok(answer) => answer,
            Err(_) => panic!("refused {body}"),
        }
    }

    fn chunks(answer: Answer) -> Vec<Value> {
        match answer {
            Answer::Stream(chunks) => chunks,
            _ => panic!("not a chat stream"),
        }
    }

    #[test]
    fn chat_streams_follow_include_usage_as_openai_does() {
        let msgs = json!([{"role": "user", "content": "count me"}]);
        let with = chunks(run(
            chat,
            json!({"model": "m", "messages": msgs, "stream": true,
                "stream_options": {"include_usage": true}}),
        ));
        let (last, content) = with.split_last().unwrap();
        assert!(content.iter().all(|c| c.get("usage") == Some(&Value::Null)));
        assert_eq!(last["choices"], json!([]));
        // Prompt: 2 fragments; answer "Echo: count me" 3 and reasoning "Thinking about it." 3.
        assert_eq!(
            last["usage"],
            json!({"prompt_tokens": 2, "completion_tokens": 6, "total_tokens": 8,
                "completion_tokens_details": {"reasoning_tokens": 3}})
        );
        assert_eq!(
            (last["id"].clone(), last["model"].clone()),
            (content[0]["id"].clone(), json!("m"))
        );
        for options in [json!(null), json!({"include_usage": false}), json!({})] {
            let without = chunks(run(
                chat,
                json!({"messages": msgs, "stream": true, "stream_options": options}),
            ));
            assert!(without
                .iter()
                .all(|c| c.get("usage").is_none() && c["choices"][0].is_object()));
        }
    }

    #[test]
    fn reasoning_tokens_are_reported_only_when_the_model_thinks() {
        let msgs = json!([{"role": "user", "content": "hi"}]);
        let Answer::Json(on) = run(chat, json!({"messages": msgs})) else {
            panic!()
        };
        assert_eq!(
            on["usage"]["completion_tokens_details"],
            json!({"reasoning_tokens": 3})
        );
        let off = json!({"messages": msgs, "chat_template_kwargs": {"enable_thinking": false}});
        let Answer::Json(off) = run(chat, off) else {
            panic!()
        };
        assert!(off["usage"].get("completion_tokens_details").is_none());
        assert_eq!(off["usage"]["completion_tokens"], 2);
    }

    #[test]
    fn text_completions_echo_the_prompt_in_json_and_streams() {
        let Answer::Json(v) = run(completions, json!({"model": "m", "prompt": "say  hi"})) else {
            panic!()
        };
        assert_eq!(v["object"], "text_completion");
        assert_eq!(
            v["choices"],
            json!([{"index": 0, "text": "Echo: say  hi", "logprobs": null,
            "finish_reason": "stop"}])
        );
        assert_eq!(
            v["usage"],
            json!({"prompt_tokens": 2, "completion_tokens": 3, "total_tokens": 5})
        );
        let streamed = chunks(run(
            completions,
            json!({"prompt": ["a b", "c"], "stream": true, "max_tokens": 2,
                "stream_options": {"include_usage": true}}),
        ));
        let texts: Vec<(u64, String)> = streamed
            .iter()
            .filter_map(|c| {
                Some((
                    c["choices"][0]["index"].as_u64()?,
                    c["choices"][0]["text"].as_str()?.into(),
                ))
            })
            .collect();
        let want = [
            (0, "Echo: "),
            (0, "a "),
            (0, ""),
            (1, "Echo: "),
            (1, "c"),
            (1, ""),
        ];
        assert_eq!(texts, want.map(|(i, t)| (i, t.to_string())));
        let last = streamed.last().unwrap();
        assert_eq!(last["usage"]["completion_tokens"], 4);
        assert_eq!(streamed[2]["choices"][0]["finish_reason"], "length");
        assert!(matches!(
            completions(
                json!({"prompt": 5}).as_object().unwrap(),
                &Model::new(Duration::ZERO)
            ),
            Err(Refusal::Bad(_))
        ));
    }
}
