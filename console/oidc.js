// Portcullis key console, the helpers without page state: PKCE (RFC 7636, S256), OpenID
// discovery, reading a JWT's claims for display, and times as the key list shows them. Loaded
// before console.js, which takes them from window.PortcullisOidc.
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

  return Object.freeze({ randomString, s256, consoleUrl, getJson, discover, decodeClaims, formatTime });
})();
