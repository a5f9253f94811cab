// The console's teams in the browser test (tests/browser/console.test.mjs registers these steps
// after the budget steps and hands over its page, state and helpers): the administrator puts
// the owner `bob` in a team (PUT /v1/owners/{sub}/team) and sets the team's token and cost
// budget (PUT /v1/teams/{team}/budget) in the page; bob then sees its team and what is left of
// the team's budget, and after a real request through the gateway, the team's use and what is
// left of it; the administrator takes bob out of the team again. The team's name is user text
// that looks like HTML: the page must show it as text, never as markup.
import assert from 'node:assert/strict';

import { costMicros, costText } from './processes.mjs';

const OWNER = 'bob';
const TEAM = 'Platform <b>ops</b> & "co"';
const TEAM_BUDGET = { tokens_per_day: 10000, cost_per_day: 5, cost_per_month: 120.5 };
const fmt = (n) => new Intl.NumberFormat('en').format(n);

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

const apiCall = (page, method, path) => page.waitForResponse(
  (r) => r.request().method() === method && new URL(r.url()).pathname === path,
);

// When this calendar month's window ends, as the page writes it.
function monthEnd(now = Date.now()) {
  const d = new Date(now);
  const end = new Date(Date.UTC(d.getUTCFullYear(), d.getUTCMonth() + 1, 1));
  return end.getTime() - now <= 86_400_000 ? '00:00 UTC' : `${end.toISOString().slice(0, 10)} 00:00 UTC`;
}

