// The console's usage view in the browser test (tests/browser/console.test.mjs registers these
// steps in its order and hands over its page, state and helpers): a key's calls to a metered
// service, whose upstream states its token counts, shown today, this month and in 30-day charts;
// their cost at the test's price table beside the tokens, and a key whose requests had no price
// shown as unpriced, never as a cost of 0, in the table and in the chart switched to cost;
// the API's own message on a failed report; an administrator's owner totals.
import assert from 'node:assert/strict';

import { costMicros, costText } from './processes.mjs';

// What the usage view shows for one row (a key's or an owner's): the visible numbers.
async function usageRow(page, testid) {
  const row = page.getByTestId(testid);
  await row.waitFor();
  const text = async (cell) => (await row.getByTestId(cell).textContent()).trim();
  return {
    tokensToday: await text('tokens-today'),
    requestsToday: await text('requests-today'),
    costToday: await text('cost-today'),
    tokensMonth: await text('tokens-month'),
    requestsMonth: await text('requests-month'),
    costMonth: await text('cost-month'),
  };
}

// A chart's days as drawn: [{ day, tokens, requests, cost, unpriced, bars }] in order; `cost`
// null where none is known, `bars` the classes of its shapes.
async function chartDays(page, testid) {
  return page.getByTestId(testid).locator('svg g.day').evaluateAll((gs) => gs.map((g) => ({
    day: g.dataset.day,
    tokens: Number(g.dataset.tokens),
    requests: Number(g.dataset.requests),
    cost: g.dataset.cost === '' ? null : Number(g.dataset.cost),
    unpriced: Number(g.dataset.unpriced),
    bars: [...g.querySelectorAll('rect')].map((r) => r.getAttribute('class')),
  })));
}

// The last 30 UTC days, oldest first, as the chart must show them.
function last30Days() {
  const now = Date.now();
  return Array.from({ length: 30 }, (_, i) => new Date(now - (29 - i) * 86_400_000).toISOString().slice(0, 10));
}

function assertChart(days, today, tokens, what) {
  assert.deepEqual(days.map((d) => d.day), last30Days(), `${what}: one element per day, the last 30 UTC days`);
  for (const d of days) {
    assert.equal(d.tokens, d.day === today ? tokens : 0, `${what}: tokens drawn on ${d.day}`);
  }
}

async function refreshUsage(page) {
  const answered = page.waitForResponse((r) => new URL(r.url()).pathname === '/v1/usage');
  await page.locator('#refresh-usage').click();
  const r = await answered;
  await page.waitForFunction(() => !document.getElementById('usage-status').textContent.startsWith('Loading'));
  return r;
}

