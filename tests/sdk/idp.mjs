// A real OpenID Provider for the SDK tests: oidc-provider 9.x (OpenID Certified) on loopback,
// issuing RFC 9068 JWT access tokens for the gateway's audience.
//
//   node tests/sdk/idp.mjs --port 0 --audience urn:portcullis:test
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
  },
});

const SERVICE_SCOPES = 'infer chatx chaty embed';
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
  scopes: ['openid', ...SERVICE_SCOPES.split(' ')],
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
  ],
  features: {
    devInteractions: { enabled: true },
    clientCredentials: { enabled: true },
    resourceIndicators: {
      enabled: true,
      getResourceServerInfo: async (ctx, resourceIndicator) => {
        if (!RESOURCES.has(resourceIndicator)) throw new errors.InvalidTarget();
        return {
          scope: SERVICE_SCOPES,
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
