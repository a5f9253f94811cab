// Portcullis key console, the usage view: tokens, requests and cost per key today and this
// month, 30-day charts per key and in total (of tokens or, switched, of cost), and for an
// administrator every owner's totals, all read from GET /v1/usage on this page's own origin.
// Cost is in the gateway's currency (config.json); a row none of whose requests was priced has
// no cost ("—"), and requests whose model had no price are counted as unpriced: never shown as
// a cost of 0. Loaded before console.js, which creates the view with its `api` function: the
// token stays in console.js, this file never sees it.
// Days are UTC days, as the ledger keeps them. Charts are SVG drawn here: no library, no CDN.
// Every piece of data goes into the page with textContent, never as HTML.
'use strict';

window.PortcullisUsage = (() => {
  const DAY_MS = 86_400_000;
  const DAYS = 30;
  const MICROS = 1_000_000;
  const SVG = 'http://www.w3.org/2000/svg';
  const number = new Intl.NumberFormat('en');
  const { formatMoney } = window.PortcullisOidc;
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

  // `cost` in whole millionths of the currency (summed exactly), null while nothing was priced.
  const zero = () => ({ requests: 0, prompt: 0, completion: 0, cost: null, unpriced: 0 });
  const tokens = (t) => t.prompt + t.completion;
  function add(into, row) {
    into.requests += Number(row.requests) || 0;
    into.prompt += Number(row.prompt_tokens) || 0;
    into.completion += Number(row.completion_tokens) || 0;
    into.unpriced += Number(row.unpriced_requests) || 0;
    if (typeof row.cost === 'number') into.cost = (into.cost || 0) + Math.round(row.cost * MICROS);
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

  // "$0.0125", or "—" when nothing was priced (never 0 for requests with no price).
  const costText = (t, currency) => (t.cost === null ? '—' : formatMoney(t.cost / MICROS, currency));

  // ---- what a chart shows --------------------------------------------------------------------

  // Per day: the bars' parts (stacked, bottom first), how an amount is written, and whether a
  // day holds requests of unknown cost (drawn as such, never as a 0).
  const TOKENS = {
    name: 'tokens',
    value: tokens,
    parts: [
      { cls: 'bar-prompt', label: 'Prompt tokens', of: (p) => p.prompt },
      { cls: 'bar-completion', label: 'Completion tokens', of: (p) => p.completion },
    ],
    format: (v) => number.format(v),
    whole: true, // tokens are whole: no half-token tick on a small scale
    unknown: () => false,
    dayText: (p) => `${number.format(tokens(p))} tokens (${number.format(p.prompt)} prompt, ${number.format(p.completion)} completion)`,
  };

  function costMeasure(currency) {
    const value = (p) => (p.cost || 0) / MICROS;
    const unknownText = (p) => (p.unpriced > 0 ? `, ${number.format(p.unpriced)} unpriced (cost unknown)` : '');
    return {
      name: 'cost',
      value,
      parts: [{ cls: 'bar-cost', label: `Cost (${currency})`, of: value }],
      format: (v) => formatMoney(v, currency),
      whole: false,
      unknown: (p) => p.unpriced > 0 || (p.cost === null && p.requests > 0),
      unknownLabel: 'Requests with no price: cost unknown',
      dayText: (p) => `cost ${p.cost === null && p.requests > 0 ? 'unknown' : costText(p, currency)}${unknownText(p)}`,
    };
  }

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
    return [1, 2, 5, 10].map((m) => Number((m * power).toPrecision(12))).find((m) => m >= value);
  }

  // The chart's description for screen readers: the period's sum, its peak and what is unknown.
  function describeChart(points, m) {
    const sum = points.reduce((s, p) => s + m.value(p), 0);
    const peak = points.reduce((best, p) => (m.value(p) > m.value(best) ? p : best), points[0]);
    const span = `from ${points[0].day} to ${points.at(-1).day}`;
    const unknown = points.filter(m.unknown).length;
    const text = sum === 0
      ? `No ${m.name} ${span}.`
      : `${m.format(sum)}${m.name === 'tokens' ? ' tokens' : ''} ${span}; most on ${peak.day}: ${m.format(m.value(peak))}.`;
    return unknown ? `${text} ${unknown} day(s) with requests of unknown cost.` : text;
  }

  // One day's bar: its parts stacked, a tick at 0 for a quiet day, a dashed box on top when
  // some of its cost is unknown.
  function dayBar(p, m, { x, barW, y, plotH, max }) {
    const g = svg('g', {
      class: 'day', 'data-day': p.day, 'data-tokens': tokens(p), 'data-requests': p.requests,
      'data-cost': p.cost === null ? '' : p.cost / MICROS, 'data-unpriced': p.unpriced,
    });
    g.append(svg('title', {}, `${p.day}: ${m.dayText(p)}, ${number.format(p.requests)} requests`));
    let top = y(0);
    if (m.value(p) === 0 && !m.unknown(p)) {
      // Zero is drawn, as a tick on the axis, so a quiet day is seen as zero, not missing.
      g.append(svg('rect', { x, y: top - 1, width: barW, height: 1, class: 'bar-zero' }));
    }
    for (const part of m.parts) {
      const h = (part.of(p) / max) * plotH;
      if (h > 0) g.append(svg('rect', { x, y: top - h, width: barW, height: h, class: part.cls }));
      top -= h;
    }
    if (m.unknown(p)) {
      const h = Math.min(14, plotH / 4);
      g.append(svg('rect', { x, y: top - h, width: barW, height: h, class: 'bar-unpriced' }));
    }
    return g;
  }

  // Bars per day of measure `m`, drawn at the width it is given in CSS pixels, so text keeps
  // its size on a phone; redrawn when the window is resized.
  function chart(points, title, width, m) {
    const height = 200;
    const max = niceMax(Math.max(...points.map(m.value)));
    const ticks = [0, max / 2, max].filter((v) => !m.whole || Number.isInteger(v));
    const longest = Math.max(...ticks.map((v) => m.format(v).length));
    const pad = { left: Math.max(56, longest * 7 + 14), right: 8, top: 12, bottom: 28 };
    const plotW = Math.max(width - pad.left - pad.right, DAYS * 2);
    const plotH = height - pad.top - pad.bottom;
    const fullW = plotW + pad.left + pad.right;
    const root = svg('svg', { width: fullW, height, viewBox: `0 0 ${fullW} ${height}`, role: 'img', class: 'usage-chart', 'data-measure': m.name });
    const id = `chart-${Math.random().toString(36).slice(2)}`;
    root.setAttribute('aria-labelledby', `${id}-t ${id}-d`);
    root.append(svg('title', { id: `${id}-t` }, title));
    root.append(svg('desc', { id: `${id}-d` }, describeChart(points, m)));
    const y = (v) => pad.top + plotH - (v / max) * plotH;
    for (const v of ticks) {
      root.append(svg('line', { x1: pad.left, x2: pad.left + plotW, y1: y(v), y2: y(v), class: 'grid' }));
      root.append(svg('text', { x: pad.left - 6, y: y(v) + 4, 'text-anchor': 'end', class: 'axis' }, m.format(v)));
    }
    const slot = plotW / DAYS;
    const barW = Math.max(slot * 0.7, 1);
    points.forEach((p, i) => {
      const x = pad.left + i * slot + (slot - barW) / 2;
      // Date labels (MM-DD, UTC) a week apart, counted back from today so today has one.
      if ((DAYS - 1 - i) % 7 === 0) {
        const anchor = i === DAYS - 1 ? 'end' : 'middle';
        const tx = i === DAYS - 1 ? x + barW : x + barW / 2;
        root.append(svg('text', { x: tx, y: height - 8, 'text-anchor': anchor, class: 'axis' }, p.day.slice(5)));
      }
      root.append(dayBar(p, m, { x, barW, y, plotH, max }));
    });
    root.append(svg('line', { x1: pad.left, x2: pad.left + plotW, y1: y(0), y2: y(0), class: 'baseline' }));
    return root;
  }

  function legend(m) {
    const list = document.createElement('ul');
    list.className = 'legend';
    const entries = m.parts.map((part) => [part.cls, part.label]);
    if (m.unknownLabel) entries.push(['bar-unpriced', m.unknownLabel]);
    for (const [cls, text] of entries) {
      const item = document.createElement('li');
      const swatch = document.createElement('span');
      swatch.className = `swatch ${cls}`;
      swatch.setAttribute('aria-hidden', 'true');
      item.append(swatch, document.createTextNode(text));
      list.append(item);
    }
    return list;
  }

  // A titled chart of measure `m` with its legend, in `container`, with `testid` for tests and
  // people's tools.
  function figure(container, title, points, testid, m) {
    const fig = document.createElement('figure');
    fig.className = 'usage-figure';
    fig.dataset.testid = testid;
    const caption = document.createElement('figcaption');
    caption.textContent = title;
    fig.append(caption);
    container.append(fig);
    const what = m.name === 'tokens' ? 'tokens' : m.parts[0].label.toLowerCase();
    fig.append(chart(points, `${title}: ${what} per UTC day, last ${DAYS} days`, fig.clientWidth || 600, m), legend(m));
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

  // A cost, "—" when nothing was priced, and how many requests had no price.
  function costCell(row, label, t, testid, currency) {
    const td = cell(row, label, costText(t, currency), testid);
    if (t.unpriced > 0) {
      const note = document.createElement('span');
      note.className = 'unpriced';
      note.dataset.testid = 'unpriced';
      note.title = 'Requests whose model had no price: their cost is unknown, not 0.';
      note.textContent = ` · ${number.format(t.unpriced)} unpriced`;
      td.append(note);
    }
    return td;
  }

  function totalsRow(body, label, sub, totals, testid, currency) {
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
    costCell(row, 'Cost today', totals.today, 'cost-today', currency);
    cell(row, 'Tokens this month', number.format(tokens(totals.month)), 'tokens-month');
    cell(row, 'Requests this month', number.format(totals.month.requests), 'requests-month');
    costCell(row, 'Cost this month', totals.month, 'cost-month', currency);
    body.append(row);
    return row;
  }

  // ---- the view ------------------------------------------------------------------------------

  // `api(method, path)` and `describe(err)` are console.js's; `viewer()` gives { sub, admin };
  // `keys()` the key list loaded so far, for names and for keys with no usage yet; `currency`
  // the gateway's (config.json).
  function create({ api, describe, viewer, keys, currency }) {
    let generation = 0; // a load answered after a sign-out or a newer load is dropped
    let last = null; // what was drawn, to redraw the charts at a new width or measure
    const measures = { tokens: TOKENS, cost: costMeasure(currency) };
    let measure = TOKENS; // what the charts show: the radio buttons above them switch it

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
      $('usage-measure').hidden = true;
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
        totalsRow(body, name, sub2, g, `usage-key-${id || 'none'}`, currency).dataset.keyId = id;
      }
      if (order.length > 1) totalsRow(body, 'All your keys', '', mine.total, 'usage-total', currency).className = 'total';
      $('usage-keys').hidden = order.length === 0;
      $('usage-empty').hidden = order.length > 0;

      const charts = $('usage-charts');
      charts.replaceChildren();
      figure(charts, 'All your usage', series(mine.total, cal), 'usage-chart-total', measure);
      for (const [id, g] of order) {
        const points = series(g, cal);
        if (points.some((p) => tokens(p) > 0 || p.requests > 0)) {
          const [name, detail] = labelOf(id);
          figure(charts, detail ? `${name} ${detail.startsWith('(') ? detail : `(${detail})`}` : name, points, `usage-chart-${id || 'none'}`, measure);
        }
      }
    }

    function drawOwners(everyone, cal) {
      const body = $('usage-owners-body');
      body.replaceChildren();
      const order = [...everyone.groups.entries()].sort((a, b) => tokens(b[1].month) - tokens(a[1].month) || a[0].localeCompare(b[0]));
      for (const [owner, g] of order) totalsRow(body, owner || '(no owner)', '', g, `usage-owner-${owner}`, currency).dataset.owner = owner;
      if (order.length === 0) {
        const row = document.createElement('tr');
        cell(row, '', 'No usage by anyone in this period.').colSpan = 7;
        body.append(row);
      }
      const chartBox = $('usage-owners-chart');
      chartBox.replaceChildren();
      figure(chartBox, 'All owners', series(everyone.total, cal), 'usage-chart-everyone', measure);
      $('usage-owners').hidden = false;
    }

    function draw() {
      if (!last) return;
      $('usage-measure').hidden = !last.mine && !last.everyone;
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

    for (const radio of document.querySelectorAll('input[name="usage-measure"]')) {
      radio.addEventListener('change', () => {
        if (!radio.checked) return;
        measure = measures[radio.value] || TOKENS;
        draw();
      });
    }

    return { load, clear };
  }

  return Object.freeze({ create, calendar });
})();
