// The official openai Node SDK against the real gateway. Run by tests/sdk/run.py, which starts
// the gateway in front of the fake upstream's demo model (target/debug/fake-upstream,
// testkit/src/upstream/model.rs) and passes:
//   PORTCULLIS_URL    the gateway, e.g. http://127.0.0.1:PORT
//   PORTCULLIS_TOKEN  a bearer token with the infer, chatx and embed scopes (an ak_ key or a JWT)
//   PORTCULLIS_METRICS_URL  the gateway's Prometheus endpoint (for the metering tests)
// and, for the budget tests (once per run; without them they are not defined):
//   PORTCULLIS_CLI, PORTCULLIS_CONFIG  the gateway binary and its config, to make budgeted keys
import assert from 'node:assert/strict';
import { execFileSync } from 'node:child_process';
import { test } from 'node:test';

import OpenAI from 'openai';

const GATEWAY = process.env.PORTCULLIS_URL;
const TOKEN = process.env.PORTCULLIS_TOKEN;
const METRICS = process.env.PORTCULLIS_METRICS_URL;
if (!GATEWAY || !TOKEN || !METRICS) throw new Error('set PORTCULLIS_URL, PORTCULLIS_TOKEN and PORTCULLIS_METRICS_URL');

const REASONING = 'Thinking about it.'; // what the demo model reasons before every answer
const client = (service, apiKey = TOKEN) =>
  new OpenAI({ baseURL: `${GATEWAY}/v1/${service}/v1`, apiKey, maxRetries: 0, timeout: 20_000 });

for (const [service, model] of [['infer', 'alpha3.6-vl'], ['chatx', 'x-small']]) {
  test(`${service}: streaming chat yields reasoning then content deltas and ends`, { timeout: 30_000 }, async () => {
    const stream = await client(service).chat.completions.create({
      model,
      stream: true,
      messages: [{ role: 'user', content: `node streams ${service}` }],
    });
    const order = [];
    let content = '';
    let reasoning = '';
    let finish = null;
    for await (const chunk of stream) { // the SDK stops at data: [DONE]
      const [choice] = chunk.choices;
      if (choice.delta.reasoning_content) {
        reasoning += choice.delta.reasoning_content;
        order.push('r');
      }
      if (choice.delta.content) {
        content += choice.delta.content;
        order.push('c');
      }
      finish = choice.finish_reason ?? finish;
    }
    assert.equal(reasoning, REASONING);
    assert.equal(content, `Echo: node streams ${service}`);
    assert.match(order.join(''), /^r+c{2,}$/, 'reasoning first, answer token by token');
    assert.equal(finish, 'stop');
  });
}

// chatx's model policy (run.py's config): default x-large-2, aliases large and small.
test('chatx: a request without a model key gets the default model', { timeout: 30_000 }, async () => {
  const r = await client('chatx').chat.completions.create({
    messages: [{ role: 'user', content: 'node default model' }],
  });
  assert.equal(r.model, 'x-large-2', 'the model the upstream received');
  assert.equal(r.choices[0].message.content, 'Echo: node default model');
});

test("chatx: model 'large' streaming, every chunk carries x-large-2", { timeout: 30_000 }, async () => {
  const stream = await client('chatx').chat.completions.create({
    model: 'large',
    stream: true,
    messages: [{ role: 'user', content: 'node alias' }],
  });
  const models = new Set();
  let chunks = 0;
  for await (const chunk of stream) {
    models.add(chunk.model);
    chunks += 1;
  }
  assert.ok(chunks > 2, `only ${chunks} chunks`);
  assert.deepEqual([...models], ['x-large-2']);
});

test('chatx: stream_options.include_usage yields a final chunk with usage', { timeout: 30_000 }, async () => {
  const stream = await client('chatx').chat.completions.create({
    model: 'small',
    stream: true,
    stream_options: { include_usage: true },
    messages: [{ role: 'user', content: 'node usage' }],
  });
  const chunks = [];
  for await (const chunk of stream) chunks.push(chunk);
  const last = chunks.at(-1);
  assert.ok(last.usage, 'the last chunk has usage');
  assert.deepEqual(last.choices, []);
  assert.ok(chunks.slice(0, -1).every((c) => !c.usage), 'usage only on the last chunk');
  const { prompt_tokens: p, completion_tokens: c, total_tokens: t } = last.usage;
  assert.ok(p > 0 && c > 0 && t === p + c, `usage ${JSON.stringify(last.usage)}`);
  assert.equal(last.model, 'x-small-1');
});

