// The key console end to end, as a person uses it, in Debian's Chromium (playwright-core, no
// browser download): the real gateway (target/debug/portcullis, BIN= overrides) with its admin
// listener serving console/, the real OpenID provider (tests/sdk/idp.mjs, oidc-provider) and a
// recording upstream. Sign in through the provider's login and consent pages, create a key in
// the page, call the gateway with it, revoke it in the page, and see the gateway refuse it
// within cache_ttl_seconds + 1 s. A second key calls an `api = "openai"` service backed by the
// test kit's fake upstream (target/debug/fake-upstream, UPSTREAM= overrides), which states
// its token counts: the usage view must show exactly those, today, this month and in its 30-day
// charts. A second gateway on the same key store offers administrator sign-in
// (`console_admin_sign_in`, `admin_subjects`); the first one must not even show it, and there
// the administrator sees every owner's usage, and the cost of each row at the test's price
// table (tests/browser/usage.mjs). Budgets (tests/browser/budgets.mjs): an administrator sets
// an owner's budget, the owner sets its keys' within it, and real requests show as
// "used / budget · left". Teams (tests/browser/teams.mjs): the administrator puts the owner in
// a team and sets the team's cost budget; the owner sees its team and what is left of it.
//
//   node --test tests/browser/console.test.mjs      (scripts/browser-tests.sh installs and runs it)
//
// Screenshots of every step go to PORTCULLIS_BROWSER_OUT (default: a fresh temp directory,
// printed at the end). CHROMIUM= overrides /usr/bin/chromium. The gateways' configs are written
// by the test kit's gateway-config (tests/gateway_config.mjs; CONFIG_BIN= overrides).
import assert from 'node:assert/strict';
import { once } from 'node:events';
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { after, before, test } from 'node:test';
import { fileURLToPath } from 'node:url';

import { chromium } from 'playwright-core';

import { freePort, gatewayConfig, priceTable, processes, startUpstream } from './processes.mjs';
import { budgetSteps } from './budgets.mjs';
import { teamSteps } from './teams.mjs';
import { usageSteps } from './usage.mjs';

const ROOT = path.resolve(path.dirname(fileURLToPath(import.meta.url)), '../..');
const BIN = path.resolve(ROOT, process.env.BIN || 'target/debug/portcullis');
const CHROMIUM = process.env.CHROMIUM || '/usr/bin/chromium';
const FAKE_UPSTREAM = path.resolve(ROOT, process.env.UPSTREAM || 'target/debug/fake-upstream');
const AUDIENCE = 'urn:portcullis:browser-test';
const CACHE_TTL_SECONDS = 2;
const MAX_KEYS_PER_OWNER = 2;
const FLUSH_SECONDS = 1;
const KEY_SHAPE = /^ak_[0-9a-f]{16}\.[A-Za-z0-9_-]{43}$/;
const CHAT_BODY = JSON.stringify({ messages: [{ role: 'user', content: 'Hello from the browser test' }] });

const tmp = fs.mkdtempSync(path.join(os.tmpdir(), 'portcullis-browser-'));
const outDir = process.env.PORTCULLIS_BROWSER_OUT
  ? path.resolve(process.env.PORTCULLIS_BROWSER_OUT)
  : fs.mkdtempSync(path.join(os.tmpdir(), 'portcullis-browser-shots-'));
fs.mkdirSync(outDir, { recursive: true });
for (const f of fs.readdirSync(outDir)) if (/^\d\d-.*\.png$/.test(f)) fs.rmSync(path.join(outDir, f)); // an earlier run's

const { children, start, waitHttp } = processes(tmp, ROOT);
// Filled by before(): urls, ports, issuer (admin: the console; adminOffered: the one offering
// admin sign-in); the currency of the gateways' price table (not USD: the page must take it
// from the gateway's configuration).
const env = { currency: 'EUR' };
let upstream; // { server, requests }
let browser;
let context;
let page;
let broken = null; // the first failed step: later steps are skipped, not failed again
const pageProblems = []; // uncaught errors and console errors in the console page
const adminSetCookies = []; // Set-Cookie headers from the admin listener (there must be none)
const consoleRequests = []; // { from, to }: every script, style, image or fetch a console page asked for
let shot = 0;

