// The dialect bridge through the official Node SDKs (issue 32), in front of the fake upstream's
// demo model (`Echo: <last user text>` after the reasoning `Thinking about it.`; with function
// tools it calls the first, or the first two when the user's text says `parallel`, arguments
// {"text": "<last user text>"}, ids call_<n>, and after a tool's result answers
// `Echo: <the result>`; testkit/src/upstream/model/tools.rs). Run once by tests/sdk/run.py,
// whose config has tests/sdk/bridge.py's services:
//   bridge        translate = { messages = "chat" }: @anthropic-ai/sdk's Messages
//   bridge_codex  translate = { responses = "chat" }: openai's Responses
//   bridge_gpt    translate = { chat = "responses" }: openai's chat completions
// with PORTCULLIS_URL (the gateway), PORTCULLIS_CLI and PORTCULLIS_CONFIG (its key is made here).
// Each group: a whole tool turn (the call, its result sent back with the whole conversation,
// the echo) and the SDK's stream helper accumulating the same answer as the JSON one.
import assert from 'node:assert/strict';
import { execFileSync } from 'node:child_process';
import { test } from 'node:test';

import Anthropic from '@anthropic-ai/sdk';
import OpenAI from 'openai';

const GATEWAY = process.env.PORTCULLIS_URL;
const CLI = process.env.PORTCULLIS_CLI;
const CONFIG = process.env.PORTCULLIS_CONFIG;
if (!GATEWAY || !CLI || !CONFIG) throw new Error('set PORTCULLIS_URL, PORTCULLIS_CLI and PORTCULLIS_CONFIG');

const REASONING = 'Thinking about it.';
const fragments = (text) => text.match(/\S+\s*/g) ?? (text ? [text] : []);
const n = (text) => fragments(text).length;
// The demo model's arguments for a call on `text`, as its JSON writer spells them.
const args = (text) => JSON.stringify({ text });

const KEY = execFileSync(CLI, ['keys', 'create', '--config', CONFIG, '--name', 'sdk-node-bridge',
  '--scopes', 'bridge,bridge_codex,bridge_gpt'], { encoding: 'utf8' }).trim().split('\n').at(-1);

// The same two tools in each dialect (strict, as the openai SDK's helpers parse only those).
const SCHEMA = { type: 'object', properties: { text: { type: 'string' } }, required: ['text'], additionalProperties: false };
const NAMES = ['lookup', 'fetch'];
const MESSAGES_TOOLS = NAMES.map((name) => ({ name, description: `Finds a text (${name}).`, input_schema: SCHEMA }));
const RESPONSES_TOOLS = NAMES.map((name) => ({ type: 'function', name, description: `Finds a text (${name}).`,
  parameters: SCHEMA, strict: true }));
const CHAT_TOOLS = RESPONSES_TOOLS.map(({ type, ...fn }) => ({ type, function: fn }));

const claude = () => new Anthropic({ baseURL: `${GATEWAY}/v1/bridge`, authToken: KEY, apiKey: null, maxRetries: 0, timeout: 20_000 });
// The openai SDK keeps only the body's `error` member (interface.md pins a flat {"error",
// "message"}), so its fetch records the last error body too.
const lastBody = {};
const openai = (service) => new OpenAI({ baseURL: `${GATEWAY}/v1/${service}/v1`, apiKey: KEY, maxRetries: 0, timeout: 20_000,
  fetch: async (url, init) => {
    const resp = await fetch(url, init);
    if (!resp.ok) lastBody.json = await resp.clone().json();
    return resp;
  } });

// ---- messages = "chat" ------------------------------------------------------------------------

const messagesTurn = (text, more = {}) => ({ model: 'demo-bridge', max_tokens: 2048, system: 'be brief',
  tools: MESSAGES_TOOLS, messages: [{ role: 'user', content: text }], ...more });
const withoutSignature = (blocks) => blocks.map(({ signature, ...b }) => b);