// Metering (issue 21): a stream opened without stream_options must reach the client without a
// usage chunk and still be counted. The second test needs the gateway to add include_usage
// upstream (and strip the usage chunk it adds): until it does, it fails by design.
const METRICS_WAIT_MS = 2000; // the counter moves when the request is logged, after the stream

async function tokenCounts(service) {
  const text = await (await fetch(METRICS)).text();
  const counts = { prompt: 0, completion: 0 };
  for (const m of text.matchAll(/^portcullis_tokens_total\{([^}]*)\}\s+(\S+)$/gm)) {
    const labels = Object.fromEntries([...m[1].matchAll(/(\w+)="([^"]*)"/g)].map((l) => [l[1], l[2]]));
    if (labels.service === service && labels.kind in counts) counts[labels.kind] = Number(m[2]);
  }
  return counts;
}

async function settledTokenCounts(service) {
  let before = await tokenCounts(service);
  for (let waited = 0; waited < METRICS_WAIT_MS; waited += 100) {
    await new Promise((r) => setTimeout(r, 100));
    const now = await tokenCounts(service);
    if (now.prompt === before.prompt && now.completion === before.completion) return now;
    before = now;
  }
  throw new Error(`portcullis_tokens_total for ${service} still moving`);
}

const streamChunks = async (content, extra = {}) => {
  const stream = await client('infer').chat.completions.create({
    model: 'alpha3.6-vl', stream: true, messages: [{ role: 'user', content }], ...extra,
  });
  const chunks = [];
  for await (const chunk of stream) chunks.push(chunk);
  return chunks;
};

test('infer: streaming without stream_options yields no usage chunk', { timeout: 30_000 }, async () => {
  const chunks = await streamChunks('node no usage');
  assert.ok(chunks.length > 2, `only ${chunks.length} chunks`);
  for (const c of chunks) {
    assert.ok(c.choices.length > 0, `a chunk without choices: ${JSON.stringify(c)}`);
    assert.ok(c.usage === undefined || c.usage === null, `a chunk with usage: ${JSON.stringify(c)}`);
  }
});

test('infer: streaming without stream_options is metered exactly (needs the gateway\'s include_usage injection)', { timeout: 30_000 }, async () => {
  const text = 'node meter this stream';
  // The same request with include_usage: what the demo model counts for it (deterministic).
  const { usage } = (await streamChunks(text, { stream_options: { include_usage: true } })).at(-1);
  assert.ok(usage, 'the include_usage twin request ends with a usage chunk');
  const before = await settledTokenCounts('infer');
  await streamChunks(text);
  const want = { prompt: usage.prompt_tokens, completion: usage.completion_tokens };
  let delta;
  for (let waited = 0; waited <= METRICS_WAIT_MS; waited += 50) {
    const after = await tokenCounts('infer');
    delta = { prompt: after.prompt - before.prompt, completion: after.completion - before.completion };
    if (delta.prompt === want.prompt && delta.completion === want.completion) break;
    await new Promise((r) => setTimeout(r, 50));
  }
  assert.deepEqual(delta, want, 'portcullis_tokens_total{service="infer"} increase');
});

test('embed: embeddings for a list of inputs, ordered by index, 1024 floats each', { timeout: 30_000 }, async () => {
  const embed = client('embed');
  const a = await embed.embeddings.create({ model: 'emb-m3', input: ['alpha', 'beta', 'gamma'] });
  assert.equal(a.object, 'list');
  assert.deepEqual(a.data.map((d) => d.index), [0, 1, 2]);
  for (const d of a.data) {
    assert.equal(d.embedding.length, 1024);
    assert.ok(d.embedding.every((x) => typeof x === 'number' && Number.isFinite(x)));
  }
  // The same texts in another order: each vector follows its text, so item i embeds input i.
  const b = await embed.embeddings.create({ model: 'emb-m3', input: ['gamma', 'alpha', 'beta'], encoding_format: 'float' });
  assert.deepEqual(b.data.map((d) => d.index), [0, 1, 2]);
  const close = (x, y) => x.every((v, i) => Math.abs(v - y[i]) < 1e-6);
  assert.ok(close(b.data[0].embedding, a.data[2].embedding), 'gamma');
  assert.ok(close(b.data[1].embedding, a.data[0].embedding), 'alpha');
  assert.ok(close(b.data[2].embedding, a.data[1].embedding), 'beta');
  assert.ok(!close(a.data[0].embedding, a.data[1].embedding), 'distinct texts, distinct vectors');
});

