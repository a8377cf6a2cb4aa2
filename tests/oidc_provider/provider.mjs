// A real OpenID Provider for the sign-in tests (tests/registry/test_oidc_browser.py): node's oidc-provider,
// the certified OP library, on loopback. Started as `node provider.mjs PORT STATE_FILE`; it prints
// "ready ISSUER" once it listens.
//
// What it serves is a real OP: discovery, JWKS, the authorization code flow with PKCE required (S256 only),
// client_secret_basic at the token endpoint, ID tokens signed RS256 with a key made at start. Its login
// page is oidc-provider's development one (any login and password; the login is the subject), and consent
// is given at once, as a company OP does for its own applications.
//
// STATE_FILE (JSON), read at every request so a test can change it while the OP runs:
//   {"clients": [{"client_id", "client_secret", "redirect_uris": [...]}],   (read at start only)
//    "accounts": {"alice": {"groups": ["ml-eng"], "email": "alice@example.test", "name": "Alice"}},
//    "tamper": null | {"aud": "another-app"} | {"expired": true}}
// "tamper" makes the token endpoint hand back an ID token re-signed with the OP's own key but for another
// audience, or expired an hour ago: what a relying party must refuse.

import fs from 'node:fs';
import crypto from 'node:crypto';

import * as jose from 'jose';
import Provider from 'oidc-provider';

const [port, stateFile] = process.argv.slice(2);
if (!port || !stateFile) {
  console.error('usage: node provider.mjs PORT STATE_FILE');
  process.exit(2);
}
const issuer = `http://127.0.0.1:${port}`;
const state = () => JSON.parse(fs.readFileSync(stateFile, 'utf8'));

const { privateKey } = await jose.generateKeyPair('RS256', { extractable: true });
const signingJwk = { ...(await jose.exportJWK(privateKey)), kid: 'test-key-1', alg: 'RS256', use: 'sig' };

const provider = new Provider(issuer, {
  clients: state().clients.map((client) => ({
    grant_types: ['authorization_code'],
    response_types: ['code'],
    token_endpoint_auth_method: 'client_secret_basic',
    ...client,
  })),
  jwks: { keys: [signingJwk] },
  cookies: { keys: [crypto.randomBytes(32).toString('hex')] },
  pkce: { required: () => true },
  claims: {
    openid: ['sub'],
    email: ['email', 'email_verified'],
    profile: ['name', 'preferred_username'],
    groups: ['groups'],
  },
  // The claims the scopes ask for go in the ID token too, as Okta's and Entra ID's groups claims do.
  conformIdTokenClaims: false,
  features: { devInteractions: { enabled: true } },
  async findAccount(ctx, id) {
    const account = state().accounts[id] ?? {};
    return {
      accountId: id,
      async claims() {
        return {
          sub: id,
          preferred_username: id,
          name: account.name ?? id,
          email: account.email ?? `${id}@example.test`,
          email_verified: true,
          groups: account.groups ?? [],
        };
      },
    };
  },
  // Consent is given at once: a company OP's first-party applications get no consent screen.
  async loadExistingGrant(ctx) {
    const grantId = ctx.oidc.result?.consent?.grantId || ctx.oidc.session.grantIdFor(ctx.oidc.client.clientId);
    if (grantId) {
      return ctx.oidc.provider.Grant.find(grantId);
    }
    const grant = new ctx.oidc.provider.Grant({
      clientId: ctx.oidc.client.clientId,
      accountId: ctx.oidc.session.accountId,
    });
    grant.addOIDCScope('openid email profile groups');
    grant.addOIDCClaims(['sub', 'email', 'email_verified', 'name', 'preferred_username', 'groups']);
    await grant.save();
    return grant;
  },
});

provider.use(async (ctx, next) => {
  await next();
  const tamper = state().tamper;
  if (!tamper || ctx.path !== '/token' || ctx.method !== 'POST' || !ctx.body?.id_token) {
    return;
  }
  const claims = jose.decodeJwt(ctx.body.id_token);
  const now = Math.floor(Date.now() / 1000);
  if (tamper.aud) {
    claims.aud = tamper.aud;
    delete claims.azp;
  }
  if (tamper.expired) {
    claims.iat = now - 7200;
    claims.exp = now - 3600;
  }
  ctx.body = {
    ...ctx.body,
    id_token: await new jose.SignJWT(claims)
      .setProtectedHeader({ alg: 'RS256', kid: signingJwk.kid, typ: 'JWT' })
      .sign(privateKey),
  };
});

provider.listen(Number(port), '127.0.0.1', () => {
  console.log(`ready ${issuer}`);
});