// ---- browser helpers ---------------------------------------------------------------------------

async function screenshot(name) {
  shot += 1;
  const file = path.join(outDir, `${String(shot).padStart(2, '0')}-${name}.png`);
  await page.screenshot({ path: file, fullPage: true });
  return file;
}

async function newPage() {
  context = await browser.newContext({ viewport: { width: 1280, height: 800 } });
  page = await context.newPage();
  page.setDefaultTimeout(15_000);
  page.on('pageerror', (err) => pageProblems.push(`page error at ${page.url()}: ${err.message}`));
  page.on('request', (r) => {
    // Navigations are the test's own page.goto or the sign-in redirect: what a page loads or fetches counts.
    const from = r.frame().url();
    if (onConsole(from) && !r.isNavigationRequest()) consoleRequests.push({ from, to: r.url() });
  });
  page.on('response', async (r) => {
    if (onConsole(r.url())) {
      const cookie = await r.headerValue('set-cookie').catch(() => null);
      if (cookie) adminSetCookies.push(`${r.url()}: ${cookie}`);
    }
  });
  page.on('console', (msg) => {
    if (msg.type() !== 'error' || !onConsole(page.url())) return;
    // The API's own 4xx answers (the 409 and the usage 400 the test provokes) are logged by
    // Chromium as failed loads.
    const from = msg.location().url || '';
    const api = (p) => p.startsWith('/v1/keys') || p === '/v1/usage' || p.startsWith('/v1/owners/') || p.startsWith('/v1/teams/');
    if (/^Failed to load resource/.test(msg.text()) && onConsole(from) && api(new URL(from).pathname)) return;
    pageProblems.push(`console error at ${page.url()}: ${msg.text()} (${msg.location().url || 'page'})`);
  });
}

// Whether `url` is on one of the two consoles' origins.
function onConsole(url) {
  try {
    return [env.admin, env.adminOffered].includes(new URL(url).origin);
  } catch {
    return false;
  }
}

async function message() {
  return (await page.locator('#message').textContent()).trim();
}

// Sign in from the console page through the provider's devInteractions login and consent pages.
async function signIn(login, { admin = false, shots = false, base = env.admin } = {}) {
  await page.goto(`${base}/console/`);
  await page.locator('#sign-in:not([disabled])').waitFor();
  if (admin) await page.getByLabel(/administrator access/).check();
  if (shots) await screenshot('console-signed-out');
  await page.locator('#sign-in').click();
  await page.waitForURL((url) => url.href.startsWith(env.issuer));
  await page.locator('input[name=login]').waitFor();
  await page.locator('input[name=login]').fill(login);
  await page.locator('input[name=password]').fill('any password');
  if (shots) await screenshot('idp-login');
  await page.locator('button[type=submit]').click();
  await page.getByRole('button', { name: 'Continue' }).waitFor();
  if (shots) await screenshot('idp-consent');
  await page.getByRole('button', { name: 'Continue' }).click();
  await page.waitForURL((url) => url.href.startsWith(`${base}/`));
  await page.locator('#app').waitFor({ state: 'visible' });
  await page.locator('#keys-table').waitFor();
  // The page says who signed in once the key list has loaded, a moment after it shows the app.
  await page.locator('#message:not(:empty)').waitFor();
  const msg = await message();
  assert.match(msg, new RegExp(`Signed in as ${login}`), `sign-in message: ${msg}`);
}

// Creates a key in the page, returns { id, key } as the page shows them.
async function createKey(name, scope, expiry) {
  await page.locator('#key-name').fill(name);
  await page.getByLabel(scope, { exact: true }).check();
  if (expiry !== undefined) await page.locator('#key-expiry').selectOption(expiry);
  const created = page.waitForResponse((r) => r.url() === `${env.admin}/v1/keys` && r.request().method() === 'POST');
  await page.locator('#create-key').click();
  return created;
}

