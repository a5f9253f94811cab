// Portcullis key console, budgets: each key's "used / budget" per budgeted window with what is
// left, a bar and its reset time, a form per key to set or clear its budget (PATCH
// /v1/keys/{id}), the budget fields of the create form, the signed-in owner's own budget (GET
// /v1/owners/{sub}/budget) and, for an administrator, any owner's budget, looked up and set or
// cleared (PUT). Token, request and cost limits alike: a cost is in the gateway's currency
// (config.json's `currency`, a label never converted), with up to six decimals. teams.js draws
// a team's budget with drawSubject and fields. Loaded before console.js, which creates the view
// with its `api` function: the token stays in console.js.
// Windows are fixed UTC windows (the hour, the day, the calendar month), as the gateway counts
// them. Every piece of data goes into the page with textContent or value, never as HTML.
'use strict';

window.PortcullisBudgets = (() => {
  // The API's names, in its order, and how the page says them.
  const WINDOWS = [
    { name: 'tokens_per_hour', label: 'tokens this hour', field: 'Tokens per hour', unit: 'tokens' },
    { name: 'tokens_per_day', label: 'tokens today', field: 'Tokens per day', unit: 'tokens' },
    { name: 'tokens_per_month', label: 'tokens this month', field: 'Tokens per month', unit: 'tokens' },
    { name: 'requests_per_day', label: 'requests today', field: 'Requests per day', unit: 'requests' },
    { name: 'cost_per_day', label: 'cost today', field: 'Cost per day', unit: 'cost' },
    { name: 'cost_per_month', label: 'cost this month', field: 'Cost per month', unit: 'cost' },
  ];
  const DAY_MS = 86_400_000;
  const MICROS = 1_000_000;
  const number = new Intl.NumberFormat('en');
  const { formatMoney } = window.PortcullisOidc;
  const $ = (id) => document.getElementById(id);
  const count = (n) => number.format(Number(n) || 0);
  const limited = (budget, name) => Boolean(budget) && typeof budget[name] === 'number';
  const isCost = (w) => w.unit === 'cost';
  // Costs are summed and compared in whole millionths, as the gateway keeps them.
  const micros = (units) => Math.round((Number(units) || 0) * MICROS);

  // An amount of a window's unit: "1,200" tokens or requests, "$0.0125" of the currency.
  const amount = (w, n, currency) => (isCost(w) ? formatMoney(n, currency) : count(n));

  // What is left of `limit` after `used`, never below 0.
  function left(w, used, limit) {
    if (isCost(w)) return Math.max(micros(limit) - micros(used), 0) / MICROS;
    return Math.max((Number(limit) || 0) - (Number(used) || 0), 0);
  }

  // When each window that holds `now` ends: the API's `resets`, which key listings do not carry.
  function resets(now = Date.now()) {
    const d = new Date(now);
    const [y, m, day, h] = [d.getUTCFullYear(), d.getUTCMonth(), d.getUTCDate(), d.getUTCHours()];
    const tomorrow = Date.UTC(y, m, day + 1);
    const nextMonth = Date.UTC(y, m + 1, 1);
    return {
      tokens_per_hour: Date.UTC(y, m, day, h + 1),
      tokens_per_day: tomorrow,
      tokens_per_month: nextMonth,
      requests_per_day: tomorrow,
      cost_per_day: tomorrow,
      cost_per_month: nextMonth,
    };
  }

  // "00:00 UTC" within a day, else with its date: "2026-12-01 00:00 UTC".
  function when(at, now = Date.now()) {
    const d = new Date(at);
    if (Number.isNaN(d.getTime())) return String(at);
    const iso = d.toISOString();
    return d.getTime() - now <= DAY_MS ? `${iso.slice(11, 16)} UTC` : `${iso.slice(0, 10)} ${iso.slice(11, 16)} UTC`;
  }

  // ---- drawing ---------------------------------------------------------------------------------

  function el(tag, className, text) {
    const e = document.createElement(tag);
    if (className) e.className = className;
    if (text !== undefined) e.textContent = text;
    return e;
  }

  // A bar for `used` of `limit`, named `context: window` for screen readers.
  function bar(w, used, limit, context, currency) {
    const ratio = limit > 0 ? Math.min(used / limit, 1) : 1;
    const meter = el('div', 'budget-bar');
    meter.dataset.level = used >= limit ? 'full' : ratio >= 0.8 ? 'high' : 'ok';
    meter.setAttribute('role', 'progressbar');
    meter.setAttribute('aria-label', `${context}: ${w.label}`);
    meter.setAttribute('aria-valuemin', '0');
    meter.setAttribute('aria-valuemax', String(limit));
    meter.setAttribute('aria-valuenow', String(Math.min(used, limit)));
    const unit = isCost(w) ? '' : ` ${w.unit}`;
    const full = used >= limit ? ': no room left' : '';
    meter.setAttribute('aria-valuetext', `${amount(w, used, currency)} of ${amount(w, limit, currency)}${unit} used${full}`);
    const fill = el('span');
    fill.style.width = `${(ratio * 100).toFixed(1)}%`;
    meter.append(fill);
    return meter;
  }

  // One window: "tokens today: 1,200 / 10,000 · 8,800 left · resets 00:00 UTC" and its bar,
  // or, without a limit there, "tokens today: 1,200 · no limit". `currency` names a cost's.
  function line(w, used, limit, resetAt, context, currency) {
    const li = el('li', 'budget-line');
    li.dataset.window = w.name;
    li.dataset.testid = `budget-${w.name}`;
    const a = (n) => amount(w, n, currency);
    const rest = limit === undefined ? 0 : left(w, used, limit);
    const text = limit === undefined
      ? `${w.label}: ${a(used)} · no limit`
      : `${w.label}: ${a(used)} / ${a(limit)} · ${rest > 0 ? `${a(rest)} left` : 'none left'} · resets ${when(resetAt)}`;
    li.append(el('span', 'budget-text', text));
    if (limit !== undefined) li.append(bar(w, Number(used) || 0, limit, context, currency));
    return li;
  }

  // A key's budget cell: a line per budgeted window, or "no budget".
  function keyCell(key, currency) {
    const td = el('td', 'budget');
    td.dataset.label = 'Budget';
    td.dataset.testid = 'key-budget';
    const budget = key.budget && typeof key.budget === 'object' ? key.budget : null;
    const names = WINDOWS.filter((w) => limited(budget, w.name));
    if (names.length === 0) {
      td.append(el('span', 'empty', 'no budget'));
      return td;
    }
    const at = resets();
    const used = key.used && typeof key.used === 'object' ? key.used : {};
    const list = el('ul', 'budget-list');
    for (const w of names) list.append(line(w, used[w.name] || 0, budget[w.name], at[w.name], `Key ${key.name || key.id}`, currency));
    td.append(list);
    return td;
  }

  const NONE = {
    owner: 'No owner budget: only each key\'s own budget limits it.',
    team: 'No team budget: only its owners\' and their keys\' own budgets limit them.',
  };

  // An owner's or a team's (`kind`) `{budget, used, resets}` in `container`: every window,
  // limited or not, named `context` for screen readers.
  function drawSubject(container, data, { kind = 'owner', context, currency }) {
    container.replaceChildren();
    const budget = data && data.budget && typeof data.budget === 'object' ? data.budget : null;
    const used = (data && data.used) || {};
    const at = { ...resets(), ...((data && data.resets) || {}) };
    const note = budget
      ? el('p', 'hint', 'Windows without a limit are shown with their use only.')
      : el('p', 'empty', NONE[kind]);
    note.dataset.testid = `${kind}-budget-${budget ? 'set' : 'none'}`;
    const list = el('ul', 'budget-list');
    for (const w of WINDOWS) {
      list.append(line(w, used[w.name] || 0, limited(budget, w.name) ? budget[w.name] : undefined, at[w.name], context, currency));
    }
    container.append(note, list);
  }

  // ---- the six fields --------------------------------------------------------------------------

  // A labelled input per window (ids `${prefix}-${name}`), filled with `budget`'s limits; the
  // cost ones are labelled with `currency`.
  function fields(container, prefix, budget, currency) {
    container.replaceChildren();
    container.classList.add('budget-fields');
    for (const w of WINDOWS) {
      const wrap = el('div', 'field');
      const input = document.createElement('input');
      const inputMode = isCost(w) ? 'decimal' : 'numeric';
      Object.assign(input, { type: 'text', id: `${prefix}-${w.name}`, name: w.name, inputMode, autocomplete: 'off', placeholder: 'no limit' });
      input.dataset.testid = `${prefix}-${w.name}`;
      input.value = limited(budget, w.name) ? String(budget[w.name]) : '';
      const label = el('label', '', isCost(w) ? `${w.field} (${currency})` : w.field);
      label.htmlFor = input.id;
      wrap.append(label, input);
      container.append(wrap);
    }
  }

  // One field's limit: { value } (undefined when empty), or { error }. Thousands separators
  // are dropped; a cost has at most the six decimals the gateway keeps.
  function limitOf(w, raw) {
    const text = raw.trim().replace(/[\s,_]/g, '');
    if (text === '') return { value: undefined };
    if (isCost(w)) {
      if (!/^(\d+(\.\d{0,6})?|\.\d{1,6})$/.test(text)) {
        return { error: `${w.field} must be an amount of 0 or more with at most 6 decimals (0 refuses everything), or empty for no limit.` };
      }
      if (!Number.isSafeInteger(micros(text))) {
        return { error: `${w.field} is too large for the console: at most ${count(Math.floor(Number.MAX_SAFE_INTEGER / MICROS))}.` };
      }
      return { value: Number(text) };
    }
    if (!/^\d+$/.test(text)) {
      return { error: `${w.field} must be a whole number, 0 or more (0 refuses everything), or empty for no limit.` };
    }
    if (!Number.isSafeInteger(Number(text))) {
      return { error: `${w.field} is too large for the console: at most ${count(Number.MAX_SAFE_INTEGER)}.` };
    }
    return { value: Number(text) };
  }

  // What the fields hold: { value: {…} } or { value: null } (empty: no limit anywhere), or
  // { error, input } for a field that holds no limit of its kind.
  function read(container) {
    const budget = {};
    for (const w of WINDOWS) {
      const input = container.querySelector(`input[name="${w.name}"]`);
      const got = limitOf(w, input.value);
      if (got.error) return { error: got.error, input };
      if (got.value !== undefined) budget[w.name] = got.value;
    }
    return { value: Object.keys(budget).length ? budget : null };
  }

  function button(text, className, onClick) {
    const b = el('button', className, text);
    b.type = 'button';
    if (onClick) b.addEventListener('click', onClick);
    return b;
  }

  // ---- the view --------------------------------------------------------------------------------

  // `api(method, path, body)`, `describe(err)` and `say(text, kind)` are console.js's;
  // `viewer()` gives { signedIn, sub, admin }; `updateKey(key)` puts a key as the API answered it
  // into the list (which is drawn again); `currency` is the gateway's (config.json).
  function create({ api, describe, say, viewer, updateKey, currency }) {
    let generation = 0; // a read answered after a sign-out or a newer read is dropped
    let looked = null; // the owner an administrator looked up
    const labelOf = (key) => (key.name ? `"${key.name}" (${key.id})` : key.id);

    function status(id, text, kind = 'info') {
      $(id).dataset.kind = kind;
      $(id).textContent = text;
    }

    async function load() {
      const mine = ++generation;
      const { sub, admin } = viewer();
      $('owner-admin').hidden = !admin;
      if (!sub) {
        $('own-budget').replaceChildren();
        status('budget-status', 'Your sign-in names no user (no sub), so it has no owner budget.');
        return;
      }
      status('budget-status', 'Loading your budget…');
      try {
        const data = await api('GET', `/v1/owners/${encodeURIComponent(sub)}/budget`);
        if (mine !== generation) return;
        drawSubject($('own-budget'), data, { context: 'Your budget', currency });
        status('budget-status', `Read at ${new Date().toISOString().slice(11, 16)} UTC. Windows are fixed UTC hours, days and months.`);
      } catch (err) {
        if (mine !== generation || !viewer().signedIn) return;
        $('own-budget').replaceChildren();
        status('budget-status', `Could not load your budget: ${describe(err)}`, 'error');
      }
    }

    function clear() {
      generation += 1;
      looked = null;
      $('own-budget').replaceChildren();
      $('owner-result').hidden = true;
      $('owner-admin').hidden = true;
      $('owner-lookup').reset();
      status('budget-status', '');
      status('owner-status', '');
    }

    // ---- a key's form, in a row under the key's own ----

    function editButton(key, row) {
      const b = button('Budget', 'secondary small');
      b.dataset.testid = `budget-edit-${key.id}`;
      b.setAttribute('aria-expanded', 'false');
      b.setAttribute('aria-controls', `budget-editor-${key.id}`);
      b.setAttribute('aria-label', `Set or clear the budget of key ${labelOf(key)}`);
      b.addEventListener('click', () => {
        const open = $(`budget-editor-${key.id}`);
        if (open) {
          open.remove();
          b.setAttribute('aria-expanded', 'false');
        } else {
          row.after(editor(key, b, row.children.length));
          b.setAttribute('aria-expanded', 'true');
          $(`key-budget-${key.id}-${WINDOWS[0].name}`).focus();
        }
      });
      return b;
    }

    function editor(key, opener, columns) {
      const tr = el('tr', 'budget-editor');
      tr.id = `budget-editor-${key.id}`;
      tr.dataset.testid = `budget-editor-${key.id}`;
      const td = el('td');
      td.colSpan = columns;
      const form = el('form');
      form.noValidate = true;
      const set = el('fieldset');
      set.append(el('legend', '', `Budget of key ${labelOf(key)}`));
      set.append(el('p', 'hint', 'Empty: no limit in that window. Within your own budget, if you have one.'));
      const grid = el('div');
      fields(grid, `key-budget-${key.id}`, key.budget, currency);
      set.append(grid);
      const problem = el('p', 'budget-error');
      problem.setAttribute('role', 'alert');
      problem.dataset.testid = 'budget-error';
      const save = button('Save budget');
      save.type = 'submit';
      const clearIt = button('Clear budget', 'secondary');
      const cancel = button('Cancel', 'secondary', () => {
        tr.remove();
        opener.setAttribute('aria-expanded', 'false');
        opener.focus();
      });
      const actions = el('div', 'row');
      actions.append(save, clearIt, cancel);
      form.append(set, problem, actions);
      td.append(form);
      tr.append(td);

      async function send(budget) {
        problem.textContent = '';
        for (const b of [save, clearIt]) b.disabled = true;
        try {
          const changed = await api('PATCH', `/v1/keys/${encodeURIComponent(key.id)}`, { budget });
          updateKey(changed);
          say(budget ? `Budget of key ${labelOf(key)} saved.` : `Budget of key ${labelOf(key)} cleared: it has no budget.`, 'ok');
          const again = document.querySelector(`[data-testid="budget-edit-${CSS.escape(key.id)}"]`);
          if (again) again.focus();
        } catch (err) {
          for (const b of [save, clearIt]) b.disabled = false;
          if (viewer().signedIn) problem.textContent = `Could not ${budget ? 'save' : 'clear'} the budget: ${describe(err)}`;
        }
      }
      form.addEventListener('submit', (event) => {
        event.preventDefault();
        const got = read(grid);
        if (got.error) {
          problem.textContent = got.error;
          got.input.focus();
          return;
        }
        send(got.value);
      });
      clearIt.addEventListener('click', () => send(null));
      return tr;
    }

    // ---- the create form's fields ----

    // { value } to send as `budget` (null: send none), or { error, input }.
    const readCreate = () => read($('create-budget-fields'));

    // ---- any owner's budget, for an administrator ----

    function showOwner(sub, data) {
      looked = sub;
      $('owner-result-title').textContent = `Budget of ${sub}`;
      drawSubject($('owner-result-view'), data, { context: `Budget of ${sub}`, currency });
      fields($('owner-budget-fields'), 'owner-budget', data && data.budget, currency);
      $('owner-result').hidden = false;
    }

    async function lookUp(event) {
      event.preventDefault();
      const sub = $('owner-sub').value.trim();
      if (!sub) {
        status('owner-status', 'Enter an owner: the sign-in subject (sub) of a console user.', 'error');
        $('owner-sub').focus();
        return;
      }
      status('owner-status', `Loading the budget of ${sub}…`);
      try {
        showOwner(sub, await api('GET', `/v1/owners/${encodeURIComponent(sub)}/budget`));
        status('owner-status', `Budget of ${sub} read at ${new Date().toISOString().slice(11, 16)} UTC.`);
      } catch (err) {
        $('owner-result').hidden = true;
        if (viewer().signedIn) status('owner-status', `Could not read the budget of ${sub}: ${describe(err)}`, 'error');
      }
    }

    async function putOwner(budget) {
      const sub = looked;
      const buttons = [$('owner-save'), $('owner-clear')];
      for (const b of buttons) b.disabled = true;
      try {
        showOwner(sub, await api('PUT', `/v1/owners/${encodeURIComponent(sub)}/budget`, { budget }));
        status('owner-status', budget ? `Budget of ${sub} saved.` : `Budget of ${sub} cleared: no owner budget.`, 'ok');
        if (sub === viewer().sub) load();
      } catch (err) {
        if (viewer().signedIn) status('owner-status', `Could not ${budget ? 'save' : 'clear'} the budget of ${sub}: ${describe(err)}`, 'error');
      } finally {
        for (const b of buttons) b.disabled = false;
      }
    }

    fields($('create-budget-fields'), 'create-budget', null, currency);
    $('owner-lookup').addEventListener('submit', lookUp);
    $('owner-budget-form').addEventListener('submit', (event) => {
      event.preventDefault();
      const got = read($('owner-budget-fields'));
      if (got.error) {
        status('owner-status', got.error, 'error');
        got.input.focus();
        return;
      }
      putOwner(got.value);
    });
    $('owner-clear').addEventListener('click', () => putOwner(null));
    $('refresh-budget').addEventListener('click', load);

    return { load, clear, keyCell: (key) => keyCell(key, currency), editButton, readCreate };
  }

  return Object.freeze({ create, resets, when, read, fields, drawSubject });
})();
