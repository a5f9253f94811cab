// Portcullis key console, budgets: each key's "used / budget" per budgeted window with a bar and
// its reset time, a form per key to set or clear its budget (PATCH /v1/keys/{id}), the budget
// fields of the create form, the signed-in owner's own budget (GET /v1/owners/{sub}/budget) and,
// for an administrator, any owner's budget, looked up and set or cleared (PUT). Loaded before
// console.js, which creates the view with its `api` function: the token stays in console.js.
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
  ];
  const DAY_MS = 86_400_000;
  const number = new Intl.NumberFormat('en');
  const $ = (id) => document.getElementById(id);
  const count = (n) => number.format(Number(n) || 0);
  const limited = (budget, name) => Boolean(budget) && typeof budget[name] === 'number';

  // When each window that holds `now` ends: the API's `resets`, which key listings do not carry.
  function resets(now = Date.now()) {
    const d = new Date(now);
    const [y, m, day, h] = [d.getUTCFullYear(), d.getUTCMonth(), d.getUTCDate(), d.getUTCHours()];
    const tomorrow = Date.UTC(y, m, day + 1);
    return {
      tokens_per_hour: Date.UTC(y, m, day, h + 1),
      tokens_per_day: tomorrow,
      tokens_per_month: Date.UTC(y, m + 1, 1),
      requests_per_day: tomorrow,
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
  function bar(w, used, limit, context) {
    const ratio = limit > 0 ? Math.min(used / limit, 1) : 1;
    const meter = el('div', 'budget-bar');
    meter.dataset.level = used >= limit ? 'full' : ratio >= 0.8 ? 'high' : 'ok';
    meter.setAttribute('role', 'progressbar');
    meter.setAttribute('aria-label', `${context}: ${w.label}`);
    meter.setAttribute('aria-valuemin', '0');
    meter.setAttribute('aria-valuemax', String(limit));
    meter.setAttribute('aria-valuenow', String(Math.min(used, limit)));
    meter.setAttribute('aria-valuetext', `${count(used)} of ${count(limit)} ${w.unit} used${used >= limit ? ': no room left' : ''}`);
    const fill = el('span');
    fill.style.width = `${(ratio * 100).toFixed(1)}%`;
    meter.append(fill);
    return meter;
  }

  // One window: "tokens today: 1,200 / 10,000 · resets 00:00 UTC" and its bar, or, without a
  // limit there, "tokens today: 1,200 · no limit".
  function line(w, used, limit, resetAt, context) {
    const li = el('li', 'budget-line');
    li.dataset.window = w.name;
    li.dataset.testid = `budget-${w.name}`;
    const text = limit === undefined
      ? `${w.label}: ${count(used)} · no limit`
      : `${w.label}: ${count(used)} / ${count(limit)} · resets ${when(resetAt)}`;
    li.append(el('span', 'budget-text', text));
    if (limit !== undefined) li.append(bar(w, Number(used) || 0, limit, context));
    return li;
  }

  // A key's budget cell: a line per budgeted window, or "no budget".
  function keyCell(key) {
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
    for (const w of names) list.append(line(w, used[w.name] || 0, budget[w.name], at[w.name], `Key ${key.name || key.id}`));
    td.append(list);
    return td;
  }

  // An owner's `{budget, used, resets}` in `container`: every window, limited or not.
  function drawOwner(container, data, context) {
    container.replaceChildren();
    const budget = data && data.budget && typeof data.budget === 'object' ? data.budget : null;
    const used = (data && data.used) || {};
    const at = (data && data.resets) || resets();
    const note = budget
      ? el('p', 'hint', 'Windows without a limit are shown with their use only.')
      : el('p', 'empty', 'No owner budget: only each key\'s own budget limits it.');
    note.dataset.testid = budget ? 'owner-budget-set' : 'owner-budget-none';
    const list = el('ul', 'budget-list');
    for (const w of WINDOWS) {
      list.append(line(w, used[w.name] || 0, limited(budget, w.name) ? budget[w.name] : undefined, at[w.name], context));
    }
    container.append(note, list);
  }

  // ---- the four fields -------------------------------------------------------------------------

  // Four labelled inputs (ids `${prefix}-${name}`), filled with `budget`'s limits.
  function fields(container, prefix, budget) {
    container.replaceChildren();
    container.classList.add('budget-fields');
    for (const w of WINDOWS) {
      const wrap = el('div', 'field');
      const input = document.createElement('input');
      Object.assign(input, { type: 'text', id: `${prefix}-${w.name}`, name: w.name, inputMode: 'numeric', autocomplete: 'off', placeholder: 'no limit' });
      input.dataset.testid = `${prefix}-${w.name}`;
      input.value = limited(budget, w.name) ? String(budget[w.name]) : '';
      const label = el('label', '', w.field);
      label.htmlFor = input.id;
      wrap.append(label, input);
      container.append(wrap);
    }
  }

  // What the fields hold: { value: {…} } or { value: null } (empty: no limit anywhere), or
  // { error, input } for a field that is not a whole number.
  function read(container) {
    const budget = {};
    for (const w of WINDOWS) {
      const input = container.querySelector(`input[name="${w.name}"]`);
      const text = input.value.trim().replace(/[\s,_]/g, '');
      if (text === '') continue;
      if (!/^\d+$/.test(text)) {
        return { error: `${w.field} must be a whole number, 0 or more (0 refuses everything), or empty for no limit.`, input };
      }
      if (!Number.isSafeInteger(Number(text))) {
        return { error: `${w.field} is too large for the console: at most ${count(Number.MAX_SAFE_INTEGER)}.`, input };
      }
      budget[w.name] = Number(text);
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
  // into the list (which is drawn again).
  function create({ api, describe, say, viewer, updateKey }) {
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
        drawOwner($('own-budget'), data, 'Your budget');
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
      fields(grid, `key-budget-${key.id}`, key.budget);
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
      drawOwner($('owner-result-view'), data, `Budget of ${sub}`);
      fields($('owner-budget-fields'), 'owner-budget', data && data.budget);
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

    fields($('create-budget-fields'), 'create-budget', null);
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

    return { load, clear, keyCell, editButton, readCreate };
  }

  return Object.freeze({ create, resets, when, read });
})();
