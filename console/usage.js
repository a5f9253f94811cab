// Portcullis key console, the usage view: tokens and requests per key today and this month,
// 30-day charts per key and in total, and for an administrator every owner's totals, all read
// from GET /v1/usage on this page's own origin. Loaded before console.js, which creates the view
// with its `api` function: the token stays in console.js, this file never sees it.
// Days are UTC days, as the ledger keeps them. Charts are SVG drawn here: no library, no CDN.
// Every piece of data goes into the page with textContent, never as HTML.
'use strict';

window.PortcullisUsage = (() => {
  const DAY_MS = 86_400_000;
  const DAYS = 30;
  const SVG = 'http://www.w3.org/2000/svg';
  const number = new Intl.NumberFormat('en');
  const $ = (id) => document.getElementById(id);

  // ---- numbers -------------------------------------------------------------------------------

  const utcDay = (ms) => new Date(ms).toISOString().slice(0, 10);

  // The UTC days the view covers, read once per load so a load never straddles midnight.
  function calendar(now = Date.now()) {
    const today = utcDay(now);
    const days = Array.from({ length: DAYS }, (_, i) => utcDay(now - (DAYS - 1 - i) * DAY_MS));
    const monthStart = `${today.slice(0, 8)}01`;
    return { today, days, monthStart, from: monthStart < days[0] ? monthStart : days[0] };
  }

  const zero = () => ({ requests: 0, prompt: 0, completion: 0 });
  const tokens = (t) => t.prompt + t.completion;
  function add(into, row) {
    into.requests += Number(row.requests) || 0;
    into.prompt += Number(row.prompt_tokens) || 0;
    into.completion += Number(row.completion_tokens) || 0;
  }

  // Rows of one report summed by `groupOf(row)`: today, this month, and each day shown.
  function summarise(rows, cal, groupOf) {
    const groups = new Map();
    const total = { today: zero(), month: zero(), byDay: new Map() };
    for (const row of rows) {
      const name = groupOf(row);
      if (!groups.has(name)) groups.set(name, { today: zero(), month: zero(), byDay: new Map() });
      for (const g of [groups.get(name), total]) {
        if (row.day === cal.today) add(g.today, row);
        if (row.day >= cal.monthStart && row.day <= cal.today) add(g.month, row);
        if (!g.byDay.has(row.day)) g.byDay.set(row.day, zero());
        add(g.byDay.get(row.day), row);
      }
    }
    return { groups, total };
  }

  // Every day of the chart, a day without usage as zero.
  const series = (group, cal) => cal.days.map((day) => ({ day, ...(group.byDay.get(day) || zero()) }));

  // ---- the chart -----------------------------------------------------------------------------

  function svg(tag, attrs, text) {
    const el = document.createElementNS(SVG, tag);
    for (const [k, v] of Object.entries(attrs)) el.setAttribute(k, String(v));
    if (text !== undefined) el.textContent = text;
    return el;
  }

  // A round top for the y axis (1, 2 or 5 times a power of ten), so its labels read easily.
  function niceMax(value) {
    if (value <= 0) return 1;
    const power = 10 ** Math.floor(Math.log10(value));
    return [1, 2, 5, 10].map((m) => m * power).find((m) => m >= value);
  }

  // Stacked bars (prompt below, completion above) per day, drawn at the width it is given in
  // CSS pixels, so text keeps its size on a phone; redrawn when the window is resized.
  function chart(points, title, width) {
    const height = 200;
    const pad = { left: 56, right: 8, top: 12, bottom: 28 };
    const plotW = Math.max(width - pad.left - pad.right, DAYS * 2);
    const plotH = height - pad.top - pad.bottom;
    const max = niceMax(Math.max(...points.map(tokens)));
    const sum = points.reduce((s, p) => s + tokens(p), 0);
    const peak = points.reduce((best, p) => (tokens(p) > tokens(best) ? p : best), points[0]);
    const fullW = plotW + pad.left + pad.right;
    const root = svg('svg', { width: fullW, height, viewBox: `0 0 ${fullW} ${height}`, role: 'img', class: 'usage-chart' });
    const id = `chart-${Math.random().toString(36).slice(2)}`;
    root.setAttribute('aria-labelledby', `${id}-t ${id}-d`);
    root.append(svg('title', { id: `${id}-t` }, title));
    root.append(svg('desc', { id: `${id}-d` }, sum === 0
      ? `No tokens from ${points[0].day} to ${points.at(-1).day}.`
      : `${number.format(sum)} tokens from ${points[0].day} to ${points.at(-1).day}; most on ${peak.day}: ${number.format(tokens(peak))}.`));
    const y = (v) => pad.top + plotH - (v / max) * plotH;
    // Tokens are whole: no half-token tick on a small scale.
    for (const v of [0, max / 2, max].filter(Number.isInteger)) {
      root.append(svg('line', { x1: pad.left, x2: pad.left + plotW, y1: y(v), y2: y(v), class: 'grid' }));
      root.append(svg('text', { x: pad.left - 6, y: y(v) + 4, 'text-anchor': 'end', class: 'axis' }, number.format(v)));
    }
    const slot = plotW / DAYS;
    const barW = Math.max(slot * 0.7, 1);
    points.forEach((p, i) => {
      const x = pad.left + i * slot + (slot - barW) / 2;
      const g = svg('g', { class: 'day', 'data-day': p.day, 'data-tokens': tokens(p), 'data-requests': p.requests });
      g.append(svg('title', {}, `${p.day}: ${number.format(tokens(p))} tokens (${number.format(p.prompt)} prompt, ${number.format(p.completion)} completion), ${number.format(p.requests)} requests`));
      if (tokens(p) === 0) {
        // Zero is drawn, as a tick on the axis, so a quiet day is seen as zero, not missing.
        g.append(svg('rect', { x, y: y(0) - 1, width: barW, height: 1, class: 'bar-zero' }));
      } else {
        const hp = (p.prompt / max) * plotH;
        const hc = (p.completion / max) * plotH;
        g.append(svg('rect', { x, y: y(0) - hp, width: barW, height: hp, class: 'bar-prompt' }));
        g.append(svg('rect', { x, y: y(0) - hp - hc, width: barW, height: hc, class: 'bar-completion' }));
      }
      // Date labels (MM-DD, UTC) a week apart, counted back from today so today has one.
      if ((DAYS - 1 - i) % 7 === 0) {
        const anchor = i === DAYS - 1 ? 'end' : 'middle';
        const tx = i === DAYS - 1 ? x + barW : x + barW / 2;
        root.append(svg('text', { x: tx, y: height - 8, 'text-anchor': anchor, class: 'axis' }, p.day.slice(5)));
      }
      root.append(g);
    });
    root.append(svg('line', { x1: pad.left, x2: pad.left + plotW, y1: y(0), y2: y(0), class: 'baseline' }));
    return root;
  }

  function legend() {
    const list = document.createElement('ul');
    list.className = 'legend';
    for (const [cls, text] of [['bar-prompt', 'Prompt tokens'], ['bar-completion', 'Completion tokens']]) {
      const item = document.createElement('li');
      const swatch = document.createElement('span');
      swatch.className = `swatch ${cls}`;
      swatch.setAttribute('aria-hidden', 'true');
      item.append(swatch, document.createTextNode(text));
      list.append(item);
    }
    return list;
  }

  // A titled chart with its legend, in `container`, with `testid` for tests and people's tools.
  function figure(container, title, points, testid) {
    const fig = document.createElement('figure');
    fig.className = 'usage-figure';
    fig.dataset.testid = testid;
    const caption = document.createElement('figcaption');
    caption.textContent = title;
    fig.append(caption);
    container.append(fig);
    fig.append(chart(points, `${title}: tokens per UTC day, last ${DAYS} days`, fig.clientWidth || 600), legend());
  }

  // ---- tables --------------------------------------------------------------------------------

  function cell(row, label, text, testid) {
    const td = document.createElement('td');
    td.dataset.label = label;
    td.textContent = text;
    if (testid) td.dataset.testid = testid;
    row.append(td);
    return td;
  }

  function totalsRow(body, label, sub, totals, testid) {
    const row = document.createElement('tr');
    row.dataset.testid = testid;
    const name = cell(row, 'For', label);
    if (sub) {
      const small = document.createElement('span');
      small.className = 'hint';
      small.textContent = ` ${sub}`;
      name.append(small);
    }
    cell(row, 'Tokens today', number.format(tokens(totals.today)), 'tokens-today');
    cell(row, 'Requests today', number.format(totals.today.requests), 'requests-today');
    cell(row, 'Tokens this month', number.format(tokens(totals.month)), 'tokens-month');
    cell(row, 'Requests this month', number.format(totals.month.requests), 'requests-month');
    body.append(row);
    return row;
  }

  // ---- the view ------------------------------------------------------------------------------

  // `api(method, path)` and `describe(err)` are console.js's; `viewer()` gives { sub, admin };
  // `keys()` the key list loaded so far, for names and for keys with no usage yet.
  function create({ api, describe, viewer, keys }) {
    let generation = 0; // a load answered after a sign-out or a newer load is dropped
    let last = null; // what was drawn, to redraw the charts at a new width

    function status(text, kind = 'info') {
      $('usage-status').dataset.kind = kind;
      $('usage-status').textContent = text;
    }

    function clear() {
      generation += 1;
      last = null;
      for (const id of ['usage-keys-body', 'usage-charts', 'usage-owners-body', 'usage-owners-chart']) $(id).replaceChildren();
      $('usage-keys').hidden = true;
      $('usage-owners').hidden = true;
      $('usage-empty').hidden = true;
      status('');
    }

    function labelOf(id) {
      if (id === '') return ['Signed-in calls', '(no key)'];
      const key = keys().find((k) => k.id === id);
      return key && key.name ? [key.name, id] : [id, ''];
    }

    function drawMine(mine, cal, sub) {
      const body = $('usage-keys-body');
      body.replaceChildren();
      // Active keys of the list with no usage yet are shown too, at zero.
      const ids = new Set(mine.groups.keys());
      for (const k of keys()) {
        const active = !k.revoked && !(k.expires && new Date(k.expires).getTime() <= Date.now());
        if (active && (!sub || k.owner === sub) && !ids.has(k.id)) mine.groups.set(k.id, { today: zero(), month: zero(), byDay: new Map() });
      }
      const order = [...mine.groups.entries()].sort((a, b) => tokens(b[1].month) - tokens(a[1].month) || a[0].localeCompare(b[0]));
      for (const [id, g] of order) {
        const [name, sub2] = labelOf(id);
        totalsRow(body, name, sub2, g, `usage-key-${id || 'none'}`).dataset.keyId = id;
      }
      if (order.length > 1) totalsRow(body, 'All your keys', '', mine.total, 'usage-total').className = 'total';
      $('usage-keys').hidden = order.length === 0;
      $('usage-empty').hidden = order.length > 0;

      const charts = $('usage-charts');
      charts.replaceChildren();
      figure(charts, 'All your usage', series(mine.total, cal), 'usage-chart-total');
      for (const [id, g] of order) {
        const points = series(g, cal);
        if (points.some((p) => tokens(p) > 0 || p.requests > 0)) {
          const [name, detail] = labelOf(id);
          figure(charts, detail ? `${name} ${detail.startsWith('(') ? detail : `(${detail})`}` : name, points, `usage-chart-${id || 'none'}`);
        }
      }
    }

    function drawOwners(everyone, cal) {
      const body = $('usage-owners-body');
      body.replaceChildren();
      const order = [...everyone.groups.entries()].sort((a, b) => tokens(b[1].month) - tokens(a[1].month) || a[0].localeCompare(b[0]));
      for (const [owner, g] of order) totalsRow(body, owner || '(no owner)', '', g, `usage-owner-${owner}`).dataset.owner = owner;
      if (order.length === 0) {
        const row = document.createElement('tr');
        cell(row, '', 'No usage by anyone in this period.').colSpan = 5;
        body.append(row);
      }
      const chartBox = $('usage-owners-chart');
      chartBox.replaceChildren();
      figure(chartBox, 'All owners', series(everyone.total, cal), 'usage-chart-everyone');
      $('usage-owners').hidden = false;
    }

    function draw() {
      if (!last) return;
      if (last.mine) drawMine(last.mine, last.cal, last.sub);
      else for (const id of ['usage-keys-body', 'usage-charts']) $(id).replaceChildren();
      if (last.everyone) drawOwners(last.everyone, last.cal);
    }

    // The report is paged (at most 1000 rows a page): every page, one after the other.
    async function allPages(path) {
      const first = await api('GET', `${path}&limit=1000`);
      const usage = Array.isArray(first && first.usage) ? [...first.usage] : null;
      let next = first && first.next;
      while (usage && typeof next === 'string') {
        const page = await api('GET', `${path}&limit=1000&cursor=${encodeURIComponent(next)}`);
        if (!Array.isArray(page && page.usage)) return page;
        usage.push(...page.usage);
        next = page.next;
      }
      return usage ? { usage } : first;
    }

    async function load() {
      const mine = ++generation;
      const { sub, admin } = viewer();
      const cal = calendar();
      const range = `from=${cal.from}&to=${cal.today}`;
      status('Loading usage…');
      // Your own keys by owner (an administrator would otherwise get everyone's keys here);
      // everyone's per owner and day only for an administrator.
      const requests = [allPages(`/v1/usage?${range}&group_by=day,key${sub ? `&owner=${encodeURIComponent(sub)}` : ''}`)];
      if (admin) requests.push(allPages(`/v1/usage?${range}&group_by=day`));
      const [own, all] = await Promise.allSettled(requests);
      if (mine !== generation) return;
      const rowsOf = (r) => (r && r.status === 'fulfilled' && Array.isArray(r.value && r.value.usage) ? r.value.usage : null);
      const problems = [];
      last = { cal, sub };
      if (rowsOf(own)) {
        last.mine = summarise(rowsOf(own), cal, (row) => row.key || '');
      } else {
        problems.push(`Could not load your usage: ${own.status === 'rejected' ? describe(own.reason) : 'unexpected answer'}`);
      }
      if (admin && rowsOf(all)) {
        last.everyone = summarise(rowsOf(all), cal, (row) => row.owner || '');
      } else if (admin) {
        problems.push(`Could not load every owner's usage: ${all.status === 'rejected' ? describe(all.reason) : 'unexpected answer'}`);
      }
      $('usage-keys').hidden = !last.mine;
      $('usage-empty').hidden = true;
      $('usage-owners').hidden = !last.everyone;
      draw();
      if (problems.length) status(problems.join(' '), 'error');
      else status(`Usage up to ${new Date().toISOString().slice(11, 16)} UTC. Days are UTC days.`);
    }

    let resizeTimer = null;
    let drawnWidth = window.innerWidth;
    window.addEventListener('resize', () => {
      clearTimeout(resizeTimer);
      resizeTimer = setTimeout(() => {
        if (window.innerWidth !== drawnWidth) {
          drawnWidth = window.innerWidth;
          draw();
        }
      }, 150);
    });

    return { load, clear };
  }

  return Object.freeze({ create, calendar });
})();