async function noHorizontalScroll(width) {
  await page.setViewportSize({ width, height: 844 });
  const { scrollWidth, clientWidth } = await page.evaluate(() => ({
    scrollWidth: document.documentElement.scrollWidth,
    clientWidth: document.documentElement.clientWidth,
  }));
  assert.ok(scrollWidth <= clientWidth, `horizontal scroll at ${width} px: content ${scrollWidth} px wide`);
}

// A step runs only while every earlier one passed (they build on each other).
function step(name, fn) {
  test(name, { timeout: 60_000 }, async (t) => {
    if (broken) {
      t.skip(`an earlier step failed: ${broken}`);
      return;
    }
    try {
      await fn(t);
      // Every step also checks the page threw nothing and Chromium blocked nothing (e.g. by CSP).
      assert.deepEqual(pageProblems, [], 'script errors or blocked resources in the console page');
    } catch (err) {
      broken = name;
      if (page) await screenshot('FAILED').catch(() => {});
      throw err;
    }
  });
}

// ---- setup and teardown ------------------------------------------------------------------------

before(async () => {
  assert.ok(fs.existsSync(BIN), `${BIN} missing: cargo build first`);
  assert.ok(fs.existsSync(CHROMIUM), `${CHROMIUM} missing: apt-get install chromium (make test-deps does)`);
  assert.ok(fs.existsSync(FAKE_UPSTREAM), `${FAKE_UPSTREAM} missing: cargo build -p testkit --bin fake-upstream`);
  upstream = await startUpstream();
  const fake = await start('fake-upstream', FAKE_UPSTREAM, ['--port', '0', '--token-delay-ms', '0'], { waitFor: /LISTENING (\d+)/ });
  env.fakeUpstream = `http://127.0.0.1:${fake.match[1]}`;
  const [gwPort, adminPort, gwPort2, adminPort2] = [await freePort(), await freePort(), await freePort(), await freePort()];
  env.gateway = `http://127.0.0.1:${gwPort}`;
  env.admin = `http://127.0.0.1:${adminPort}`;
  env.adminOffered = `http://127.0.0.1:${adminPort2}`;

  const idp = await start('idp', process.execPath, [
    path.join(ROOT, 'tests/sdk/idp.mjs'), '--port', '0', '--audience', AUDIENCE,
    '--console-redirect', `${env.admin}/console/`, '--console-redirect', `${env.adminOffered}/console/`,
  ], { waitFor: /LISTENING (\d+)/ });
  env.issuer = `http://127.0.0.1:${idp.match[1]}`;

  // The same key store and price table behind both: keys made on one are seen by the other's
  // administrator, and a request costs the same on either.
  const prices = path.join(tmp, 'prices.toml');
  fs.writeFileSync(prices, priceTable());
  const gateway = (name, port, adminPort, admin) => {
    const config = path.join(tmp, `${name}.toml`);
    fs.writeFileSync(config, gatewayConfig({
      tmp, name, port, adminPort, admin, issuer: env.issuer, audience: AUDIENCE,
      cacheTtlSeconds: CACHE_TTL_SECONDS, flushSeconds: FLUSH_SECONDS, maxKeysPerOwner: MAX_KEYS_PER_OWNER,
      upstream: `http://127.0.0.1:${upstream.server.address().port}`, fakeUpstream: env.fakeUpstream,
      pricing: { file: prices, currency: env.currency },
    }));
    return start(name, BIN, ['serve', '--config', config]);
  };
  await gateway('gateway', gwPort, adminPort, {});
  await gateway('gateway-admin', gwPort2, adminPort2, { console_admin_sign_in: true, admin_subjects: ['admin'] });
  await waitHttp(`${env.gateway}/healthz`, 'gateway');
  await waitHttp(`${env.admin}/console/`, 'gateway');
  await waitHttp(`${env.adminOffered}/console/`, 'gateway-admin');

  const args = ['--disable-gpu', '--disable-dev-shm-usage'];
  if (process.getuid?.() === 0) args.push('--no-sandbox'); // Chromium refuses to sandbox as root
  browser = await chromium.launch({ executablePath: CHROMIUM, headless: true, args });
  await newPage();
});

