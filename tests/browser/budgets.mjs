// The console's budgets in the browser test (tests/browser/console.test.mjs registers these
// steps after its own and hands over its page, state and helpers): an administrator sets an
// owner's budget (PUT /v1/owners/{sub}/budget), tokens and cost, in the page; that owner
// (`bob`, a fresh user) sees it at the top, creates a key with a budget, calls the metered
// service with it through the gateway, and sees the tokens the upstream reported as
// "used / budget · left" on the key and on itself; sets the key's token and cost budget in its
// form (PATCH), is refused one above its own budget with the API's 403 message, and clears it;
// the administrator then sees the owner's use and clears the owner's budget. The gateways
// enforce budgets ([budgets] in processes.mjs).
import assert from 'node:assert/strict';

import { costMicros, costText } from './processes.mjs';

const OWNER = 'bob';
const OWNER_BUDGET = { tokens_per_day: 5000, tokens_per_month: 100000, requests_per_day: 50, cost_per_month: 25.5 };
const fmt = (n) => new Intl.NumberFormat('en').format(n);
// "1,200 left", or "none left" once used up.
const left = (limit, used) => (used >= limit ? 'none left' : `${fmt(limit - used)} left`);

// Waits until `locator`'s texts (one per match) are `expected`, then asserts them.
async function texts(locator, expected, what) {
  const deadline = Date.now() + 5000;
  let got = [];
  for (;;) {
    got = (await locator.allTextContents()).map((t) => t.trim());
    if (JSON.stringify(got) === JSON.stringify(expected) || Date.now() > deadline) break;
    await new Promise((r) => setTimeout(r, 100));
  }
  assert.deepEqual(got, expected, what);
}

const keyLines = (page, id) => page.locator(`tr[data-key-id="${id}"] td.budget`).locator('.budget-text, .empty');
const ownLines = (page) => page.locator('#own-budget .budget-text');
const ownerLines = (page) => page.locator('#owner-result-view .budget-text');
// The Budget column must not push the key table out of its panel (the page itself would not
// scroll: the panel is narrower than a desktop window).
async function tableFits(page) {
  const { right, inside } = await page.evaluate(() => {
    const table = document.getElementById('keys-table');
    const panel = table.closest('section').getBoundingClientRect();
    const pad = parseFloat(getComputedStyle(table.closest('section')).paddingRight);
    return { right: table.getBoundingClientRect().right, inside: panel.right - pad };
  });
  assert.ok(right <= inside + 0.5, `the key table ends at ${right} px, its panel's content at ${inside} px`);
}

const apiCall = (page, method, path) => page.waitForResponse(
  (r) => r.request().method() === method && new URL(r.url()).pathname === path,
);

