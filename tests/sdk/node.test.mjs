// The official openai Node SDK against the real gateway. Run by tests/sdk/run.py, which starts
// the gateway in front of the fake upstream's demo model (target/debug/fake-upstream,
// testkit/src/upstream/model.rs) and passes:
//   PORTCULLIS_URL    the gateway, e.g. http://127.0.0.1:PORT
//   PORTCULLIS_TOKEN  a bearer token with the infer, chatx and embed scopes (an ak_ key or a JWT)
import assert from 'node:assert/strict';
import { test } from 'node:test';

import OpenAI from 'openai';

const GATEWAY = process.env.PORTCULLIS_URL;
const TOKEN = process.env.PORTCULLIS_TOKEN;
if (!GATEWAY || !TOKEN) throw new Error('set PORTCULLIS_URL and PORTCULLIS_TOKEN');

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