after(async () => {
  await browser?.close().catch(() => {});
  for (const { child } of children.reverse()) {
    if (child.exitCode === null) {
      child.kill('SIGTERM');
      await Promise.race([once(child, 'exit'), new Promise((r) => setTimeout(r, 5000))]);
      if (child.exitCode === null) child.kill('SIGKILL');
    }
  }
  upstream?.server.close();
  upstream?.server.closeAllConnections();
  if (broken || process.env.PORTCULLIS_KEEP_TMP) {
    console.log(`# logs and config kept in ${tmp}`);
  } else {
    fs.rmSync(tmp, { recursive: true, force: true });
  }
  console.log(`# screenshots in ${outDir}`);
});

// ---- the steps ---------------------------------------------------------------------------------

const state = {}; // what one step hands the next
const usage = usageSteps({
  step, env, state, screenshot, createKey, noHorizontalScroll, consoleRequests,
  page: () => page, upstream: () => upstream, flushSeconds: FLUSH_SECONDS,
});
const budgets = budgetSteps({
  step, env, state, screenshot, createKey, noHorizontalScroll, signIn, flushSeconds: FLUSH_SECONDS,
  page: () => page, freshPage: async () => { await context.close(); await newPage(); },
});
const teams = teamSteps({
  step, env, state, screenshot, noHorizontalScroll, signInAs: budgets.signInAs, flushSeconds: FLUSH_SECONDS,
  page: () => page,
});

step('the admin listener serves the console page, its scripts and its configuration', async () => {
  const html = await fetch(`${env.admin}/console/`);
  assert.equal(html.status, 200);
  assert.match(html.headers.get('content-type') || '', /^text\/html/);
  const scripts = ['oidc.js', 'usage.js', 'budgets.js', 'teams.js', 'console.js'];
  const tags = scripts.map((s) => `<script src="${s.replace('.', '\\.')}"></script>`).join('\\s*');
  assert.match(await html.text(), new RegExp(tags), 'the scripts, in their order');
  for (const script of scripts) {
    const js = await fetch(`${env.admin}/console/${script}`);
    assert.equal(js.status, 200, script);
    assert.match(js.headers.get('content-type') || '', /^(text|application)\/javascript/);
    // Every script gets the page's headers: the same CSP (connect-src: this origin and the issuer only).
    for (const h of ['content-security-policy', 'x-content-type-options', 'x-frame-options', 'referrer-policy']) {
      assert.equal(js.headers.get(h), html.headers.get(h), `${script}: ${h}`);
    }
    assert.match(js.headers.get('content-security-policy') || '', /connect-src 'self' http:\/\/127\.0\.0\.1:\d+;/, script);
  }
  const cfg = await fetch(`${env.admin}/console/config.json`);
  assert.equal(cfg.status, 200);
  assert.match(cfg.headers.get('content-type') || '', /^application\/json/);
  const body = await cfg.json();
  assert.equal(body.issuer, env.issuer);
  assert.equal(body.client_id, 'portcullis-console');
  assert.equal(body.resource, AUDIENCE);
  assert.equal(body.gateway_url, env.gateway);
  assert.equal(body.admin_scope, 'portcullis:admin');
  assert.equal(body.admin_sign_in, false, 'admin sign-in is off unless configured');
  assert.equal(body.currency, env.currency, 'the currency of [pricing], which the page labels costs with');
  assert.ok(body.scopes.includes('openid') && body.scopes.includes('infer'), `scopes ${JSON.stringify(body.scopes)}`);
});