// `ctx`: { step, page() (the current one), env, state, upstream() (the recording one), screenshot,
// createKey, noHorizontalScroll, consoleRequests, flushSeconds }.
export function usageSteps(ctx) {
  const { step, env, state, screenshot, createKey, noHorizontalScroll, consoleRequests, flushSeconds } = ctx;
  const { page, upstream } = ctx;

  function userSteps() {
    step('usage: a key used on a metered service shows the tokens the upstream reported, today, this month and in 30-day charts', async () => {
      assert.equal(await page().locator('#usage').isVisible(), true, 'the usage view is on the page');

      const response = await createKey('usage key', 'chatx');
      assert.equal(response.status(), 201, `POST /v1/keys: ${response.status()}`);
      const key = await page().locator('#new-key-value').inputValue();
      state.usageId = key.slice(3, 19);
      await page().locator('#dismiss-key').click();

      // Two chat completions through the data plane; the upstream states what each one used.
      state.usageTokens = 0;
      state.usageCost = null; // micros at the test's price table
      state.usageRequests = 2;
      for (let i = 0; i < state.usageRequests; i += 1) {
        const r = await fetch(`${env.gateway}/v1/chatx/v1/chat/completions`, {
          method: 'POST',
          headers: { authorization: `Bearer ${key}`, 'content-type': 'application/json' },
          body: JSON.stringify({ model: 'alpha3.6-vl', messages: [{ role: 'user', content: `usage test ${i}` }] }),
        });
        const text = await r.text();
        assert.equal(r.status, 200, `gateway answered ${r.status} ${text}`);
        const { usage } = JSON.parse(text);
        assert.ok(usage.prompt_tokens > 0 && usage.completion_tokens > 0, `the upstream reports usage: ${text}`);
        state.usageTokens += usage.prompt_tokens + usage.completion_tokens;
        state.usageCost = (state.usageCost || 0) + costMicros('alpha3.6-vl', usage);
      }
      console.log(`# the upstream reported ${state.usageTokens} tokens for ${state.usageRequests} requests`);

      // Past [metering] flush_seconds, then until the ledger has both (the view's source, asked directly).
      await new Promise((r) => setTimeout(r, flushSeconds * 1000 + 500));
      const deadline = Date.now() + 10_000;
      for (;;) {
        const r = await fetch(`${env.admin}/v1/usage?group_by=key`, { headers: { authorization: `Bearer ${state.accessToken}` } });
        const rows = (await r.json()).usage || [];
        if (rows.some((row) => row.key === state.usageId && row.requests === state.usageRequests)) break;
        assert.ok(Date.now() < deadline, `the ledger did not get the requests: ${JSON.stringify(rows)}`);
        await new Promise((r) => setTimeout(r, 250));
      }

      const answer = await refreshUsage(page());
      assert.equal(answer.status(), 200);
      const today = new Date().toISOString().slice(0, 10);
      const tokens = String(state.usageTokens);
      const requests = String(state.usageRequests);
      const cost = costText(env.currency, state.usageCost);
      assert.match(cost, /^€0\.\d{2,6}$/, 'a priced key costs something, in the configured currency');
      assert.deepEqual(await usageRow(page(), `usage-key-${state.usageId}`),
        { tokensToday: tokens, requestsToday: requests, costToday: cost, tokensMonth: tokens, requestsMonth: requests, costMonth: cost });
      assert.match(await page().getByTestId(`usage-key-${state.usageId}`).textContent(), /usage key/, 'the key is named');
      // The first key called a service without `api`: requests counted, no tokens read, and
      // with no model no price: its cost is unknown ("—", each request counted unpriced), not 0.
      state.inferRequests = upstream().requests.length;
      const infer = String(state.inferRequests);
      const unpriced = state.inferRequests;
      const inferCost = costText(env.currency, null, unpriced);
      assert.deepEqual(await usageRow(page(), `usage-key-${state.id}`),
        { tokensToday: '0', requestsToday: infer, costToday: inferCost, tokensMonth: '0', requestsMonth: infer, costMonth: inferCost });
      assert.equal(inferCost, `— · ${infer} unpriced`);
      const all = String(state.usageRequests + state.inferRequests);
      const allCost = costText(env.currency, state.usageCost, unpriced);
      assert.deepEqual(await usageRow(page(), 'usage-total'),
        { tokensToday: tokens, requestsToday: all, costToday: allCost, tokensMonth: tokens, requestsMonth: all, costMonth: allCost });

      assertChart(await chartDays(page(), `usage-chart-${state.usageId}`), today, state.usageTokens, 'the key chart');
      assertChart(await chartDays(page(), 'usage-chart-total'), today, state.usageTokens, 'the total chart');
      assert.equal(await page().getByTestId('usage-chart-total').locator('.legend li').count(), 2, 'a legend of prompt and completion');
      assert.ok((await page().getByTestId('usage-chart-total').locator('svg text.axis').count()) >= 5, 'axis labels');
      assert.equal(await page().locator('#usage-owners').isHidden(), true, 'no owners table for a user');
      assert.equal(await page().getByTestId('usage-chart-total').locator('svg').getAttribute('data-measure'), 'tokens', 'tokens first');

      await page().getByTestId('usage').scrollIntoViewIfNeeded();
      await screenshot('usage-view-desktop');
      await page().emulateMedia({ colorScheme: 'dark' });
      await screenshot('usage-view-dark');
      await page().emulateMedia({ colorScheme: 'light' });
      await noHorizontalScroll(390);
      await page().waitForTimeout(300); // the charts are redrawn at the new width
      await noHorizontalScroll(390);
      await screenshot('usage-view-phone-390');
      await page().setViewportSize({ width: 1280, height: 800 });
    });

    step('usage: the 30-day charts switched to cost show it in the currency, and requests without a price as unknown, not 0', async () => {
      await page().getByTestId('usage-measure-cost').check();
      const total = page().getByTestId('usage-chart-total');
      await total.locator('svg[data-measure="cost"]').waitFor();
      const today = new Date().toISOString().slice(0, 10);
      const unpriced = state.inferRequests;

      // The priced key: its cost on today's bar, every other day a zero tick.
      for (const d of await chartDays(page(), `usage-chart-${state.usageId}`)) {
        if (d.day !== today) {
          assert.deepEqual([d.cost, d.bars], [null, ['bar-zero']], `a quiet day, ${d.day}`);
        } else {
          assert.deepEqual([d.cost, d.unpriced, d.bars], [state.usageCost / 1e6, 0, ['bar-cost']], 'the priced key\'s day');
        }
      }
      // The key whose requests had no price: drawn as unknown (dashed), never as a zero tick.
      const inferDay = (await chartDays(page(), `usage-chart-${state.id}`)).find((d) => d.day === today);
      assert.deepEqual([inferDay.cost, inferDay.unpriced, inferDay.bars], [null, unpriced, ['bar-unpriced']], 'the unpriced key\'s day');
      const totalDay = (await chartDays(page(), 'usage-chart-total')).find((d) => d.day === today);
      assert.equal(totalDay.cost, state.usageCost / 1e6, 'the total chart\'s cost');
      assert.equal(totalDay.unpriced, unpriced);

      const axis = await total.locator('svg text.axis').allTextContents();
      assert.ok(axis.includes(costText(env.currency, 0)), `the cost axis is in the currency: ${axis}`);
      assert.deepEqual(await total.locator('.legend li').allTextContents(),
        [`Cost (${env.currency})`, 'Requests with no price: cost unknown']);
      assert.match(await total.locator('svg desc').textContent(), /most on .* 1 day\(s\) with requests of unknown cost/);
      await page().getByTestId('usage').scrollIntoViewIfNeeded();
      await screenshot('usage-view-cost');
      await noHorizontalScroll(390);
      await page().waitForTimeout(300); // redrawn at the new width, still in cost
      assert.equal(await total.locator('svg').getAttribute('data-measure'), 'cost');
      await screenshot('usage-view-cost-phone-390');
      await page().setViewportSize({ width: 1280, height: 800 });

      await page().getByTestId('usage-measure-tokens').check();
      await total.locator('svg[data-measure="tokens"]').waitFor();
      assertChart(await chartDays(page(), 'usage-chart-total'), today, state.usageTokens, 'back to tokens');
    });

    step("a failed usage fetch shows the API's error message in the usage view", async () => {
      // A real refusal from the gateway: the page's request with `from` moved after `to`.
      await page().route((url) => url.pathname === '/v1/usage', (route) => {
        const url = new URL(route.request().url());
        url.searchParams.set('from', '2999-01-01');
        return route.continue({ url: url.href });
      });
      try {
        const answer = await refreshUsage(page());
        assert.equal(answer.status(), 400);
        const body = await answer.json();
        await page().locator('#usage-status[data-kind=error]').waitFor();
        const shown = (await page().locator('#usage-status').textContent()).trim();
        assert.ok(body.message && shown.includes(body.message), `the API's message is shown: ${shown} (${JSON.stringify(body)})`);
        assert.ok(shown.includes('HTTP 400'), shown);
        await page().getByTestId('usage').scrollIntoViewIfNeeded();
        await screenshot('usage-error');
      } finally {
        await page().unrouteAll();
      }
      await refreshUsage(page());
      assert.notEqual(await page().locator('#usage-status').getAttribute('data-kind'), 'error', 'a later load clears the error');
      assert.equal(await page().getByTestId(`usage-key-${state.usageId}`).isVisible(), true);
    });
  }

  function adminSteps() {
    step("an administrator's usage view shows every owner's totals and the total chart", async () => {
      // The first gateway answered the revoke step's polling: what reached the upstream was charged.
      const requests = String(state.usageRequests + upstream().requests.length);
      const tokens = String(state.usageTokens);
      const cost = costText(env.currency, state.usageCost, upstream().requests.length);
      await page().getByTestId('usage-owners').waitFor();
      assert.deepEqual(await usageRow(page(), 'usage-owner-alice'),
        { tokensToday: tokens, requestsToday: requests, costToday: cost, tokensMonth: tokens, requestsMonth: requests, costMonth: cost });
      assertChart(await chartDays(page(), 'usage-chart-everyone'), new Date().toISOString().slice(0, 10), state.usageTokens, 'the everyone chart');
      // The administrator itself owns no key and made no call: its own part says so.
      assert.equal(await page().getByTestId('usage-empty').isVisible(), true, 'the empty state for the administrator\'s own keys');
      await page().getByTestId('usage').scrollIntoViewIfNeeded();
      await screenshot('admin-usage');

      // No CDN, no outside script or font: a console page talked to its own listener and the issuer only.
      assert.ok(consoleRequests.some((r) => new URL(r.to).pathname === '/v1/usage'), 'usage requests were seen');
      for (const { from, to } of consoleRequests) {
        const origin = new URL(to).origin;
        assert.ok(origin === new URL(from).origin || origin === env.issuer, `${from} requested ${to}`);
      }
    });
  }

  return { userSteps, adminSteps };
}
