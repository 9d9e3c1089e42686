// A real OpenID provider for the sign-in tests: the npm package oidc-provider (scripts/install-oidc-provider puts
// it into .cache/oidc-provider), configured from a JSON file that tests/support/oidc.py writes:
//   {"issuer", "port", "keys": [private JWKs], "clients": [...], "accounts": {"<login>": {claims}},
//    "client_claims": {"<client_id>": {claims}}, "audience"}
// Its own login form (devInteractions) signs in any account the file names, with any password; the grant is
// given at once (no consent page). Access tokens are JWTs for "audience", holding the account's (or, for the
// client credentials grant, the client's) claims. Prints "ready" once it listens.
import { readFileSync } from 'node:fs';
import { join } from 'node:path';
import { pathToFileURL } from 'node:url';

// The package is installed outside the source tree: its directory comes in OIDC_PROVIDER_DIR.
const { default: Provider } = await import(
  pathToFileURL(join(process.env.OIDC_PROVIDER_DIR, 'node_modules', 'oidc-provider', 'lib', 'index.js')).href
);

const config = JSON.parse(readFileSync(process.argv[2], 'utf8'));
const resource = 'urn:zarr-gateway';
const scopes = 'openid email profile groups';

const provider = new Provider(config.issuer, {
  clients: config.clients,
  jwks: { keys: config.keys },
  cookies: { keys: ['oidc-provider-test-cookie-key'] },
  claims: { openid: ['sub'], email: ['email', 'email_verified'], profile: ['name'], groups: ['groups'] },
  scopes: ['openid', 'email', 'profile', 'groups'],
  conformIdTokenClaims: false, // the ID token holds the claims of its scopes (the gateway reads no userinfo)
  pkce: { required: () => true },
  features: {
    devInteractions: { enabled: true },
    clientCredentials: { enabled: true },
    resourceIndicators: {
      enabled: true,
      defaultResource: () => resource,
      useGrantedResource: () => true,
      getResourceServerInfo: () => ({
        scope: 'read',
        audience: config.audience,
        accessTokenTTL: 600,
        accessTokenFormat: 'jwt',
        jwt: { sign: { alg: 'RS256' } },
      }),
    },
  },
  async findAccount(ctx, id) {
    if (!(id in config.accounts)) return undefined;
    return { accountId: id, async claims() { return { sub: id, ...config.accounts[id] }; } };
  },
  async extraTokenClaims(ctx, token) {
    if (token.accountId) return config.accounts[token.accountId];
    return config.client_claims?.[token.clientId];
  },
  async loadExistingGrant(ctx) {
    const grantId = ctx.oidc.result?.consent?.grantId || ctx.oidc.session.grantIdFor(ctx.oidc.client.clientId);
    if (grantId) return ctx.oidc.provider.Grant.find(grantId);
    const grant = new ctx.oidc.provider.Grant({
      clientId: ctx.oidc.client.clientId,
      accountId: ctx.oidc.session.accountId,
    });
    grant.addOIDCScope(scopes);
    grant.addResourceScope(resource, 'read');
    await grant.save();
    return grant;
  },
});
provider.proxy = false;
provider.listen(config.port, '127.0.0.1', () => {
  process.stdout.write('ready\n');
});
