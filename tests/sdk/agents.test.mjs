// The agent APIs through the official Node SDKs (issue 23): openai's `responses.create` (plain
// and streamed) on chatx, an `api = "openai"` service, and @anthropic-ai/sdk's
// `messages.create` (plain and streamed, `authToken`: Bearer, as Claude Code sends it) and
// `messages.countTokens` on claude, an `api = "anthropic"` service. Run once by
// tests/sdk/run.py (its config: chatx default x-large-2, aliases large and small; claude's
// policy in tests/sdk/agents.py), with
//   PORTCULLIS_URL                     the gateway
//   PORTCULLIS_CLI, PORTCULLIS_CONFIG  the gateway binary and its config: keys and the ledger
// Each request checks the demo model's answer (testkit/src/upstream/model/agents.rs), the model
// the upstream received, and that the usage ledger grew by the usage the upstream stated.
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

const createKey = (name, ...flags) => execFileSync(CLI, ['keys', 'create', '--config', CONFIG, '--name', name,
  '--scopes', 'chatx,claude', ...flags], { encoding: 'utf8' }).trim().split('\n').at(-1);
const KEY = createKey('sdk-node-agents');
const KEY_ID = /^ak_([0-9a-f]{16})\./.exec(KEY)[1];

// The openai SDK keeps only the body's `error` member (our code: interface.md pins a flat
// {"error", "message"}, not OpenAI's nested object), so its fetch records the last body too.
const lastBody = {};
const openai = (apiKey = KEY) => new OpenAI({ baseURL: `${GATEWAY}/v1/chatx/v1`, apiKey, maxRetries: 0, timeout: 20_000,
  fetch: async (url, init) => {
    const resp = await fetch(url, init);
    if (!resp.ok) lastBody.json = await resp.clone().json();
    return resp;
  } });
// authToken sends Authorization: Bearer; apiKey: null keeps x-api-key out of it.
const claude = (authToken = KEY) => new Anthropic({ baseURL: `${GATEWAY}/v1/claude`, authToken, apiKey: null, maxRetries: 0, timeout: 20_000 });

// The ledger row of this key for (service, model), as `portcullis usage` prints it.
const COLUMNS = ['REQUESTS', 'PROMPT', 'COMPLETION', 'REASONING', 'CACHED'];
function ledgerRow(service, model) {
  const out = execFileSync(CLI, ['usage', '--config', CONFIG, '--group-by', 'key,service,model'], { encoding: 'utf8' });
  const [head, ...lines] = out.trim().split('\n');
  const names = head.replace('KEY ID', 'KEY_ID').split(/\s+/);
  for (const line of lines) {
    const row = Object.fromEntries(line.split(/\s+/).map((v, i) => [names[i], v]));
    if (row.KEY_ID === KEY_ID && row.SERVICE === service && row.MODEL === model) {
      return Object.fromEntries(COLUMNS.map((c) => [c, Number(row[c])]));
    }
  }
  return Object.fromEntries(COLUMNS.map((c) => [c, 0]));
}

async function expectLedgerAdded(service, model, before, want) {
  const expected = { REQUESTS: 1, ...want };
  let delta;
  for (let waited = 0; waited <= 10_000; waited += 200) { // written every flush_seconds (1 s)
    const now = ledgerRow(service, model);
    delta = Object.fromEntries(COLUMNS.map((c) => [c, now[c] - before[c]]));
    if (COLUMNS.every((c) => delta[c] === expected[c])) break;
    await new Promise((r) => setTimeout(r, 200));
  }
  assert.deepEqual(delta, expected, `ledger row (${service}, ${model}) increase`);
}

const responsesUsage = (u) => ({ PROMPT: u.input_tokens, COMPLETION: u.output_tokens,
  REASONING: u.output_tokens_details.reasoning_tokens, CACHED: u.input_tokens_details.cached_tokens });

