// Processes and servers for the browser test (tests/browser/console.test.mjs): children with
// their logs in the test's temporary directory, waited for and stopped by the test; a free
// port; a recording upstream; a gateway's configuration.
import { spawn } from 'node:child_process';
import { once } from 'node:events';
import fs from 'node:fs';
import http from 'node:http';
import net from 'node:net';
import path from 'node:path';

import { renderGatewayConfig } from '../gateway_config.mjs';

export async function freePort() {
  const srv = net.createServer();
  srv.listen(0, '127.0.0.1');
  await once(srv, 'listening');
  const { port } = srv.address();
  await new Promise((resolve) => srv.close(resolve));
  return port;
}

// Children started in `root`, logging to `<tmp>/<name>.log`; `children` lists them all, for
// the test to stop.
export function processes(tmp, root) {
  const children = [];
  function start(name, cmd, args, { waitFor } = {}) {
    const log = fs.openSync(path.join(tmp, `${name}.log`), 'w');
    const child = spawn(cmd, args, {
      cwd: root,
      env: { ...process.env, RUST_LOG: process.env.RUST_LOG || 'info' },
      stdio: ['ignore', waitFor ? 'pipe' : log, log],
    });
    children.push({ name, child });
    if (!waitFor) return Promise.resolve({ child });
    return new Promise((resolve, reject) => {
      let seen = '';
      const timer = setTimeout(() => reject(new Error(`${name} printed no ${waitFor} within 20 s: ${logTail(name)}`)), 20_000);
      child.stdout.on('data', (chunk) => {
        fs.writeSync(log, chunk);
        seen += chunk;
        const m = waitFor.exec(seen);
        if (m) {
          clearTimeout(timer);
          resolve({ child, match: m });
        }
      });
      child.once('exit', (code) => {
        clearTimeout(timer);
        reject(new Error(`${name} exited (${code}) before it was ready: ${logTail(name)}`));
      });
    });
  }

  function logTail(name, lines = 30) {
    try {
      return `\n--- ${name}.log ---\n${fs.readFileSync(path.join(tmp, `${name}.log`), 'utf8').split('\n').slice(-lines).join('\n')}`;
    } catch {
      return '';
    }
  }

  async function waitHttp(url, name, ok = (r) => r.status === 200) {
    const deadline = Date.now() + 30_000;
    let last = 'no answer';
    while (Date.now() < deadline) {
      try {
        const r = await fetch(url);
        if (ok(r)) return;
        last = `HTTP ${r.status}`;
      } catch (err) {
        last = err.cause?.code || err.message;
      }
      const c = children.find((x) => x.name === name);
      if (c && c.child.exitCode !== null) throw new Error(`${name} exited with ${c.child.exitCode}: ${logTail(name)}`);
      await new Promise((r) => setTimeout(r, 100));
    }
    throw new Error(`${url} not ready within 30 s (${last}): ${logTail(name)}`);
  }

  return { children, start, logTail, waitHttp };
}

// A recording OpenAI-style upstream: answers POST /v1/chat/completions with a fixed completion.
export function startUpstream() {
  const requests = [];
  const server = http.createServer((req, res) => {
    let body = '';
    req.on('data', (c) => { body += c; });
    req.on('end', () => {
      requests.push({ method: req.method, url: req.url, headers: req.headers, body });
      if (req.method === 'POST' && req.url === '/v1/chat/completions') {
        res.writeHead(200, { 'content-type': 'application/json' });
        res.end(JSON.stringify({
          id: 'chatcmpl-browser', object: 'chat.completion', created: 0, model: 'test-model',
          choices: [{ index: 0, message: { role: 'assistant', content: 'Hi from upstream' }, finish_reason: 'stop' }],
          usage: { prompt_tokens: 3, completion_tokens: 3, total_tokens: 6 },
        }));
      } else {
        res.writeHead(404, { 'content-type': 'application/json' });
        res.end('{"error":"not_found"}');
      }
    });
  });
  return new Promise((resolve) => server.listen(0, '127.0.0.1', () => resolve({ server, requests })));
}

// A gateway's configuration (tests/gateway_config.mjs): the key store (and with it the usage
// ledger and budgets) in `tmp`, shared by every gateway written with the same `tmp`; `infer` on
// the recording upstream and the metered `chatx` (`api = "openai"`) on the fake upstream, whose
// answers state their token counts. `admin`: more keys of its [admin] table; `pricing`: the
// [pricing] table (none: nothing is costed).
export function gatewayConfig({
  tmp, name, port, adminPort, admin = {}, issuer, audience, cacheTtlSeconds, flushSeconds, maxKeysPerOwner,
  upstream, fakeUpstream, pricing,
}) {
  return renderGatewayConfig({
    comment: 'written by tests/browser/console.test.mjs',
    dir: tmp,
    port,
    server: {
      threads: 1, grace_period_seconds: 1, graceful_shutdown_timeout_seconds: 1,
      upgrade_sock: path.join(tmp, `${name}-upgrade.sock`), pid_file: path.join(tmp, `${name}.pid`),
    },
    api_keys: {
      database: `sqlite://${path.join(tmp, 'keys.db')}`, cache_ttl_seconds: cacheTtlSeconds, negative_cache_ttl_seconds: 1,
    },
    jwt: { issuer, audience },
    metering: { flush_seconds: flushSeconds },
    // The budgets tests/browser/budgets.mjs sets in the console are enforced, as in production.
    budgets: { enforcement: 'reserve', default_max_tokens: 256 },
    ...(pricing ? { pricing } : {}),
    admin: { listen: `127.0.0.1:${adminPort}`, console: true, max_keys_per_owner: maxKeysPerOwner, ...admin },
    services: [
      { name: 'infer', upstream },
      // Metered: the gateway reads the usage the fake upstream reports on chat completions.
      { name: 'chatx', upstream: fakeUpstream, api: 'openai' },
    ],
  });
}

// The test's price table ([pricing] file, written into the test's temporary directory): one
// model priced, in whole millionths per token so that every cost is exact; every other model
// (and a request naming none) is unpriced. Per million tokens, as the table's format has it.
export const PRICES = { 'alpha3.6-vl': { input: 2, cached_input: 1, output: 10 } };

export function priceTable() {
  return Object.entries(PRICES).map(([model, p]) => [
    '[[price]]', `model = "${model}"`, 'from = "2000-01-01"',
    `input = ${p.input}.0`, `cached_input = ${p.cached_input}.0`, `output = ${p.output}.0`, '',
  ].join('\n')).join('\n');
}

// What a request of `model` that used `usage` (an OpenAI usage object) costs, in millionths of
// the currency; null when the model has no price. Cached prompt tokens at the cached price,
// reasoning inside completion, as docs/costs.md computes it.
export function costMicros(model, usage) {
  const p = PRICES[model];
  if (!p) return null;
  const cached = usage.prompt_tokens_details?.cached_tokens || 0;
  return (usage.prompt_tokens - cached) * p.input + cached * p.cached_input + usage.completion_tokens * p.output;
}

// A cost as the console writes it: the amount in `currency` ("—" for none known) and, when some
// requests had no price, how many.
export function costText(currency, micros, unpriced = 0) {
  const digits = { minimumFractionDigits: 2, maximumFractionDigits: 6 };
  const cost = micros === null ? '—' : new Intl.NumberFormat('en', { style: 'currency', currency, ...digits }).format(micros / 1e6);
  return unpriced > 0 ? `${cost} · ${unpriced} unpriced` : cost;
}