// `ctx`: { step, page() (the current one), env, state, screenshot, noHorizontalScroll,
// signInAs(login, opts) (a fresh browser context, signed in; the access token), flushSeconds }.
export function teamSteps(ctx) {
  const { step, env, state, screenshot, noHorizontalScroll, signInAs, flushSeconds } = ctx;
  const { page } = ctx;
  const memberPath = `/v1/owners/${OWNER}/team`;
  const budgetPath = `/v1/teams/${encodeURIComponent(TEAM)}/budget`;
  const money = (micros) => costText(env.currency, micros);

  // The team's budget as a panel shows it, `tokens` and `micros` used today (and this month).
  function teamLines(tokens, micros) {
    const t = fmt(tokens);
    return [
      `tokens this hour: ${t} · no limit`,
      `tokens today: ${t} / 10,000 · ${fmt(10000 - tokens)} left · resets 00:00 UTC`,
      `tokens this month: ${t} · no limit`,
      `requests today: ${fmt(state.teamRequests || 0)} · no limit`,
      `cost today: ${money(micros)} / ${money(5_000_000)} · ${money(5_000_000 - micros)} left · resets 00:00 UTC`,
      `cost this month: ${money(micros)} / ${money(120_500_000)} · ${money(120_500_000 - micros)} left · resets ${monthEnd()}`,
    ];
  }

  // No element came from the team's name: it is text everywhere.
  async function noMarkup(what) {
    assert.equal(await page().locator('#budget b').count(), 0, `${what}: the team's name was read as HTML`);
  }

  function steps() {
    step('teams: an administrator puts an owner in a team (PUT /v1/owners/{sub}/team)', async () => {
      // The administrator of the budget steps is still signed in, with bob looked up.
      const form = page().getByTestId('owner-team-form');
      await form.waitFor();
      await texts(page().getByTestId('owner-team-current'), [`${OWNER} is in no team.`], 'bob starts in no team');
      // Saving an empty team is refused in the page, with the way out named.
      await page().getByTestId('owner-team-save').click();
      await page().locator('#owner-team-status[data-kind=error]').waitFor();
      assert.match(await page().getByTestId('owner-team-status').textContent(), /Enter a team, or remove the owner/);

      await form.getByLabel('Team', { exact: true }).fill(TEAM);
      const put = apiCall(page(), 'PUT', memberPath);
      await page().getByTestId('owner-team-save').click();
      const answer = await put;
      assert.equal(answer.status(), 200, await answer.text());
      assert.deepEqual(JSON.parse(answer.request().postData()), { team: TEAM });
      assert.deepEqual(await answer.json(), { owner: OWNER, team: TEAM });
      await texts(page().getByTestId('owner-team-status'), [`${OWNER} is now in team ${TEAM}.`], 'saved, the name as text');
      await texts(page().getByTestId('owner-team-current'), [`${OWNER} is in team ${TEAM}.`], 'the current team');
      assert.equal(await page().getByTestId('team-name').inputValue(), TEAM, 'the team lookup is filled in, ready');
      await noMarkup('the owner\'s team');
    });

    step("teams: an administrator sets the team's token and cost budget (PUT /v1/teams/{team}/budget)", async () => {
      const got = apiCall(page(), 'GET', budgetPath);
      await page().getByRole('button', { name: 'Look up team' }).click();
      assert.equal((await got).status(), 200);
      const view = page().getByTestId('team-result-view');
      await view.getByTestId('team-budget-none').waitFor();
      assert.equal(await page().locator('#team-result-title').textContent(), `Budget of team ${TEAM}`);

      const form = page().getByTestId('team-budget-form');
      await form.getByLabel('Tokens per day').fill('10,000');
      await form.getByLabel(`Cost per day (${env.currency})`).fill('5');
      await form.getByLabel(`Cost per month (${env.currency})`).fill('120.50');
      const put = apiCall(page(), 'PUT', budgetPath);
      await page().getByRole('button', { name: 'Save team budget' }).click();
      const answer = await put;
      assert.equal(answer.status(), 200, await answer.text());
      assert.deepEqual(JSON.parse(answer.request().postData()), { budget: TEAM_BUDGET });
      assert.deepEqual((await answer.json()).budget, TEAM_BUDGET);
      await view.getByTestId('team-budget-set').waitFor();
      await texts(view.locator('.budget-text'), teamLines(0, 0), 'the team budget as set, nothing used yet');
      assert.match(await page().getByTestId('team-admin-status').textContent(), /Budget of team .* saved/);
      assert.equal(await form.getByLabel('Cost per month').inputValue(), '120.5', 'the form shows the budget as stored');
      await noMarkup('the team budget');
      await page().getByTestId('team-admin').scrollIntoViewIfNeeded();
      await screenshot('team-admin-budget-set');
      await noHorizontalScroll(390);
      await screenshot('team-admin-budget-set-phone-390');
      await page().setViewportSize({ width: 1280, height: 800 });
    });

    step("teams: the owner sees its team and what is left of the team's budget, also after a real request", async () => {
      state.bobToken = await signInAs(OWNER);
      assert.equal(await page().getByTestId('team-admin').isHidden(), true, 'no team administration for a user');
      await texts(page().getByTestId('own-team-name'), [TEAM], 'the owner\'s team, as text');
      await noMarkup('the owner\'s panel');
      const own = page().getByTestId('own-team-budget');
      state.teamRequests = 0;
      await texts(own.locator('.budget-text'), teamLines(0, 0), 'the team budget, all of it left');

      // The membership reaches the data plane as a budget change does (polled): then a request,
      // a signed-in call with bob's own token (the team's budget covers those as it does keys).
      await new Promise((r) => setTimeout(r, 1000));
      const model = 'alpha3.6-vl';
      const r = await fetch(`${env.gateway}/v1/chatx/v1/chat/completions`, {
        method: 'POST',
        headers: { authorization: `Bearer ${state.bobToken}`, 'content-type': 'application/json' },
        body: JSON.stringify({ model, max_tokens: 64, messages: [{ role: 'user', content: 'team test' }] }),
      });
      const text = await r.text();
      assert.equal(r.status, 200, `gateway answered ${r.status} ${text}`);
      const { usage } = JSON.parse(text);
      const tokens = usage.prompt_tokens + usage.completion_tokens;
      const micros = costMicros(model, usage);
      assert.ok(micros > 0, 'the call is priced');
      state.teamRequests = 1;
      // Past [metering] flush_seconds, then until the team's budget (the view's source) has it.
      await new Promise((r) => setTimeout(r, flushSeconds * 1000 + 300));
      // Slowly: the key API allows bob [admin] requests_per_minute, and the page reads next.
      const deadline = Date.now() + 10_000;
      for (;;) {
        const r = await fetch(`${env.admin}${budgetPath}`, { headers: { authorization: `Bearer ${state.bobToken}` } });
        const body = await r.json();
        if (r.status === 200 && body.used?.tokens_per_day === tokens) break;
        assert.ok(Date.now() < deadline, `the team's budget did not get the request: ${r.status} ${JSON.stringify(body)}`);
        await new Promise((r) => setTimeout(r, 600));
      }
      const read = apiCall(page(), 'GET', budgetPath);
      await page().getByRole('button', { name: 'Refresh budget' }).click();
      await read;
      await texts(own.locator('.budget-text'), teamLines(tokens, micros), 'the team\'s use and what is left');
      const bar = page().getByRole('progressbar', { name: `Team ${TEAM}: cost today` });
      assert.equal(await bar.getAttribute('aria-valuemax'), '5');
      // The same call in bob's usage view: its own row (no key), with its cost.
      const report = page().waitForResponse((res) => new URL(res.url()).pathname === '/v1/usage');
      await page().locator('#refresh-usage').click();
      await report;
      const row = page().getByTestId('usage-key-none');
      await texts(row.getByTestId('tokens-today'), [fmt(tokens)], 'the signed-in call\'s tokens');
      await texts(row.getByTestId('cost-today'), [costText(env.currency, micros)], 'its cost');
      await page().getByTestId('own-team').scrollIntoViewIfNeeded();
      await screenshot('team-owner-view');
      await noHorizontalScroll(390);
      await screenshot('team-owner-view-phone-390');
      await page().setViewportSize({ width: 1280, height: 800 });
    });

    step('teams: an administrator takes the owner out of its team; the owner then shows no team', async () => {
      await signInAs('admin', { admin: true, base: env.adminOffered });
      await page().getByLabel(/^Owner/).fill(OWNER);
      const got = apiCall(page(), 'GET', memberPath);
      await page().getByRole('button', { name: 'Look up', exact: true }).click();
      assert.equal((await got).status(), 200);
      await texts(page().getByTestId('owner-team-current'), [`${OWNER} is in team ${TEAM}.`], 'the team, read back');
      const put = apiCall(page(), 'PUT', memberPath);
      await page().getByRole('button', { name: 'Remove from team' }).click();
      const answer = await put;
      assert.equal(answer.status(), 200, await answer.text());
      assert.deepEqual(JSON.parse(answer.request().postData()), { team: null });
      await texts(page().getByTestId('owner-team-status'), [`${OWNER} is in no team now.`], 'removed');
      assert.equal(await page().getByTestId('owner-team').inputValue(), '');

      // bob's own read of the team's budget is now refused as for any non-member: 404.
      const r = await fetch(`${env.admin}${budgetPath}`, { headers: { authorization: `Bearer ${state.bobToken}` } });
      assert.equal(r.status, 404, 'a former member reads nothing of the team');
      const me = await fetch(`${env.admin}${memberPath}`, { headers: { authorization: `Bearer ${state.bobToken}` } });
      assert.deepEqual(await me.json(), { owner: OWNER, team: null });
    });
  }

  return { steps };
}