const GATEWAY_400 = (message) => ({ error: 'bad_request', message });
const openaiBadRequest = (message) => (err) => {
  assert.ok(err instanceof OpenAI.BadRequestError, `${err?.constructor?.name}: ${err}`);
  assert.equal(err.status, 400);
  assert.equal(err.error, 'bad_request', "the SDK's err.error: the body's error member");
  assert.deepEqual(lastBody.json, GATEWAY_400(message), 'the body the SDK read');
  return true;
};
// Anthropic's SDK keeps the whole body and takes its `message` for the error's text.
const anthropicBadRequest = (message) => (err) => {
  assert.ok(err instanceof Anthropic.BadRequestError, `${err?.constructor?.name}: ${err}`);
  assert.equal(err.status, 400);
  assert.deepEqual(err.error, GATEWAY_400(message));
  assert.equal(err.message, `400 ${message}`);
  return true;
};

test('openai responses.create: a model omitted gets the default; text, usage and ledger as stated', { timeout: 30_000 }, async () => {
  const before = ledgerRow('chatx', 'x-large-2');
  const input = 'node responses plain';
  const r = await openai().responses.create({ input, instructions: 'Be short.' });
  assert.equal(r.output_text, `Echo: ${input}`);
  assert.equal(r.model, 'x-large-2');
  const want = { PROMPT: n('Be short.') + n(input), COMPLETION: n(`Echo: ${input}`) + n(REASONING),
    REASONING: n(REASONING), CACHED: n('Be short.') };
  assert.deepEqual(responsesUsage(r.usage), want);
  await expectLedgerAdded('chatx', 'x-large-2', before, want);
});

test("openai responses.create stream: model 'large' replaced; events unchanged, usage and ledger as stated", { timeout: 30_000 }, async () => {
  const before = ledgerRow('chatx', 'x-large-2');
  const input = 'node responses streamed';
  const stream = await openai().responses.create({ model: 'large', input, stream: true });
  const events = [];
  for await (const e of stream) events.push(e);
  assert.equal(events[0].type, 'response.created');
  assert.deepEqual(events.map((e) => e.sequence_number), events.map((_, i) => i));
  const deltas = events.filter((e) => e.type === 'response.output_text.delta').map((e) => e.delta);
  assert.deepEqual(deltas, fragments(`Echo: ${input}`));
  const done = events.at(-1);
  assert.equal(done.type, 'response.completed');
  assert.equal(done.response.model, 'x-large-2');
  const want = { PROMPT: n(input), COMPLETION: deltas.length + n(REASONING), REASONING: n(REASONING), CACHED: 0 };
  assert.deepEqual(responsesUsage(done.response.usage), want);
  await expectLedgerAdded('chatx', 'x-large-2', before, want);
});

test('openai responses.create with input 5 rejects with BadRequestError carrying the gateway message', { timeout: 30_000 }, async () => {
  await assert.rejects(openai().responses.create({ model: 'large', input: 5 }),
    openaiBadRequest('input must be a string or an array'));
});

test('anthropic messages.create (authToken): alias replaced; text, cache usage and ledger as stated', { timeout: 30_000 }, async () => {
  const before = ledgerRow('claude', 'demo-sonnet');
  const m = await claude().messages.create({ model: 'claude-sonnet-4-5', max_tokens: 64, system: 'Be exact.',
    messages: [{ role: 'user', content: 'node messages plain' }] });
  assert.deepEqual(m.content, [{ type: 'text', text: 'Echo: node messages plain' }]);
  assert.equal(m.model, 'demo-sonnet');
  const u = m.usage;
  assert.deepEqual([u.input_tokens, u.cache_creation_input_tokens, u.cache_read_input_tokens, u.output_tokens], [3, 0, 2, 4]);
  await expectLedgerAdded('claude', 'demo-sonnet', before, { PROMPT: 5, COMPLETION: 4, REASONING: 0, CACHED: 2 });
});

