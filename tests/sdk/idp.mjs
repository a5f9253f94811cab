// A real OpenID Provider for the SDK tests: oidc-provider 9.x (OpenID Certified) on loopback,
// issuing RFC 9068 JWT access tokens for the gateway's audience.
//
//   node tests/sdk/idp.mjs --port 0 --audience urn:portcullis:test \
//        [--console-redirect http://127.0.0.1:9200/console/] [--console-client-id portcullis-console]
//
// Prints `LISTENING <port>` once it serves; the issuer is http://127.0.0.1:<port>.
// A fresh RSA signing key with a random kid is generated at every start (oidc-provider's own
// default keystore is a fixed development key, which would hide a rotation), so restarting on
// the same port is a key rotation as the gateway sees it.
//
// Clients (secrets are test-only constants; nothing here leaves loopback):
//   svc-cc   client_credentials, allowed scopes `infer embed` (so chatx/chaty give 403)
//   console  authorization_code (+ openid for the ID token), all four service scopes;
//            the login/consent pages are oidc-provider's devInteractions, driven headless.
//   portcullis-console (--console-client-id)  the key-management console (console/ in the
//            gateway): a public client (no secret, PKCE S256) whose redirect URIs are the
//            --console-redirect values (repeatable or comma-separated; none: client omitted).
//            Its token endpoint calls are cross-origin, so CORS is allowed for the origins of
//            those redirect URIs only. Any login name becomes the `sub`; the login `admin`
//            may also be granted `portcullis:admin` (the gateway's key-admin scope), other
//            logins only service scopes (a request for it is dropped, not refused).
import { generateKeyPairSync, randomBytes } from 'node:crypto';
import http from 'node:http';
import { parseArgs } from 'node:util';

import Provider, { errors } from 'oidc-provider';

const { values: args } = parseArgs({
  options: {
    port: { type: 'string', default: '0' },
    audience: { type: 'string', default: 'urn:portcullis:test' },
    // A second resource server, so a test can get a well-signed token for someone else.
    'other-audience': { type: 'string', default: 'urn:portcullis:other' },
    'console-client-id': { type: 'string', default: 'portcullis-console' },
    'console-redirect': { type: 'string', multiple: true, default: [] },
  },
});

const SERVICE_SCOPES = 'infer chatx chaty embed';
const ADMIN_SCOPE = 'portcullis:admin';
const ADMIN_LOGIN = 'admin';
const CONSOLE_REDIRECTS = args['console-redirect'].flatMap((v) => v.split(',')).map((v) => v.trim()).filter(Boolean);
const CONSOLE_ORIGINS = new Set(CONSOLE_REDIRECTS.map((uri) => new URL(uri).origin));
const RESOURCES = new Set([args.audience, args['other-audience']]);

function freshSigningKey() {
  const { privateKey } = generateKeyPairSync('rsa', { modulusLength: 2048 });
  return {
    ...privateKey.export({ format: 'jwk' }),
    kid: randomBytes(12).toString('base64url'),
    alg: 'RS256',
    use: 'sig',
  };
}

// The signed-in account of a request: the session's at the authorization endpoint (once the
// login is done), the code's at the token endpoint; none for client_credentials.
function accountOf(ctx) {
  const { entities } = ctx.oidc ?? {};
  return entities?.Account?.accountId ?? entities?.Session?.accountId ?? entities?.Grant?.accountId;
}

const server = http.createServer();
await new Promise((resolve, reject) => {
  server.once('error', reject);
  server.listen(Number(args.port), '127.0.0.1', resolve);
});
const { port } = server.address();
const issuer = `http://127.0.0.1:${port}`;

const provider = new Provider(issuer, {
  jwks: { keys: [freshSigningKey()] },
  // Resource scopes are listed here too, so each client's `scope` allow-list applies to them.
  scopes: ['openid', ...SERVICE_SCOPES.split(' '), ADMIN_SCOPE],
  clients: [
    {
      client_id: 'svc-cc',
      client_secret: 'svc-cc-test-secret',
      grant_types: ['client_credentials'],
      response_types: [],
      redirect_uris: [],
      scope: 'infer embed',
    },
    {
      client_id: 'console',
      client_secret: 'console-test-secret',
      grant_types: ['authorization_code'],
      response_types: ['code'],
      redirect_uris: ['http://127.0.0.1/callback'],
      scope: `openid ${SERVICE_SCOPES}`,
    },
    ...(CONSOLE_REDIRECTS.length ? [{
      client_id: args['console-client-id'],
      token_endpoint_auth_method: 'none', // public: a browser page keeps no secret; PKCE is required
      grant_types: ['authorization_code'],
      response_types: ['code'],
      redirect_uris: CONSOLE_REDIRECTS,
      scope: `openid ${SERVICE_SCOPES} ${ADMIN_SCOPE}`,
    }] : []),
  ],
  // The console's token request comes from its own origin: allow exactly the public console
  // client's redirect origins (what the library's default does, stated so it is not a default).
  clientBasedCORS: (ctx, origin, client) => client.clientAuthMethod === 'none'
    && client.clientId === args['console-client-id'] && CONSOLE_ORIGINS.has(origin),
  features: {
    devInteractions: { enabled: true },
    clientCredentials: { enabled: true },
    resourceIndicators: {
      enabled: true,
      getResourceServerInfo: async (ctx, resourceIndicator) => {
        if (!RESOURCES.has(resourceIndicator)) throw new errors.InvalidTarget();
        return {
          // The admin scope exists for the `admin` login only: for anyone else a request for it
          // is filtered out (at the authorization endpoint after login, and at the token one).
          scope: accountOf(ctx) === ADMIN_LOGIN ? `${SERVICE_SCOPES} ${ADMIN_SCOPE}` : SERVICE_SCOPES,
          audience: resourceIndicator,
          accessTokenTTL: 10 * 60,
          accessTokenFormat: 'jwt', // RFC 9068: typ at+jwt, iss, sub, aud, exp, client_id, scope
          jwt: { sign: { alg: 'RS256' } },
        };
      },
    },
  },
});

provider.on('server_error', (ctx, err) => console.error('idp server_error:', err));
server.on('request', provider.callback());

const stop = () => {
  server.close(() => process.exit(0));
  server.closeAllConnections(); // the gateway keeps JWKS connections alive
  setTimeout(() => process.exit(0), 2000).unref();
};
process.on('SIGTERM', stop);
process.on('SIGINT', stop);

console.log(`LISTENING ${port}`);
