// Portcullis key console: sign in with OAuth 2.0 authorization code + PKCE (S256) at the
// configured OpenID provider, then create, list and revoke API keys through the gateway's
// key-management API on this page's own origin (/v1/keys), and show their usage (/v1/usage,
// drawn by usage.js), budgets (budgets.js) and teams (teams.js), all with this file's api(), so
// the token never leaves this closure.
//
// Where things live:
//   - the access token: in this script's memory only (never localStorage, sessionStorage or a
//     cookie); reloading the page signs out;
//   - the PKCE verifier and `state`: sessionStorage, for the redirect round trip only, removed
//     as soon as the provider sends the browser back;
//   - the full new API key: in the page until "I have stored the key" (the API shows it once).
// Every piece of data goes into the page with textContent or value, never as HTML. Nothing a
// redirect back from the provider carries (code, error, error_description) is used or shown
// before its `state` is checked: anyone can send a link to the console with any of them.
'use strict';

(() => {
  const FLOW_KEY = 'portcullis.console.signin';
  const $ = (id) => document.getElementById(id);

  let config = null; // /console/config.json
  let token = null; // { value, expiresAt (ms), sub, scopes }
  let shownKeyId = null; // the key whose secret the page shows right now
  let keys = []; // the pages of the key list loaded so far, newest first
  let nextCursor = null; // the `next` of the last page loaded; null: no older keys
  // oidc.js, loaded first: PKCE, discovery, reading claims, dates.
  const { randomString, s256, consoleUrl, getJson, discover, decodeClaims, formatTime } = window.PortcullisOidc;
  let usage = null; // usage.js's view, made in start() with this file's api(): the token stays here
  let budgets = null; // budgets.js's view, likewise
  let teams = null; // teams.js's view, likewise

  // ---- small helpers ----------------------------------------------------------------------

  function say(text, kind = 'info') {
    const el = $('message');
    el.dataset.kind = kind;
    el.textContent = text;
    // On a phone the form is far below the message: bring an error into view.
    if (kind === 'error' && el.getBoundingClientRect().top < 0) el.scrollIntoView({ block: 'nearest' });
  }

  // ---- sign-in: authorization code + PKCE --------------------------------------------------

  async function signIn() {
    if (!window.isSecureContext || !crypto.subtle) {
      say('Signing in needs a secure context: open the console over HTTPS or on localhost/127.0.0.1.', 'error');
      return;
    }
    $('sign-in').disabled = true;
    try {
      const doc = await discover(config.issuer);
      const verifier = randomString(32);
      const state = randomString(16);
      const scopes = [...config.scopes];
      if (config.admin_sign_in && $('admin-signin').checked && config.admin_scope && !scopes.includes(config.admin_scope)) {
        scopes.push(config.admin_scope);
      }
      const redirectUri = consoleUrl();
      sessionStorage.setItem(FLOW_KEY, JSON.stringify({ verifier, state, redirectUri }));
      const url = new URL(doc.authorization_endpoint);
      const params = {
        response_type: 'code',
        client_id: config.client_id,
        redirect_uri: redirectUri,
        scope: scopes.join(' '),
        resource: config.resource,
        state,
        code_challenge: await s256(verifier),
        code_challenge_method: 'S256',
      };
      for (const [k, v] of Object.entries(params)) url.searchParams.set(k, v);
      say('Redirecting to the identity provider…');
      location.assign(url.href);
    } catch (err) {
      sessionStorage.removeItem(FLOW_KEY);
      say(`Sign-in failed: ${err.message}`, 'error');
      $('sign-in').disabled = false;
    }
  }

  // Back from the provider with ?code=…&state=… (or ?error=…).
  async function finishSignIn(params) {
    let saved = null;
    try {
      saved = JSON.parse(sessionStorage.getItem(FLOW_KEY));
    } catch {
      saved = null;
    }
    sessionStorage.removeItem(FLOW_KEY);
    history.replaceState(null, '', consoleUrl());

    // First the state: a forged link must not put its own words (a fake error, a phone number
    // to call) on this page, so nothing else of the response is read before it matches.
    if (!saved || !saved.state || saved.state !== params.get('state')) {
      throw new Error('the sign-in response does not belong to a sign-in started here (state mismatch); try again');
    }
    if (params.has('error')) {
      const desc = params.get('error_description');
      throw new Error(`the identity provider answered ${params.get('error')}${desc ? `: ${desc}` : ''}`);
    }
    const doc = await discover(config.issuer);
    // RFC 9207: when the provider names itself in the response, it must be ours.
    if (params.has('iss') && params.get('iss') !== doc.issuer) {
      throw new Error('the sign-in response came from another identity provider');
    }
    const body = new URLSearchParams({
      grant_type: 'authorization_code',
      code: params.get('code') || '',
      redirect_uri: saved.redirectUri,
      code_verifier: saved.verifier,
      client_id: config.client_id,
      resource: config.resource,
    });
    let res;
    try {
      res = await fetch(doc.token_endpoint, {
        method: 'POST',
        headers: { 'content-type': 'application/x-www-form-urlencoded' },
        body,
        cache: 'no-store',
        credentials: 'omit',
      });
    } catch (err) {
      throw new Error(`cannot reach the token endpoint (${err.message}); does the provider allow this origin (CORS)?`);
    }
    let data = {};
    try {
      data = await res.json();
    } catch {
      data = {};
    }
    if (!res.ok || typeof data.access_token !== 'string') {
      throw new Error(`token request refused: ${data.error_description || data.error || `HTTP ${res.status}`}`);
    }
    const claims = decodeClaims(data.access_token);
    const lifetime = Number(data.expires_in) > 0 ? Number(data.expires_in) * 1000 : 5 * 60 * 1000;
    token = {
      value: data.access_token,
      expiresAt: Date.now() + lifetime,
      sub: claims.sub || null,
      scopes: String(data.scope || claims.scope || '').split(' ').filter(Boolean),
    };
  }

  function signOut(message) {
    token = null;
    clearNewKey();
    keys = [];
    nextCursor = null;
    $('more-keys').hidden = true;
    $('keys-body').replaceChildren();
    $('create-form').reset();
    if (usage) usage.clear();
    if (budgets) budgets.clear();
    if (teams) teams.clear();
    render();
    say(message || 'Signed out. The page no longer holds a token.', message ? 'error' : 'info');
  }

  // ---- the key API -------------------------------------------------------------------------

  class ApiError extends Error {
    constructor(status, code, message) {
      super(message || code || `HTTP ${status}`);
      this.status = status;
      this.code = code;
    }
  }

  async function api(method, path, body) {
    if (!token) throw new ApiError(401, 'unauthorized', 'not signed in');
    if (Date.now() >= token.expiresAt) {
      signOut('Your sign-in has expired: sign in again.');
      throw new ApiError(401, 'unauthorized', 'sign-in expired');
    }
    const headers = { authorization: `Bearer ${token.value}`, accept: 'application/json' };
    if (body !== undefined) headers['content-type'] = 'application/json';
    let res;
    try {
      res = await fetch(new URL(path, location.origin), {
        method,
        headers,
        body: body === undefined ? undefined : JSON.stringify(body),
        cache: 'no-store',
        credentials: 'omit',
      });
    } catch (err) {
      throw new ApiError(0, 'network', `cannot reach the gateway (${err.message})`);
    }
    if (res.status === 204) return null;
    let data = null;
    try {
      data = await res.json();
    } catch {
      data = null;
    }
    if (!res.ok) {
      const code = data && typeof data.error === 'string' ? data.error : null;
      const message = data && typeof data.message === 'string' ? data.message : null;
      if (res.status === 401) {
        signOut('The gateway did not accept your sign-in (expired or not valid for it): sign in again.');
      }
      throw new ApiError(res.status, code, message);
    }
    return data;
  }

  function describe(err) {
    if (!(err instanceof ApiError)) return err.message;
    const hints = {
      403: 'You are not allowed to do this (a key can only get scopes your sign-in has).',
      404: 'No such key (or not yours).',
      409: 'You have reached the maximum number of keys: revoke one first.',
    };
    const text = err.message && err.message !== err.code ? err.message : hints[err.status] || err.code || 'request failed';
    return err.status ? `${text} (HTTP ${err.status}${err.code ? ` ${err.code}` : ''})` : text;
  }

  // ---- rendering -----------------------------------------------------------------------------

  function render() {
    const signedIn = Boolean(token);
    $('signed-out').hidden = signedIn;
    $('app').hidden = !signedIn;
    $('sign-out').hidden = !signedIn;
    $('who').hidden = !signedIn;
    $('sign-in').disabled = !config;
    if (signedIn) {
      const admin = isAdmin();
      $('who').textContent = `Signed in as ${token.sub || 'unknown user'}${admin ? ' (administrator)' : ''}`;
    }
  }

  // As far as the page can tell: the gateway may also require a listed `sub` (admin_subjects).
  function isAdmin() {
    return Boolean(token && config && config.admin_sign_in && token.scopes.includes(config.admin_scope));
  }

  function renderScopes() {
    const list = $('scope-list');
    list.replaceChildren();
    const scopes = config.scopes.filter((s) => s !== 'openid' && s !== config.admin_scope);
    scopes.forEach((scope, i) => {
      const label = document.createElement('label');
      const box = document.createElement('input');
      box.type = 'checkbox';
      box.id = `scope-${i}`;
      box.name = 'scope';
      box.value = scope;
      box.dataset.scope = scope;
      box.dataset.testid = `scope-${scope}`;
      label.htmlFor = box.id;
      label.append(box, document.createTextNode(scope));
      list.append(label);
    });
  }

  function cell(row, label, text, className) {
    const td = document.createElement('td');
    td.dataset.label = label;
    if (className) td.className = className;
    td.textContent = text;
    row.append(td);
    return td;
  }

  function statusOf(key) {
    if (key.revoked) return ['revoked', `revoked ${formatTime(key.revoked)}`];
    if (key.expires && new Date(key.expires).getTime() <= Date.now()) return ['expired', 'expired'];
    return ['active', 'active'];
  }

  function renderKeys() {
    const body = $('keys-body');
    body.replaceChildren();
    for (const key of keys) {
      const row = document.createElement('tr');
      row.dataset.keyId = key.id;
      row.dataset.testid = `key-${key.id}`;
      const [status, statusText] = statusOf(key);
      row.dataset.status = status;
      cell(row, 'Name', key.name || '—');
      cell(row, 'ID', key.id, 'id');
      cell(row, 'Scopes', (key.scopes || []).join(', ') || '—');
      cell(row, 'Owner', key.owner || '—');
      cell(row, 'Created', formatTime(key.created));
      cell(row, 'Expires', key.expires ? formatTime(key.expires) : 'never');
      const st = cell(row, 'Status', statusText, `status-${status}`);
      st.dataset.testid = 'status';
      row.append(budgets.keyCell(key));
      const actions = cell(row, '', '', 'actions');
      if (status === 'active') {
        actions.append(budgets.editButton(key, row));
        const btn = document.createElement('button');
        btn.type = 'button';
        btn.className = 'danger';
        btn.textContent = 'Revoke';
        btn.dataset.testid = `revoke-${key.id}`;
        btn.setAttribute('aria-label', `Revoke key ${key.name || key.id} (${key.id})`);
        btn.addEventListener('click', () => revoke(key, btn));
        actions.append(btn);
      }
      body.append(row);
    }
    $('keys-empty').hidden = keys.length > 0;
    $('more-keys').hidden = !nextCursor;
  }

  // A key as the API answered a change of it (its budget), in place of the one listed.
  function updateKey(changed) {
    keys = keys.map((k) => (k.id === changed.id ? changed : k));
    renderKeys();
  }

  // The API pages the list, newest first: the first page on load, older ones on request.
  async function loadKeys(more = false) {
    const path = more && nextCursor ? `/v1/keys?cursor=${encodeURIComponent(nextCursor)}` : '/v1/keys';
    const data = await api('GET', path);
    const page = Array.isArray(data && data.keys) ? data.keys : [];
    keys = more ? keys.concat(page.filter((k) => !keys.some((have) => have.id === k.id))) : page;
    nextCursor = data && typeof data.next === 'string' ? data.next : null;
    renderKeys();
  }

  function clearNewKey() {
    shownKeyId = null;
    $('new-key-value').value = '';
    $('curl-command').textContent = '';
    $('new-key').hidden = true;
  }

  function curlFor(key, scope) {
    const base = String(config.gateway_url || '').replace(/\/+$/, '');
    const body = JSON.stringify({ messages: [{ role: 'user', content: 'Hello' }] });
    return `curl ${base}/v1/${scope}/v1/chat/completions \\\n  -H "Authorization: Bearer ${key}" \\\n  -H 'content-type: application/json' \\\n  -d '${body}'`;
  }

  function showNewKey(created, scope) {
    shownKeyId = created.id;
    $('new-key-value').value = created.key;
    $('curl-command').textContent = curlFor(created.key, scope);
    $('new-key').hidden = false;
    $('new-key-value').focus();
    $('new-key-value').select();
  }

  async function copy(text, what) {
    try {
      await navigator.clipboard.writeText(text);
      say(`${what} copied to the clipboard.`, 'ok');
    } catch {
      say(`Could not copy automatically: select the ${what.toLowerCase()} and copy it by hand.`, 'error');
    }
  }

  // ---- actions ---------------------------------------------------------------------------------

  async function create(event) {
    event.preventDefault();
    const name = $('key-name').value.trim();
    const scopes = [...$('scope-list').querySelectorAll('input[type=checkbox]:checked')].map((b) => b.value);
    if (!name) {
      say('Give the key a name.', 'error');
      $('key-name').focus();
      return;
    }
    if (scopes.length === 0) {
      say('Choose at least one scope.', 'error');
      const first = $('scope-list').querySelector('input');
      if (first) first.focus();
      return;
    }
    const budget = budgets.readCreate();
    if (budget.error) {
      say(budget.error, 'error');
      budget.input.focus();
      return;
    }
    const request = { name, scopes };
    if ($('key-expiry').value) request.expires_in = $('key-expiry').value;
    if (budget.value) request.budget = budget.value;
    const button = $('create-key');
    button.disabled = true;
    try {
      const created = await api('POST', '/v1/keys', request);
      showNewKey(created, scopes[0]);
      $('create-form').reset();
      say(`Key "${created.name}" (${created.id}) created. Copy it now: it will not be shown again.`, 'ok');
      await loadKeys();
    } catch (err) {
      if (token) say(`Could not create the key: ${describe(err)}`, 'error'); // else: signed out, said why
    } finally {
      button.disabled = false;
    }
  }

  async function revoke(key, button) {
    const label = key.name ? `"${key.name}" (${key.id})` : key.id;
    if (!window.confirm(`Revoke key ${label}? Anything using it stops working within seconds. This cannot be undone.`)) {
      return;
    }
    button.disabled = true;
    try {
      await api('DELETE', `/v1/keys/${encodeURIComponent(key.id)}`);
      if (shownKeyId === key.id) clearNewKey();
      say(`Key ${label} revoked.`, 'ok');
      await loadKeys();
      $('keys-title').focus();
    } catch (err) {
      button.disabled = false;
      if (token) say(`Could not revoke the key: ${describe(err)}`, 'error');
    }
  }

  // ---- start -----------------------------------------------------------------------------------

  async function start() {
    $('sign-in').addEventListener('click', signIn);
    $('sign-out').addEventListener('click', () => signOut());
    $('create-form').addEventListener('submit', create);
    $('refresh-keys').addEventListener('click', () => Promise.all([loadKeys(), budgets.load(), teams.load()]).then(
      () => say('Key list refreshed.'),
      (err) => token && say(`Could not list keys: ${describe(err)}`, 'error'),
    ));
    $('more-keys').addEventListener('click', () => loadKeys(true).catch(
      (err) => token && say(`Could not list keys: ${describe(err)}`, 'error'),
    ));
    $('copy-key').addEventListener('click', () => copy($('new-key-value').value, 'Key'));
    $('copy-curl').addEventListener('click', () => copy($('curl-command').textContent, 'Command'));
    $('dismiss-key').addEventListener('click', () => {
      clearNewKey();
      say('The key is no longer shown on this page.');
      $('key-name').focus();
    });
    $('keys-title').tabIndex = -1;

    try {
      config = await getJson(new URL('config.json', location.href).href, 'console configuration');
    } catch (err) {
      say(err.message, 'error');
      render();
      return;
    }
    // The views are made once the configuration names the currency their costs are in.
    const currency = typeof config.currency === 'string' && config.currency ? config.currency : 'USD';
    for (const el of document.querySelectorAll('.currency-name')) el.textContent = currency;
    const viewer = () => ({ signedIn: Boolean(token), sub: token && token.sub, admin: isAdmin() });
    usage = window.PortcullisUsage.create({ api, describe, keys: () => keys, viewer, currency });
    budgets = window.PortcullisBudgets.create({ api, describe, say, viewer, updateKey, currency });
    teams = window.PortcullisTeams.create({ api, describe, viewer, currency });
    $('refresh-usage').addEventListener('click', () => usage.load());
    $('admin-scope-name').textContent = config.admin_scope || '';
    // Offered only when the operator configured it: an issuer that grants whatever scope is
    // asked for would otherwise make anyone ticking the box an administrator.
    $('admin-signin-option').hidden = !config.admin_sign_in;
    $('gateway-info').textContent = `Gateway: ${config.gateway_url} · Identity provider: ${config.issuer}`;
    renderScopes();

    const params = new URLSearchParams(location.search);
    if (params.has('code') || params.has('error')) {
      try {
        await finishSignIn(params);
      } catch (err) {
        token = null;
        render();
        say(`Sign-in failed: ${err.message}`, 'error');
        return;
      }
      render();
      try {
        await loadKeys();
        say(`Signed in${token && token.sub ? ` as ${token.sub}` : ''}.`, 'ok');
      } catch (err) {
        if (token) say(`Could not list keys: ${describe(err)}`, 'error');
      }
      if (token) await Promise.all([usage.load(), budgets.load(), teams.load()]); // after the keys, whose names usage shows
      return;
    }
    // A stale round trip (the user came back without finishing) leaves nothing behind.
    sessionStorage.removeItem(FLOW_KEY);
    render();
  }

  start();
})();
