// Portcullis key console, the helpers without page state: PKCE (RFC 7636, S256), OpenID
// discovery, reading a JWT's claims for display, times as the key list shows them and amounts
// of money as every view shows them. Loaded first: console.js takes them from
// window.PortcullisOidc, and hands formatMoney to the other views.
'use strict';

window.PortcullisOidc = (() => {
  function b64url(bytes) {
    let bin = '';
    for (const b of bytes) bin += String.fromCharCode(b);
    return btoa(bin).replace(/\+/g, '-').replace(/\//g, '_').replace(/=+$/, '');
  }

  function randomString(bytes) {
    return b64url(crypto.getRandomValues(new Uint8Array(bytes)));
  }

  async function s256(text) {
    const digest = await crypto.subtle.digest('SHA-256', new TextEncoder().encode(text));
    return b64url(new Uint8Array(digest));
  }

  // The console's own address, the redirect URI: this page's folder (/console/, also when the
  // page was opened as /console/index.html), without query or fragment.
  function consoleUrl() {
    return new URL('.', location.origin + location.pathname).href;
  }

  async function getJson(url, what) {
    let res;
    try {
      res = await fetch(url, { cache: 'no-store', credentials: 'omit' });
    } catch (err) {
      throw new Error(`${what}: cannot reach ${url} (${err.message})`);
    }
    if (!res.ok) throw new Error(`${what}: ${url} answered HTTP ${res.status}`);
    return res.json();
  }

  async function discover(configured) {
    const issuer = configured.replace(/\/+$/, '');
    const doc = await getJson(`${issuer}/.well-known/openid-configuration`, 'OpenID discovery');
    if (doc.issuer !== configured) {
      throw new Error(`OpenID discovery: the provider calls itself ${doc.issuer}, not ${configured}`);
    }
    if (!doc.authorization_endpoint || !doc.token_endpoint) {
      throw new Error('OpenID discovery: no authorization or token endpoint');
    }
    const methods = doc.code_challenge_methods_supported;
    if (Array.isArray(methods) && !methods.includes('S256')) {
      throw new Error('the identity provider does not support PKCE S256');
    }
    return doc;
  }

  function decodeClaims(jwt) {
    try {
      const part = jwt.split('.')[1].replace(/-/g, '+').replace(/_/g, '/');
      const json = decodeURIComponent(Array.from(atob(part), (c) => `%${c.charCodeAt(0).toString(16).padStart(2, '0')}`).join(''));
      return JSON.parse(json);
    } catch {
      return {}; // not a JWT the page can read: the gateway decides anyway
    }
  }

  function formatTime(value) {
    if (!value) return '—';
    const d = new Date(value);
    if (Number.isNaN(d.getTime())) return String(value);
    return d.toISOString().replace('T', ' ').replace(/\.\d+Z$/, ' UTC').replace(/Z$/, ' UTC');
  }

  // An amount of `currency` (the gateway's [pricing] currency, a label it never converts):
  // "$0.0125" for an ISO 4217 code, else "0.0125 credits". At least two decimals, at most the
  // six the gateway keeps, so a small cost is never rounded away to 0.
  const moneyFormats = new Map();
  function formatMoney(units, currency) {
    const label = String(currency || '');
    if (!moneyFormats.has(label)) {
      const digits = { minimumFractionDigits: 2, maximumFractionDigits: 6 };
      let format;
      try {
        const intl = new Intl.NumberFormat('en', { style: 'currency', currency: label, ...digits });
        format = (n) => intl.format(n);
      } catch {
        const intl = new Intl.NumberFormat('en', digits);
        format = (n) => (label ? `${intl.format(n)} ${label}` : intl.format(n));
      }
      moneyFormats.set(label, format);
    }
    return moneyFormats.get(label)(Number(units) || 0);
  }

  return Object.freeze({ randomString, s256, consoleUrl, getJson, discover, decodeClaims, formatTime, formatMoney });
})();