step('the administrator box shows only where console_admin_sign_in offers it', async () => {
  await page.goto(`${env.admin}/console/`);
  await page.locator('#sign-in:not([disabled])').waitFor();
  assert.equal(await page.locator('#admin-signin').isVisible(), false, 'the box is shown without console_admin_sign_in');
  assert.ok(!(await page.locator('body').innerText()).includes('administrator access'), 'its label is shown');
  await page.goto(`${env.adminOffered}/console/`);
  await page.locator('#sign-in:not([disabled])').waitFor();
  assert.equal(await page.locator('#admin-signin').isVisible(), true, 'the box is missing where it is offered');
  await screenshot('admin-sign-in-offered');
});

step('sign in through the real provider login and consent pages (authorization code + PKCE)', async () => {
  const tokenRequests = [];
  const isToken = (r) => r.url().startsWith(env.issuer) && r.method() === 'POST' && r.url().includes('/token');
  page.on('request', (r) => {
    if (isToken(r)) tokenRequests.push(r.postData() || '');
  });
  const tokenResponse = page.waitForResponse((r) => isToken(r.request()), { timeout: 60_000 });
  await signIn('alice', { shots: true });
  state.accessToken = (await (await tokenResponse).json()).access_token;
  assert.ok(state.accessToken, 'the provider issued an access token');
  assert.equal(page.url(), `${env.admin}/console/`, 'the code and state are gone from the address bar');
  assert.equal(tokenRequests.length, 1, 'one token request');
  const form = new URLSearchParams(tokenRequests[0]);
  assert.equal(form.get('grant_type'), 'authorization_code');
  assert.ok(form.get('code_verifier')?.length >= 43, 'a PKCE code verifier is sent');
  assert.equal(form.get('resource'), AUDIENCE);
  assert.equal(form.get('client_secret'), null, 'a public client sends no secret');
  assert.match(await page.locator('#who').textContent(), /Signed in as alice/);
  await screenshot('signed-in');
});

step('the access token is kept in memory only: no localStorage, sessionStorage or cookie', async () => {
  const stored = await page.evaluate(() => ({
    local: Object.keys(localStorage).length,
    session: Object.keys(sessionStorage).length,
    cookie: document.cookie,
  }));
  assert.equal(stored.local, 0, 'localStorage is empty');
  assert.equal(stored.session, 0, 'sessionStorage is empty (the PKCE verifier is gone)');
  assert.ok(!stored.cookie.includes(state.accessToken), 'no cookie holds the token');
  // Cookies are per host, not per port: the provider's own session cookies on 127.0.0.1 show
  // here too. None of them, nor any other, may hold the token; the console itself sets none.
  for (const c of await context.cookies()) {
    assert.ok(!c.value.includes(state.accessToken), `cookie ${c.name} holds the token`);
  }
  assert.deepEqual(adminSetCookies, [], 'the admin listener sets no cookie');
});

step('keyboard: Tab reaches the Create button, and focus is visible', async () => {
  await page.evaluate(() => document.activeElement?.blur());
  await page.locator('h1').click(); // start from the top of the page
  let reached = false;
  for (let i = 0; i < 40 && !reached; i += 1) {
    await page.keyboard.press('Tab');
    reached = await page.evaluate(() => document.activeElement?.id === 'create-key');
  }
  assert.ok(reached, 'the Create button is reached with Tab');
  const outline = await page.evaluate(() => {
    const s = getComputedStyle(document.activeElement);
    return { style: s.outlineStyle, width: parseFloat(s.outlineWidth) };
  });
  assert.ok(outline.style !== 'none' && outline.width >= 2, `visible focus outline: ${JSON.stringify(outline)}`);
  await screenshot('keyboard-focus-on-create');
});