test('anthropic messages.create with tools: tool_use (input, stop_reason tool_use), then tool_result gets the echo', { timeout: 30_000 }, async () => {
  const text = 'node looks the bridge up';
  const request = messagesTurn(text);
  const first = await claude().messages.create(request);
  assert.deepEqual(first.content.map((b) => b.type), ['thinking', 'tool_use']);
  assert.equal(first.content[0].thinking, REASONING);
  const use = first.content[1];
  assert.deepEqual([use.id, use.name, use.input], ['call_0', 'lookup', { text }]);
  assert.equal(first.stop_reason, 'tool_use');
  assert.deepEqual([first.usage.input_tokens, first.usage.output_tokens], [n('be brief') + n(text), n(args(text)) + n(REASONING)]);
  const second = await claude().messages.create({ ...request, messages: [...request.messages,
    { role: 'assistant', content: first.content },
    { role: 'user', content: [{ type: 'tool_result', tool_use_id: use.id, content: 'node found it' }] }] });
  assert.deepEqual(second.content.map((b) => b.type), ['thinking', 'text']);
  assert.deepEqual([second.content[1].text, second.stop_reason], ['Echo: node found it', 'end_turn']);
});

test('anthropic messages.create: parallel calls are two tool_use blocks; thinking disabled leaves only them', { timeout: 30_000 }, async () => {
  const text = 'node looks both up in parallel';
  const m = await claude().messages.create(messagesTurn(text, { thinking: { type: 'disabled' } }));
  assert.deepEqual(m.content, [
    { type: 'tool_use', id: 'call_0', name: 'lookup', input: { text } },
    { type: 'tool_use', id: 'call_1', name: 'fetch', input: { text } },
  ]);
  assert.equal(m.stop_reason, 'tool_use');
  const on = await claude().messages.create(messagesTurn(text, { thinking: { type: 'enabled', budget_tokens: 1024 } }));
  assert.deepEqual(on.content.map((b) => b.type), ['thinking', 'tool_use', 'tool_use']);
});

test('anthropic messages.stream(...).finalMessage() with tools equals the JSON answer; inputJson gives each input', { timeout: 30_000 }, async () => {
  const request = messagesTurn('node streams two lookups in parallel');
  const whole = await claude().messages.create(request);
  const partial = {};
  const snapshots = [];
  const stream = claude().messages.stream(request);
  stream.on('streamEvent', (e) => {
    if (e.type === 'content_block_delta' && e.delta.type === 'input_json_delta') {
      partial[e.index] = (partial[e.index] ?? '') + e.delta.partial_json;
    }
  });
  stream.on('inputJson', (_, snapshot) => snapshots.push(snapshot));
  const final = await stream.finalMessage();
  assert.deepEqual(withoutSignature(final.content), withoutSignature(whole.content));
  assert.equal(final.stop_reason, whole.stop_reason);
  const inputs = Object.fromEntries(whole.content.flatMap((b, i) => (b.type === 'tool_use' ? [[i, b.input]] : [])));
  assert.equal(Object.keys(inputs).length, 2);
  assert.deepEqual(Object.fromEntries(Object.entries(partial).map(([i, p]) => [i, JSON.parse(p)])), inputs,
    'input_json_delta pieces joined, per block');
  assert.deepEqual(snapshots.at(-1), Object.values(inputs).at(-1), 'the last inputJson snapshot');
  assert.deepEqual([final.usage.input_tokens, final.usage.output_tokens], [whole.usage.input_tokens, whole.usage.output_tokens]);
  assert.ok(final.usage.output_tokens > 0);
});

// ---- responses = "chat" -----------------------------------------------------------------------

const responsesTurn = (text) => ({ model: 'demo-codex', instructions: 'be brief', tools: RESPONSES_TOOLS,
  input: [{ role: 'user', content: text }] });
// The whole conversation again: the request's input, the output items, the call's output.
const resent = (request, output, result) => ({ ...request, input: [...request.input, ...output,
  { type: 'function_call_output', call_id: output.find((o) => o.type === 'function_call').call_id, output: result }] });
// What a Responses answer says, its ids aside.
const responseSummary = (r) => ({
  output: r.output.map((o) => (o.type === 'function_call' ? [o.type, o.call_id, o.name, o.arguments, o.status]
    : o.type === 'message' ? [o.type, o.role, o.content.map((c) => [c.type, c.text]), o.status] : [o.type])),
  status: r.status, usage: r.usage,
});

test('openai responses.create with tools: a function_call item, then the conversation with function_call_output gets the echo', { timeout: 30_000 }, async () => {
  const text = 'node finds the codex';
  const request = responsesTurn(text);
  const first = await openai('bridge_codex').responses.create(request);
  assert.deepEqual(first.output.map((o) => o.type), ['reasoning', 'function_call']);
  const call = first.output[1];
  assert.deepEqual([call.call_id, call.name, JSON.parse(call.arguments)], ['call_0', 'lookup', { text }]);
  assert.equal(first.status, 'completed');
  assert.deepEqual([first.usage.input_tokens, first.usage.output_tokens, first.usage.output_tokens_details.reasoning_tokens],
    [n('be brief') + n(text), n(args(text)) + n(REASONING), n(REASONING)]);
  const second = await openai('bridge_codex').responses.create(resent(request, first.output, 'node found the codex'));
  assert.equal(second.output_text, 'Echo: node found the codex');
  assert.deepEqual(second.output.map((o) => o.type), ['reasoning', 'message']);
});