test('a bad key raises AuthenticationError (401)', { timeout: 30_000 }, async () => {
  await assert.rejects(
    client('infer', `ak_0123456789abcdef.${'B'.repeat(43)}`).models.list(),
    (err) => err instanceof OpenAI.AuthenticationError && err.status === 401,
  );
});

// Budgets (issue 22, docs/budgets.md): a budgeted key's responses carry OpenAI's x-ratelimit-*
// headers for its budget; a request that does not fit is refused with 429 budget_exceeded and
// Retry-After. The budget is computed from the body the SDK really sends (measured by sending
// the same request with PORTCULLIS_TOKEN, which has no budget): the gateway reserves
// ceil(body bytes / 4) + max_tokens (run.py's [budgets] prompt_bytes_per_token = 4).
const CLI = process.env.PORTCULLIS_CLI;
const CONFIG = process.env.PORTCULLIS_CONFIG;
if (CLI && CONFIG) {
  const MAX_TOKENS = 16;
  const SLACK_S = 5; // a reset or Retry-After may differ this much from our clock's midnight
  const request = { model: 'alpha3.6-vl', max_tokens: MAX_TOKENS, messages: [{ role: 'user', content: 'node budget check' }] };
  const toMidnight = () => 86_400 - (Math.floor(Date.now() / 1000) % 86_400);
  // A client whose fetch records the size of each body it sends.
  const recording = (apiKey, sizes, maxRetries = 0) => new OpenAI({
    baseURL: `${GATEWAY}/v1/infer/v1`, apiKey, maxRetries, timeout: 20_000,
    fetch: (url, init) => {
      sizes.push(init?.body == null ? 0 : Buffer.byteLength(init.body));
      return fetch(url, init);
    },
  });
  const assertReset = (value, what) => {
    const m = /^(?:(\d+)h)?(?:(\d+)m)?(\d+)s$/.exec(value ?? '');
    assert.ok(m, `${what}: ${value} is not an OpenAI duration like 13h2m5s`);
    const s = Number(m[1] ?? 0) * 3600 + Number(m[2] ?? 0) * 60 + Number(m[3]);
    assert.ok(Math.abs(s - toMidnight()) <= SLACK_S, `${what}: ${value} is not the ${toMidnight()} s to UTC midnight`);
  };
  const budget = {};

  test('budgets: withResponse() on a tokens_per_day key: x-ratelimit-*-tokens give the budget, what the reservation leaves and the time to UTC midnight', { timeout: 30_000 }, async () => {
    const sizes = [];
    const free = await recording(TOKEN, sizes).chat.completions.create(request).withResponse();
    assert.equal(free.response.headers.get('x-ratelimit-limit-tokens'), '150000000', "a caller without a budget gets the upstream's headers");
    const used = free.data.usage.prompt_tokens + free.data.usage.completion_tokens;
    const reserve = Math.ceil(sizes[0] / 4) + MAX_TOKENS;
    // Room for exactly one request: the first leaves used - 1; charged `used` (or still holding
    // its reservation), it leaves no room for a second.
    budget.limit = reserve + used - 1;
    const out = execFileSync(CLI, ['keys', 'create', '--config', CONFIG, '--name', 'sdk-node-budget',
      '--scopes', 'infer', '--tokens-per-day', String(budget.limit)], { encoding: 'utf8' });
    budget.key = out.trim().split('\n').at(-1);
    budget.id = /^ak_([0-9a-f]{16})\./.exec(budget.key)[1];
    const mine = [];
    const { data, response } = await recording(budget.key, mine).chat.completions.create(request).withResponse();
    assert.deepEqual(mine, sizes, 'the same body as measured');
    assert.equal(data.choices[0].message.content, 'Echo: node budget check');
    assert.equal(response.headers.get('x-ratelimit-limit-tokens'), String(budget.limit));
    assert.equal(response.headers.get('x-ratelimit-remaining-tokens'), String(budget.limit - reserve));
    assertReset(response.headers.get('x-ratelimit-reset-tokens'), 'x-ratelimit-reset-tokens');
  });

  test('budgets: the next request rejects with OpenAI.RateLimitError, status 429, budget_exceeded, retry-after the seconds to UTC midnight', { timeout: 30_000 }, async () => {
    assert.ok(budget.key, 'no budgeted key (the previous test failed)');
    const sizes = [];
    await assert.rejects(recording(budget.key, sizes).chat.completions.create(request), (err) => {
      budget.err = err;
      assert.ok(err instanceof OpenAI.RateLimitError, `${err?.constructor?.name}: ${err}`);
      assert.equal(err.status, 429);
      assert.equal(err.error, 'budget_exceeded', "the SDK's err.error: the body's error member");
      const retry = Number(err.headers.get('retry-after'));
      assert.ok(Number.isInteger(retry) && Math.abs(retry - toMidnight()) <= SLACK_S,
        `retry-after ${err.headers.get('retry-after')}, not the ${toMidnight()} s to UTC midnight`);
      assert.equal(err.headers.get('x-ratelimit-limit-tokens'), String(budget.limit));
      assertReset(err.headers.get('x-ratelimit-reset-tokens'), 'x-ratelimit-reset-tokens');
      return true;
    });
    assert.equal(sizes.length, 1, 'one request sent (maxRetries: 0)');
  });

  test('budgets: the RateLimitError carries the budget_exceeded code and the headers that say when to come back', async () => {
    assert.ok(budget.err, 'no RateLimitError (the previous test failed)');
    // The SDK keeps the body's `error` (our code, a string as interface.md pins it) and
    // writes `429 "budget_exceeded"`; it reads a message only from OpenAI's nested shape.
    assert.equal(budget.err.error, 'budget_exceeded');
    assert.match(budget.err.message, /^429 "budget_exceeded"$/);
    assert.ok(Number(budget.err.headers.get('x-ratelimit-remaining-tokens')) >= 0);
  });

  // run.py's [pricing] prices the chat model at 1 USD per million tokens: any request's priced
  // worst case is more than a millionth of a dollar.
  test('budgets: a cost_per_day key too small for the request rejects with OpenAI.RateLimitError, budget_exceeded', { timeout: 30_000 }, async () => {
    const out = execFileSync(CLI, ['keys', 'create', '--config', CONFIG, '--name', 'sdk-node-cost',
      '--scopes', 'infer', '--cost-per-day', '0.000001'], { encoding: 'utf8' });
    const key = out.trim().split('\n').at(-1);
    const sizes = [];
    await assert.rejects(recording(key, sizes).chat.completions.create(request), (err) => {
      assert.ok(err instanceof OpenAI.RateLimitError, `${err?.constructor?.name}: ${err}`);
      assert.equal(err.status, 429);
      assert.equal(err.error, 'budget_exceeded');
      const retry = Number(err.headers.get('retry-after'));
      assert.ok(Number.isInteger(retry) && Math.abs(retry - toMidnight()) <= SLACK_S, `retry-after ${retry}`);
      return true;
    });
    assert.equal(sizes.length, 1, 'one request sent (maxRetries: 0)');
  });

  test('budgets: with the SDK\'s default retries a refusal hours from its reset still rejects at once (x-should-retry: false)', { timeout: 30_000 }, async () => {
    assert.ok(budget.key, 'no budgeted key (an earlier test failed)');
    if (toMidnight() <= 60) return; // the window ends within a minute: a retry is allowed then
    const sizes = [];
    const started = Date.now();
    await assert.rejects(recording(budget.key, sizes, 2).chat.completions.create(request), (err) => {
      assert.ok(err instanceof OpenAI.RateLimitError, `${err?.constructor?.name}: ${err}`);
      assert.equal(err.headers.get('x-should-retry'), 'false');
      return true;
    });
    assert.equal(sizes.length, 1, 'the SDK did not retry');
    assert.ok(Date.now() - started < 10_000, 'rejected without sleeping out Retry-After');
  });
}