step('create a key in the page: the full key is shown once, with a warning and a curl command', async () => {
  const response = await createKey('browser-test key', 'infer', '30d');
  assert.equal(response.status(), 201, `POST /v1/keys: ${response.status()} ${await response.text()}`);
  await page.locator('#new-key').waitFor({ state: 'visible' });
  const key = await page.locator('#new-key-value').inputValue();
  assert.match(key, KEY_SHAPE);
  assert.equal(await page.locator('#new-key-value').getAttribute('readonly'), '');
  assert.match(await page.locator('#new-key-warning').textContent(), /will not be shown again/);
  const curl = await page.locator('#curl-command').textContent();
  assert.ok(curl.includes(`curl ${env.gateway}/v1/infer/v1/chat/completions`), curl);
  assert.ok(curl.includes(`Authorization: Bearer ${key}`), curl);
  const id = key.slice(3, 19);
  const row = page.locator(`tr[data-key-id="${id}"]`);
  await row.waitFor();
  assert.equal(await row.getAttribute('data-status'), 'active');
  const rowText = await row.textContent();
  assert.ok(rowText.includes('browser-test key') && rowText.includes('infer'), rowText);
  assert.ok(!rowText.includes(key.slice(20)), 'the list never shows the secret');
  state.key = key;
  state.id = id;

  // Phone widths: no horizontal scroll, and a screenshot at 390 x 844.
  await noHorizontalScroll(360);
  await noHorizontalScroll(390);
  await screenshot('key-created-phone-390');
  await page.setViewportSize({ width: 1280, height: 800 });
  await screenshot('key-created-desktop');
});

step('the new key works on the gateway, and the upstream never sees it', async () => {
  const before = upstream.requests.length;
  const r = await fetch(`${env.gateway}/v1/infer/v1/chat/completions`, {
    method: 'POST',
    headers: { authorization: `Bearer ${state.key}`, 'content-type': 'application/json' },
    body: CHAT_BODY,
  });
  const text = await r.text();
  assert.equal(r.status, 200, `gateway answered ${r.status} ${text}`);
  assert.equal(JSON.parse(text).choices[0].message.content, 'Hi from upstream');
  assert.equal(upstream.requests.length, before + 1, 'the upstream got the request');
  const got = upstream.requests.at(-1);
  assert.equal(got.url, '/v1/chat/completions');
  assert.equal(got.body, CHAT_BODY);
  assert.equal(got.headers.authorization, undefined, 'Authorization is not forwarded');
  const secret = state.key.slice(20);
  for (const [name, value] of Object.entries(got.headers)) {
    assert.ok(!String(value).includes(secret), `header ${name} carries the key`);
  }

  // "I have stored the key": the secret leaves the page.
  await page.locator('#dismiss-key').click();
  assert.equal(await page.locator('#new-key').isHidden(), true);
  assert.ok(!(await page.content()).includes(secret), 'the secret is gone from the page');
});

usage.userSteps();

step(`revoke in the page: the gateway refuses the key within cache_ttl_seconds + 1 s (${CACHE_TTL_SECONDS + 1} s)`, async () => {
  let dialog = '';
  page.once('dialog', (d) => {
    dialog = d.message();
    d.accept();
  });
  const deleted = page.waitForResponse((r) => r.url() === `${env.admin}/v1/keys/${state.id}` && r.request().method() === 'DELETE');
  await page.getByTestId(`revoke-${state.id}`).click();
  const response = await deleted;
  const revokedAt = Date.now();
  assert.equal(response.status(), 204);
  assert.match(dialog, new RegExp(state.id), 'the confirmation names the key');

  let status = 0;
  let elapsed = 0;
  while (elapsed <= (CACHE_TTL_SECONDS + 3) * 1000) {
    const r = await fetch(`${env.gateway}/v1/infer/v1/chat/completions`, {
      method: 'POST',
      headers: { authorization: `Bearer ${state.key}`, 'content-type': 'application/json' },
      body: CHAT_BODY,
    });
    await r.arrayBuffer();
    status = r.status;
    elapsed = Date.now() - revokedAt;
    if (status === 401) break;
    await new Promise((r) => setTimeout(r, 100));
  }
  assert.equal(status, 401, `still ${status} ${elapsed} ms after the revoke`);
  assert.ok(elapsed <= (CACHE_TTL_SECONDS + 1) * 1000, `refused after ${elapsed} ms`);
  console.log(`# revoked key refused ${elapsed} ms after the DELETE answered`);

  const row = page.locator(`tr[data-key-id="${state.id}"]`);
  await page.locator(`tr[data-key-id="${state.id}"][data-status="revoked"]`).waitFor();
  assert.equal(await row.getByRole('button', { name: /Revoke/ }).count(), 0, 'no Revoke button on a revoked key');
  assert.match(await message(), /revoked/);
  await screenshot('key-revoked');
});