// `ctx`: { step, page() (the current one), env, state, screenshot, createKey, noHorizontalScroll,
// signIn(login, opts), freshPage() (a new browser context: no provider session), flushSeconds }.
export function budgetSteps(ctx) {
  const { step, env, state, screenshot, createKey, noHorizontalScroll, signIn, freshPage, flushSeconds } = ctx;
  const { page } = ctx;
  const ownerPath = `/v1/owners/${OWNER}/budget`;
  const money = (units) => costText(env.currency, Math.round(units * 1e6));
  // OWNER_BUDGET as the owner's panel shows it, nothing used yet.
  const ownerBudgetLines = () => ['tokens this hour: 0 · no limit', 'tokens today: 0 / 5,000 · 5,000 left · resets 00:00 UTC',
    `tokens this month: 0 / 100,000 · 100,000 left · resets ${monthEnd()}`, 'requests today: 0 / 50 · 50 left · resets 00:00 UTC',
    `cost today: ${money(0)} · no limit`, `cost this month: ${money(0)} / ${money(25.5)} · ${money(25.5)} left · resets ${monthEnd()}`];

  // The administrator's lookup of OWNER, answered.
  async function lookUpOwner() {
    await page().getByLabel(/^Owner/).fill(OWNER);
    const got = apiCall(page(), 'GET', ownerPath);
    await page().getByRole('button', { name: 'Look up', exact: true }).click();
    assert.equal((await got).status(), 200);
    await page().locator('#owner-result').waitFor();
  }

  async function signInAs(login, opts) {
    await freshPage();
    const isToken = (r) => r.url().startsWith(env.issuer) && r.request().method() === 'POST' && r.url().includes('/token');
    const token = page().waitForResponse(isToken, { timeout: 60_000 });
    await signIn(login, opts);
    return (await (await token).json()).access_token;
  }

  function steps() {
    step("budgets: an administrator sets an owner's budget in the console (PUT)", async () => {
      // The administrator of the usage steps is still signed in, on the gateway that offers it.
      const panel = page().getByTestId('owner-admin');
      assert.equal(await panel.isVisible(), true, 'the administrator part of the budget panel is shown');
      await lookUpOwner();
      assert.equal(await page().getByTestId('owner-result-view').getByTestId('owner-budget-none').isVisible(), true, 'a new owner has no budget');
      await texts(ownerLines(page()), ['tokens this hour: 0 · no limit', 'tokens today: 0 · no limit',
        'tokens this month: 0 · no limit', 'requests today: 0 · no limit', `cost today: ${money(0)} · no limit`,
        `cost this month: ${money(0)} · no limit`], 'a new owner uses nothing');

      const form = page().getByTestId('owner-budget-form');
      await form.getByLabel('Tokens per day').fill('5,000'); // thousands separators are read as such
      await form.getByLabel('Tokens per month').fill(String(OWNER_BUDGET.tokens_per_month));
      await form.getByLabel('Requests per day').fill(String(OWNER_BUDGET.requests_per_day));
      assert.equal(await form.getByLabel(`Cost per month (${env.currency})`).count(), 1, 'the cost fields name the currency');
      await form.getByLabel('Cost per day').fill('1.2345678'); // more decimals than the gateway keeps
      await page().getByRole('button', { name: 'Save owner budget' }).click();
      await page().locator('#owner-status[data-kind=error]').waitFor();
      assert.match(await page().getByTestId('owner-status').textContent(), /Cost per day must be an amount .* at most 6 decimals/);
      assert.equal(await page().evaluate(() => document.activeElement?.name), 'cost_per_day', 'the field is focused');
      await form.getByLabel('Cost per day').fill('');
      await form.getByLabel('Cost per month').fill('25.50');
      const put = apiCall(page(), 'PUT', ownerPath);
      await page().getByRole('button', { name: 'Save owner budget' }).click();
      const answer = await put;
      assert.equal(answer.status(), 200, await answer.text());
      assert.deepEqual(JSON.parse(answer.request().postData()), { budget: OWNER_BUDGET });
      assert.deepEqual((await answer.json()).budget, OWNER_BUDGET);
      await texts(ownerLines(page()), ownerBudgetLines(), 'the owner budget as set');
      assert.match(await page().getByTestId('owner-status').textContent(), /Budget of bob saved/);
      assert.equal(await form.getByLabel('Tokens per day').inputValue(), '5000', 'the form shows the budget as stored');
      assert.equal(await form.getByLabel('Cost per month').inputValue(), '25.5');
      await page().getByTestId('budget').scrollIntoViewIfNeeded();
      await screenshot('budget-admin-owner-set');
    });

    step('budgets: the owner sees its budget at the top, and a failed read shows the API\'s message', async () => {
      state.bobToken = await signInAs(OWNER);
      assert.equal(await page().getByTestId('owner-admin').isHidden(), true, 'no administrator part for a user');
      await texts(ownLines(page()), ownerBudgetLines(), 'the owner\'s own budget at the top');
      const bar = page().getByRole('progressbar', { name: 'Your budget: tokens today' });
      assert.equal(await bar.getAttribute('aria-valuemax'), '5000');
      assert.equal(await bar.getAttribute('aria-valuenow'), '0');

      // A real refusal: the page's read sent for another owner's budget (403 for a user).
      await page().route((url) => url.pathname === ownerPath, (route) => route.continue({
        url: route.request().url().replace(ownerPath, '/v1/owners/alice/budget'),
      }));
      try {
        const got = page().waitForResponse((r) => new URL(r.url()).pathname === '/v1/owners/alice/budget');
        await page().getByRole('button', { name: 'Refresh budget' }).click();
        const answer = await got;
        assert.equal(answer.status(), 403);
        const { message } = await answer.json();
        await page().locator('#budget-status[data-kind=error]').waitFor();
        const shown = await page().getByTestId('budget-status').textContent();
        assert.ok(message && shown.includes(message) && shown.includes('HTTP 403'), `the API's message is shown: ${shown}`);
        assert.equal(await ownLines(page()).count(), 0, 'no stale numbers beside the error');
      } finally {
        await page().unrouteAll();
      }
      await page().getByRole('button', { name: 'Refresh budget' }).click();
      await texts(ownLines(page()).nth(1), ['tokens today: 0 / 5,000 · 5,000 left · resets 00:00 UTC'], 'a later read clears the error');
    });

    step('budgets: a key created with a budget shows used / budget; one above the owner budget is refused (403)', async () => {
      const fields = page().getByTestId('create-budget-fields');
      await fields.getByLabel('Tokens per day').fill('9000');
      let response = await createKey('too big', 'chatx');
      assert.equal(response.status(), 403, `POST /v1/keys: ${response.status()}`);
      const { message } = await response.json();
      assert.match(message, /above your own budget/);
      await page().locator('#message[data-kind=error]').waitFor();
      const shown = await page().locator('#message').textContent();
      assert.ok(shown.includes(message) && shown.includes('HTTP 403'), `the API's message is shown: ${shown}`);

      await fields.getByLabel('Tokens per day').fill('2000');
      response = await createKey('budgeted key', 'chatx');
      assert.equal(response.status(), 201, `POST /v1/keys: ${response.status()}`);
      assert.deepEqual(JSON.parse(response.request().postData()).budget, { tokens_per_day: 2000 });
      state.budgetKey = await page().locator('#new-key-value').inputValue();
      state.budgetId = state.budgetKey.slice(3, 19);
      await page().locator('#dismiss-key').click();
      await texts(keyLines(page(), state.budgetId), ['tokens today: 0 / 2,000 · 2,000 left · resets 00:00 UTC'], 'the new key\'s budget');
      assert.equal(await fields.getByLabel('Tokens per day').inputValue(), '', 'the form is emptied after a create');
    });

    step('budgets: real requests through the gateway show as used / budget on the key and the owner', async () => {
      state.budgetTokens = 0;
      state.budgetCost = 0; // micros, what the cost windows count (0 while nothing is priced)
      for (let i = 0; i < 2; i += 1) {
        const r = await fetch(`${env.gateway}/v1/chatx/v1/chat/completions`, {
          method: 'POST',
          headers: { authorization: `Bearer ${state.budgetKey}`, 'content-type': 'application/json' },
          body: JSON.stringify({ model: 'alpha3.6-vl', max_tokens: 64, messages: [{ role: 'user', content: `budget test ${i}` }] }),
        });
        const text = await r.text();
        assert.equal(r.status, 200, `gateway answered ${r.status} ${text}`);
        // Budgets are enforced on the data plane: the headers name the tightest window, the key's
        // or, until the new key's budget reaches the gateway (within about a second), the owner's.
        assert.ok(['2000', '5000'].includes(r.headers.get('x-ratelimit-limit-tokens')), 'budgets are enforced');
        const { usage } = JSON.parse(text);
        state.budgetTokens += usage.prompt_tokens + usage.completion_tokens;
        state.budgetCost += costMicros('alpha3.6-vl', usage);
      }
      assert.ok(state.budgetTokens > 0, 'the upstream reported tokens');
      // Past [metering] flush_seconds, then until the key listing (the view's source) has them.
      await new Promise((r) => setTimeout(r, flushSeconds * 1000 + 300));
      const deadline = Date.now() + 10_000;
      for (;;) {
        const r = await fetch(`${env.admin}/v1/keys`, { headers: { authorization: `Bearer ${state.bobToken}` } });
        const key = ((await r.json()).keys || []).find((k) => k.id === state.budgetId);
        if (key?.used?.tokens_per_day === state.budgetTokens) break;
        assert.ok(Date.now() < deadline, `the listing did not get the tokens: ${JSON.stringify(key)}`);
        await new Promise((r) => setTimeout(r, 250));
      }

      const listed = apiCall(page(), 'GET', '/v1/keys');
      await page().locator('#refresh-keys').click();
      await listed;
      const used = fmt(state.budgetTokens);
      const t = state.budgetTokens;
      await texts(keyLines(page(), state.budgetId), [`tokens today: ${used} / 2,000 · ${left(2000, t)} · resets 00:00 UTC`], 'the key\'s use');
      const bar = page().getByRole('progressbar', { name: 'Key budgeted key: tokens today' });
      assert.equal(await bar.getAttribute('aria-valuenow'), String(state.budgetTokens));
      assert.equal(await bar.getAttribute('aria-valuemax'), '2000');
      await texts(ownLines(page()).nth(1), [`tokens today: ${used} / 5,000 · ${left(5000, t)} · resets 00:00 UTC`], 'the owner\'s use');
      await texts(ownLines(page()).nth(3), ['requests today: 2 / 50 · 48 left · resets 00:00 UTC'], 'the owner\'s requests');
      const spent = state.budgetCost;
      await texts(ownLines(page()).nth(5), [`cost this month: ${money(spent / 1e6)} / ${money(25.5)} · ${money((25_500_000 - spent) / 1e6)} left · resets ${monthEnd()}`],
        'the owner\'s cost, with what is left');
      await tableFits(page());

      await page().getByTestId('budget').scrollIntoViewIfNeeded();
      await screenshot('budget-owner-key-used');
      await page().emulateMedia({ colorScheme: 'dark' });
      await screenshot('budget-owner-key-used-dark');
      await page().emulateMedia({ colorScheme: 'light' });
      await noHorizontalScroll(360);
      await noHorizontalScroll(390);
      await screenshot('budget-owner-phone-390');
      await page().setViewportSize({ width: 1280, height: 800 });
    });

    step("budgets: set a key's budget in its form (PATCH); above the owner's budget the API's 403 message is shown", async () => {
      const id = state.budgetId;
      const open = page().getByTestId(`budget-edit-${id}`);
      await open.click();
      assert.equal(await open.getAttribute('aria-expanded'), 'true');
      const editor = page().getByTestId(`budget-editor-${id}`);
      assert.equal(await editor.getByLabel('Tokens per day').inputValue(), '2000', 'the form shows the current budget');
      await editor.getByLabel('Tokens per hour').fill('1000');
      await editor.getByLabel('Tokens per day').fill('3000');
      await editor.getByLabel('Cost per day').fill('1.25');
      let patched = apiCall(page(), 'PATCH', `/v1/keys/${id}`);
      await editor.getByRole('button', { name: 'Save budget' }).click();
      let answer = await patched;
      assert.equal(answer.status(), 200, await answer.text());
      assert.deepEqual(JSON.parse(answer.request().postData()), { budget: { tokens_per_hour: 1000, tokens_per_day: 3000, cost_per_day: 1.25 } });
      const t = state.budgetTokens;
      const used = fmt(t);
      const hourLine = new RegExp(`^tokens this hour: ${used} / 1,000 · ${left(1000, t)} · resets \\d\\d:00 UTC$`);
      const dayLine = `tokens today: ${used} / 3,000 · ${left(3000, t)} · resets 00:00 UTC`;
      await texts(keyLines(page(), id).nth(1), [dayLine], 'the new day budget');
      assert.match((await keyLines(page(), id).first().textContent()).trim(), hourLine);
      const spent = state.budgetCost;
      await texts(keyLines(page(), id).nth(2), [`cost today: ${money(spent / 1e6)} / ${money(1.25)} · ${money((1_250_000 - spent) / 1e6)} left · resets 00:00 UTC`],
        'the key\'s cost budget, with what is left');
      const costBar = page().getByRole('progressbar', { name: 'Key budgeted key: cost today' });
      assert.equal(await costBar.getAttribute('aria-valuemax'), '1.25');
      assert.match(await page().locator('#message').textContent(), /Budget of key "budgeted key" .* saved/);

      // Above the owner's 5,000 a day: refused, with the API's message in the key's form.
      await open.click();
      await editor.getByLabel('Tokens per day').fill('6000');
      patched = apiCall(page(), 'PATCH', `/v1/keys/${id}`);
      await editor.getByRole('button', { name: 'Save budget' }).click();
      answer = await patched;
      assert.equal(answer.status(), 403);
      const { message } = await answer.json();
      assert.match(message, /tokens_per_day 6000 is above your own budget/);
      const alert = editor.getByRole('alert');
      await texts(alert, [`Could not save the budget: ${message} (HTTP 403 forbidden)`], 'the API\'s message in the form');
      await texts(keyLines(page(), id).nth(1), [dayLine], 'the budget is unchanged');
      await editor.scrollIntoViewIfNeeded();
      await screenshot('budget-key-refused');
      await noHorizontalScroll(390);
      await screenshot('budget-key-refused-phone-390');
      await page().setViewportSize({ width: 1280, height: 800 });
    });

    step("budgets: clear a key's budget (PATCH null): the key shows no budget", async () => {
      const id = state.budgetId;
      const editor = page().getByTestId(`budget-editor-${id}`);
      const patched = apiCall(page(), 'PATCH', `/v1/keys/${id}`);
      await editor.getByRole('button', { name: 'Clear budget' }).click();
      const answer = await patched;
      assert.equal(answer.status(), 200, await answer.text());
      assert.deepEqual(JSON.parse(answer.request().postData()), { budget: null });
      assert.equal((await answer.json()).budget, null);
      await texts(keyLines(page(), id), ['no budget'], 'a cleared key');
      assert.equal(await editor.count(), 0, 'the form is closed');
      await tableFits(page());
      assert.match(await page().locator('#message').textContent(), /cleared/);
      await screenshot('budget-key-cleared');
    });

    step("budgets: an administrator sees the owner's use and clears its budget (PUT null)", async () => {
      await signInAs('admin', { admin: true, base: env.adminOffered });
      await lookUpOwner();
      await tableFits(page()); // every owner's keys, a revoked one among them
      const used = fmt(state.budgetTokens);
      await texts(ownerLines(page()).nth(1), [`tokens today: ${used} / 5,000 · ${left(5000, state.budgetTokens)} · resets 00:00 UTC`], 'the owner\'s use, to the administrator');
      const put = apiCall(page(), 'PUT', ownerPath);
      await page().getByRole('button', { name: 'Clear owner budget' }).click();
      const answer = await put;
      assert.equal(answer.status(), 200, await answer.text());
      assert.deepEqual(JSON.parse(answer.request().postData()), { budget: null });
      await page().getByTestId('owner-result-view').getByTestId('owner-budget-none').waitFor();
      await texts(ownerLines(page()).nth(1), [`tokens today: ${used} · no limit`], 'no limit once cleared');
      assert.match(await page().getByTestId('owner-status').textContent(), /cleared/);
      assert.equal(await page().getByTestId('owner-budget-form').getByLabel('Tokens per day').inputValue(), '');
      await page().getByTestId('budget').scrollIntoViewIfNeeded();
      await screenshot('budget-admin-owner-cleared');
    });
  }

  return { steps, signInAs };
}

// When this calendar month's window ends, as the page writes it.
function monthEnd(now = Date.now()) {
  const d = new Date(now);
  const end = new Date(Date.UTC(d.getUTCFullYear(), d.getUTCMonth() + 1, 1));
  return end.getTime() - now <= 86_400_000 ? '00:00 UTC' : `${end.toISOString().slice(0, 10)} 00:00 UTC`;
}