test('openai responses.stream(...).finalResponse() equals the JSON answer, for the call and for the echo', { timeout: 30_000 }, async () => {
  const text = 'node streams the codex';
  const request = responsesTurn(text);
  const client = openai('bridge_codex');
  const whole = await client.responses.create(request);
  const deltas = [];
  let snapshot;
  const stream = client.responses.stream(request);
  stream.on('response.function_call_arguments.delta', (e) => { deltas.push(e.delta); snapshot = e.snapshot; });
  assert.deepEqual(responseSummary(await stream.finalResponse()), responseSummary(whole));
  assert.deepEqual([deltas.join(''), snapshot], [args(text), args(text)], 'arguments deltas joined, the last snapshot');
  const answer = resent(request, whole.output, 'node streamed result');
  const wholeAnswer = await client.responses.create(answer);
  const final = await client.responses.stream(answer).finalResponse();
  assert.deepEqual(responseSummary(final), responseSummary(wholeAnswer));
  assert.equal(final.output_text, 'Echo: node streamed result');
});

test('openai responses.create with previous_response_id rejects with BadRequestError naming it', { timeout: 30_000 }, async () => {
  await assert.rejects(openai('bridge_codex').responses.create({ model: 'demo-codex', input: 'again', previous_response_id: 'resp_earlier' }),
    (err) => {
      assert.ok(err instanceof OpenAI.BadRequestError, `${err?.constructor?.name}: ${err}`);
      assert.equal(err.status, 400);
      assert.equal(lastBody.json.error, 'bad_request');
      assert.match(lastBody.json.message, /previous_response_id/);
      return true;
    });
});

// ---- chat = "responses" -----------------------------------------------------------------------

const chatTurn = (text) => ({ model: 'demo-gpt', tools: CHAT_TOOLS, messages: [{ role: 'user', content: text }] });
const callsOf = (message) => (message.tool_calls ?? []).map((c) => [c.id, c.type, c.function.name, c.function.arguments]);

test('openai chat.completions.create with tools: tool_calls, finish_reason tool_calls, then a tool message gets the echo', { timeout: 30_000 }, async () => {
  const text = 'node asks the responses server';
  const request = chatTurn(text);
  const first = await openai('bridge_gpt').chat.completions.create(request);
  const { message, finish_reason } = first.choices[0];
  assert.deepEqual(callsOf(message), [['call_0', 'function', 'lookup', args(text)]]);
  assert.deepEqual([finish_reason, message.content], ['tool_calls', null]);
  assert.deepEqual([first.usage.prompt_tokens, first.usage.completion_tokens], [n(text), n(args(text)) + n(REASONING)]);
  const second = await openai('bridge_gpt').chat.completions.create({ ...request, messages: [...request.messages, message,
    { role: 'tool', tool_call_id: 'call_0', content: 'node got it' }] });
  assert.deepEqual([second.choices[0].message.content, second.choices[0].finish_reason], ['Echo: node got it', 'stop']);
});

test('openai chat.completions.stream(...).finalChatCompletion() with tools equals the JSON answer, usage included', { timeout: 30_000 }, async () => {
  const text = 'node streams both in parallel';
  const client = openai('bridge_gpt');
  const whole = await client.chat.completions.create(chatTurn(text));
  const done = [];
  const stream = client.chat.completions.stream({ ...chatTurn(text), stream_options: { include_usage: true } });
  stream.on('tool_calls.function.arguments.done', (e) => done.push([e.name, e.arguments, e.parsed_arguments]));
  const final = await stream.finalChatCompletion();
  assert.deepEqual(callsOf(final.choices[0].message), callsOf(whole.choices[0].message));
  assert.equal(callsOf(final.choices[0].message).length, 2, 'parallel calls');
  assert.equal(final.choices[0].finish_reason, 'tool_calls');
  assert.deepEqual(done, NAMES.map((name) => [name, args(text), { text }]), 'arguments.done events');
  assert.ok(final.usage, 'usage with stream_options.include_usage');
  assert.deepEqual(final.usage, whole.usage, "the stream's usage and the JSON answer's");
});