step('an API error is shown in the live region (over max_keys_per_owner: 409)', async () => {
  assert.equal(await page.locator('#message').getAttribute('aria-live'), 'polite');
  // Whether a revoked key still counts is the gateway's choice: create until refused.
  let refused = null;
  for (let i = 0; i <= MAX_KEYS_PER_OWNER && !refused; i += 1) {
    const r = await createKey(`extra ${i}`, 'infer');
    if (r.status() === 409) refused = r;
    else assert.equal(r.status(), 201, `POST /v1/keys: ${r.status()}`);
  }
  assert.ok(refused, `no 409 after ${MAX_KEYS_PER_OWNER + 1} keys`);
  await page.locator('#message[data-kind=error]').waitFor();
  const msg = await message();
  const body = await refused.json();
  assert.equal(body.error, 'conflict');
  assert.ok(msg.includes('409'), msg);
  if (body.message) assert.ok(msg.includes(body.message), `the server's message is shown: ${msg}`);
  await screenshot('error-shown');
});

step('sign out forgets the token: the key list and usage are gone and the page asks to sign in', async () => {
  await page.locator('#sign-out').click();
  await page.locator('#signed-out').waitFor({ state: 'visible' });
  assert.equal(await page.locator('#app').isHidden(), true);
  assert.equal(await page.locator('#keys-body tr').count(), 0);
  assert.equal(await page.locator('#usage-keys-body tr, #usage-charts svg').count(), 0, 'the usage numbers are gone too');
  await screenshot('signed-out');
});

step('a redirect back that this tab did not start is refused (state mismatch), and the URL cleaned', async () => {
  await page.goto(`${env.admin}/console/?code=forged-code&state=forged-state`);
  await page.locator('#message[data-kind=error]').waitFor();
  assert.match(await message(), /state mismatch/);
  assert.equal(page.url(), `${env.admin}/console/`);
  assert.equal(await page.locator('#app').isHidden(), true);
});

step('a forged redirect back (an error and its description, with a wrong or no state) shows nothing of it', async () => {
  const forged = 'Your account is locked. Call +1-555-0100 now';
  for (const state of ['&state=forged-state', '']) {
    const query = `error=access_denied&error_description=${encodeURIComponent(forged)}${state}`;
    await page.goto(`${env.admin}/console/?${query}`);
    await page.locator('#message[data-kind=error]').waitFor();
    const msg = await message();
    assert.match(msg, /state mismatch/, msg);
    const text = await page.locator('body').innerText();
    for (const part of ['locked', '555-0100', 'access_denied']) {
      assert.ok(!text.includes(part), `the page shows the forged "${part}": ${msg}`);
    }
    assert.equal(page.url(), `${env.admin}/console/`);
    assert.equal(await page.locator('#app').isHidden(), true);
  }
  await screenshot('forged-error-refused');
});

step("an administrator (login `admin`, admin scope requested where offered) sees every user's keys", async () => {
  await context.close();
  await newPage(); // no provider session: a fresh login
  await signIn('admin', { admin: true, base: env.adminOffered });
  assert.match(await page.locator('#who').textContent(), /administrator/);
  const row = page.locator(`tr[data-key-id="${state.id}"]`);
  await row.waitFor();
  assert.ok((await row.textContent()).includes('alice'), 'alice is shown as the owner');
  await screenshot('admin-view');
});

usage.adminSteps();

budgets.steps();

teams.steps();