test('anthropic messages.create stream: events unchanged, usage from message_start and message_delta in the ledger', { timeout: 30_000 }, async () => {
  const before = ledgerRow('claude', 'demo-haiku');
  const content = 'node messages streamed here';
  const stream = await claude().messages.create({ model: 'claude-haiku-4-5', max_tokens: 64, stream: true,
    messages: [{ role: 'user', content }] });
  const events = [];
  for await (const e of stream) events.push(e);
  assert.deepEqual([events[0].type, events.at(-2).type, events.at(-1).type], ['message_start', 'message_delta', 'message_stop']);
  assert.equal(events[0].message.model, 'demo-haiku');
  assert.equal(events[0].message.usage.output_tokens, 1);
  const deltas = events.filter((e) => e.type === 'content_block_delta').map((e) => e.delta.text);
  assert.deepEqual(deltas, fragments(`Echo: ${content}`));
  assert.equal(events.at(-2).usage.output_tokens, deltas.length);
  await expectLedgerAdded('claude', 'demo-haiku', before, { PROMPT: n(content), COMPLETION: deltas.length, REASONING: 0, CACHED: 0 });
});

test('anthropic messages.stream() accumulates the final message; a model omitted gets the default', { timeout: 30_000 }, async () => {
  const final = await claude().messages.stream({ max_tokens: 64, messages: [{ role: 'user', content: 'node helper' }] }).finalMessage();
  assert.equal(final.content[0].text, 'Echo: node helper');
  assert.equal(final.model, 'demo-claude-default');
  assert.deepEqual([final.usage.input_tokens, final.usage.output_tokens], [2, 3]);
});

test('anthropic messages.countTokens: alias replaced; a request without tokens in the ledger', { timeout: 30_000 }, async () => {
  const before = ledgerRow('claude', 'demo-haiku');
  const { data, response } = await claude().messages.countTokens({ model: 'claude-haiku-4-5',
    messages: [{ role: 'user', content: 'one two three' }] }).withResponse();
  assert.deepEqual(data, { input_tokens: 3 });
  assert.equal(response.headers.get('x-demo-model'), 'demo-haiku');
  await expectLedgerAdded('claude', 'demo-haiku', before, { PROMPT: 0, COMPLETION: 0, REASONING: 0, CACHED: 0 });
});

test('anthropic malformed bodies reject with BadRequestError carrying the gateway message', { timeout: 30_000 }, async () => {
  await assert.rejects(claude().messages.create({ model: 'claude-sonnet-4-5', max_tokens: 8,
    messages: [{ role: 'user', content: [{ type: 'text', text: 'a' }, 'b'] }] }),
  anthropicBadRequest('messages[0].content[1] must be an object'));
  await assert.rejects(claude().messages.countTokens({ model: 5, messages: [{ role: 'user', content: 'x' }] }),
    anthropicBadRequest('model must be a string'));
});

test('budgets: a spent budget rejects with each SDK\'s RateLimitError (429 budget_exceeded)', { timeout: 30_000 }, async () => {
  const key = createKey('sdk-node-agents-budget', '--requests-per-day', '1');
  const rateLimited = (cls, body) => (err) => {
    assert.ok(err instanceof cls, `${err?.constructor?.name}: ${err}`);
    assert.equal(err.status, 429);
    assert.match(err.headers.get('retry-after') ?? '', /^\d+$/);
    const { error, message } = body(err);
    assert.equal(error, 'budget_exceeded');
    assert.match(message, /requests_per_day/);
    return true;
  };
  const r = await openai(key).responses.create({ input: 'only one' });
  assert.equal(r.output_text, 'Echo: only one');
  await assert.rejects(openai(key).responses.create({ input: 'one more', stream: true }),
    rateLimited(OpenAI.RateLimitError, () => lastBody.json));
  await assert.rejects(claude(key).messages.create({ model: 'claude-haiku-4-5', max_tokens: 8, stream: true,
    messages: [{ role: 'user', content: 'x' }] }), rateLimited(Anthropic.RateLimitError, (err) => err.error));
});
