// Authentication of the public API and between services: API keys (hashed at rest, constant-time
// check, per-key rate and concurrency limits), what `serve` refuses to start with, handles and
// request ids bound to the key that made them, chunk keys salted per key, the Host check and a
// docs page that loads nothing from a CDN.
import http from "node:http";
import { parseArgs } from "node:util";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { UsageError } from "../../shared/inference/errors.ts";
import { keysCommand } from "../../bin/keys.ts";
import { ApiKeyError, ApiKeys, newApiKey, parseApiKeys } from "../../shared/platform/auth/api-keys.ts";
import { InternalAuth, Nonces } from "../../shared/platform/auth/capability.ts";
import { AllowedHosts } from "../../shared/platform/auth/hosts.ts";
import { KeyLimiter, share } from "../../shared/platform/auth/rate-limit.ts";
import { ConfigError, configFlags, loadConfig } from "../../shared/platform/config.ts";
import { chunkKey } from "../../services/handoff/format/chunk-key.ts";
import type { Handle } from "../../shared/platform/http/wire.ts";
import { getJson } from "../../tools/lib/services.ts";
import { postJson } from "../harness/http.ts";
import { type Serve, startServe } from "../harness/serve.ts";

const DEFAULTS = { rate: 10, burst: 20, concurrency: 8 };

describe("API keys", () => {
  it("stores only a hash, finds the key by id and compares in constant time", () => {
    const { key, line } = newApiKey("alice", { rate: 2, burst: 3, concurrency: 1 });
    expect(key).toMatch(/^ctxb_alice_[A-Za-z0-9_-]{43}$/);
    expect(line).not.toContain(key.slice(11));
    expect(line).toMatch(/^alice sha256:[0-9a-f]{64} rate=2 burst=3 concurrency=1$/);
    const keys = new ApiKeys(parseApiKeys(`# comment\n${line}\n`, DEFAULTS, "test"));
    expect(keys.verify(key)).toMatchObject({ id: "alice", limits: { rate: 2, burst: 3, concurrency: 1 } });
    expect(keys.verify(key.slice(0, -1) + (key.endsWith("A") ? "B" : "A"))).toBeUndefined();
    expect(keys.verify(key.replace("alice", "bob"))).toBeUndefined();
    expect(keys.verify("")).toBeUndefined();
  });

  it("`ctxbank keys new` prints the key on stdout and the line on stderr, which the server accepts", () => {
    const out: string[] = [];
    const err: string[] = [];
    expect(
      keysCommand(
        ["new", "team-1", "--rate", "3", "--concurrency", "2"],
        (x) => out.push(x),
        (x) => err.push(x),
      ),
    ).toBe(0);
    const key = out.join("").trim();
    const keys = ApiKeys.load({ inline: err.join("") }, DEFAULTS);
    expect(keys.verify(key)).toMatchObject({ id: "team-1", limits: { rate: 3, burst: 20, concurrency: 2 } });
    expect(() =>
      keysCommand(
        ["new", "bad_id"],
        () => {},
        () => {},
      ),
    ).toThrow(UsageError);
    expect(() =>
      keysCommand(
        ["new", "x", "--rate", "-1"],
        () => {},
        () => {},
      ),
    ).toThrow(/--rate/);
  });

  it("refuses malformed lines with the entry named", () => {
    expect(() => parseApiKeys("alice md5:abc", DEFAULTS, "f")).toThrow(/f, line 1: the hash must be sha256/);
    expect(() => parseApiKeys(`local sha256:${"0".repeat(64)}`, DEFAULTS, "f")).toThrow(ApiKeyError);
    expect(() => parseApiKeys(`a:b sha256:${"0".repeat(64)}`, DEFAULTS, "f")).toThrow(/bad key id/);
    expect(() => parseApiKeys(`a sha256:${"0".repeat(64)} speed=3`, DEFAULTS, "f")).toThrow(/bad option/);
    expect(() => parseApiKeys(`a sha256:${"0".repeat(64)};a sha256:${"1".repeat(64)}`, DEFAULTS, "f")).toThrow(/twice/);
  });

  it("limits each key: a token bucket and requests in flight, with the wait", () => {
    let now = 0;
    const limiter = new KeyLimiter(() => now);
    const limits = { rate: 2, burst: 2, concurrency: 0 };
    expect(limiter.admit("a", limits).ok).toBe(true);
    expect(limiter.admit("a", limits).ok).toBe(true);
    expect(limiter.admit("a", limits)).toEqual({ ok: false, code: "rate_limited", retryAfterS: 1 });
    expect(limiter.admit("b", limits).ok).toBe(true); // another key has its own bucket
    now += 500; // one token back at 2/s
    expect(limiter.admit("a", limits).ok).toBe(true);
    const one = { rate: 0, burst: 1, concurrency: 1 };
    const first = limiter.admit("c", one);
    expect(first.ok).toBe(true);
    expect(limiter.admit("c", one)).toMatchObject({ ok: false, code: "concurrency_limited" });
    if (first.ok) first.release();
    expect(limiter.admit("c", one).ok).toBe(true);
  });

  it("several gates (routers) each hold an equal share of a key's limits, never less than one request", () => {
    let gates = 2;
    const limiter = new KeyLimiter(
      () => 0,
      () => gates,
    );
    const limits = { rate: 10, burst: 4, concurrency: 4 };
    const admitted = Array.from({ length: 4 }, () => limiter.admit("a", limits));
    expect(admitted.map((a) => a.ok)).toEqual([true, true, false, false]); // a burst of 2 here
    expect(share(limits, 2)).toEqual({ rate: 5, burst: 2, concurrency: 2 });
    expect(share(limits, 8)).toEqual({ rate: 1.25, burst: 1, concurrency: 1 });
    expect(share({ rate: 0, burst: 1, concurrency: 0 }, 3)).toEqual({ rate: 0, burst: 1, concurrency: 0 }); // unlimited stays so
    gates = 1;
    expect(share(limits, gates)).toBe(limits);
  });
});

describe("capabilities", () => {
  const auth = new InternalAuth("s".repeat(40));
  const cap = { route: "prefill" as const, tenant: "alice", exp: Date.now() + 10_000, nonce: InternalAuth.nonce() };
  it("verify what was signed, refuse a changed payload, another secret or an expired one", () => {
    const token = auth.sign(cap);
    expect(auth.verify(token)).toEqual(cap);
    const [payload, mac] = token.split(".");
    const changed = Buffer.from(JSON.stringify({ ...cap, tenant: "mallory" })).toString("base64url");
    expect(auth.verify(`${changed}.${mac}`)).toBeUndefined();
    expect(new InternalAuth("t".repeat(40)).verify(token)).toBeUndefined();
    expect(auth.verify(auth.sign({ ...cap, exp: Date.now() - 1 }))).toBeUndefined();
    expect(auth.verify(`${payload}`)).toBeUndefined();
    expect(() => new InternalAuth("short")).toThrow(/32/);
  });

  it("a single-use nonce is accepted once until it expires; expired ones are forgotten", () => {
    const nonces = new Nonces();
    const now = 1_000_000;
    expect(nonces.use("n1", now + 1_000, now)).toBe(true);
    expect(nonces.use("n1", now + 1_000, now + 10)).toBe(false);
    expect(nonces.use("n2", now + 2_000, now + 10)).toBe(true);
    expect(nonces.use("n3", now + 3_000, now + 1_500)).toBe(true); // n1 expired: dropped
    expect(nonces.size).toBe(2);
  });
});

describe("what the services refuse to start with", () => {
  it("a non-loopback bind without keys, unless --insecure", () => {
    expect(() => loadConfig("serve", { host: "0.0.0.0" }, {})).toThrow(ConfigError);
    expect(() => loadConfig("serve", { host: "0.0.0.0" }, {})).toThrow(/without API keys.*--insecure/);
    expect(loadConfig("serve", { host: "0.0.0.0", insecure: true }, {}).insecure).toBe(true);
    // As the command line gives it: a flag without a value.
    const { values } = parseArgs({ args: ["--host", "0.0.0.0", "--insecure"], options: configFlags(), strict: true });
    expect(loadConfig("serve", values, {}).insecure).toBe(true);
    expect(loadConfig("serve", { host: "0.0.0.0" }, { CTXBANK_API_KEYS: newApiKey("a").line }).host).toBe("0.0.0.0");
    expect(loadConfig("serve", {}, {}).host).toBe("127.0.0.1"); // loopback: keyless is fine
  });

  it("separate processes without the shared secret; an internal listener off loopback without one", () => {
    const pg = { DATABASE_URL: "postgres://u@h/db" };
    expect(() => loadConfig("prefill", {}, pg)).toThrow(/CTXBANK_INTERNAL_SECRET/);
    expect(() => loadConfig("decode", {}, { ...pg, CTXBANK_INTERNAL_SECRET: "too short" })).toThrow(/at least 32/);
    expect(loadConfig("decode", {}, { ...pg, CTXBANK_INTERNAL_SECRET: "x".repeat(32) }).role).toBe("decode");
    expect(() => loadConfig("serve", { "internal-host": "0.0.0.0" }, {})).toThrow(/internal listener on 0.0.0.0 without a shared secret/);
    expect(() => loadConfig("serve", { port: "9000", "internal-port": "9000" }, {})).toThrow(/a port of its own/);
  });
});

describe("hosts", () => {
  it("allows loopback names, configured hosts and refuses others", () => {
    const hosts = AllowedHosts.fromConfig({
      host: "0.0.0.0",
      internalHost: "127.0.0.1",
      publicUrl: "http://api.example:8080",
      allowedHosts: ["gw.example"],
    });
    for (const h of ["localhost:8080", "127.0.0.1", "[::1]:80", "api.example", "API.EXAMPLE:8080", "gw.example"])
      expect(hosts.allows(h), h).toBe(true);
    for (const h of ["evil.example", "evil.example:8080", "0.0.0.0", undefined]) expect(hosts.allows(h), String(h)).toBe(false);
    expect(new AllowedHosts(["*"]).allows("anything")).toBe(true);
  });
});

describe("a keyed server", () => {
  const alice = newApiKey("alice", { rate: 0, concurrency: 0 });
  const bob = newApiKey("bob", { rate: 0, concurrency: 0 });
  const slow = newApiKey("slow", { rate: 0.01, burst: 1 });
  const single = newApiKey("single", { rate: 0, concurrency: 1 });
  const as = (k: { key: string }) => ({ authorization: `Bearer ${k.key}` });
  let s: Serve;

  beforeAll(async () => {
    s = await startServe({ shardBytes: 32 << 20, apiKeys: [alice.line, bob.line, slow.line, single.line].join("\n") });
  });
  afterAll(() => s?.stop());

  it("401 with WWW-Authenticate for a missing or wrong key; probes and docs stay open", async () => {
    const none = await fetch(`${s.url}/v1/models`);
    expect(none.status).toBe(401);
    expect(none.headers.get("www-authenticate")).toBe('Bearer realm="ctxbank"');
    expect(((await none.json()) as any).error).toMatchObject({ code: "unauthorized", type: "authentication_error" });
    const wrong = await fetch(`${s.url}/v1/models`, { headers: { authorization: "Bearer ctxb_alice_" + "A".repeat(43) } });
    expect(wrong.status).toBe(401);
    expect(wrong.headers.get("www-authenticate")).toMatch(/error="invalid_token"/);
    const chat = await postJson(`${s.url}/v1/chat/completions`, {
      model: "default",
      messages: [{ role: "user", content: "Hi" }],
      max_tokens: 2,
    });
    expect(chat.status).toBe(401);
    expect((await getJson(`${s.url}/health`)).status).toBe(200);
    expect((await getJson(`${s.url}/v1/models`, as(alice))).status).toBe(200);
  });

  it("429 rate_limited with Retry-After when a key's bucket is spent", async () => {
    expect((await fetch(`${s.url}/v1/models`, { headers: as(slow) })).status).toBe(200);
    const res = await fetch(`${s.url}/v1/models`, { headers: as(slow) });
    expect(res.status).toBe(429);
    expect(Number(res.headers.get("retry-after"))).toBeGreaterThanOrEqual(1);
    expect(((await res.json()) as any).error.code).toBe("rate_limited");
    expect((await fetch(`${s.url}/v1/models`, { headers: as(alice) })).status).toBe(200); // others are not affected
  });

  it("429 concurrency_limited while a key's stream is in flight, and a place again once it ends", async () => {
    const ac = new AbortController();
    const body = JSON.stringify({ model: "default", prompt: "Count: 1, 2, 3,", max_tokens: 200, stream: true });
    const stream = await fetch(`${s.url}/v1/completions`, {
      method: "POST",
      headers: { ...as(single), "content-type": "application/json" },
      body,
      signal: ac.signal,
    });
    expect(stream.status).toBe(200);
    await stream.body!.getReader().read(); // the stream is running
    const second = await fetch(`${s.url}/v1/models`, { headers: as(single) });
    expect(second.status).toBe(429);
    expect(second.headers.get("retry-after")).toBe("1");
    expect(((await second.json()) as any).error.code).toBe("concurrency_limited");
    ac.abort();
    const end = Date.now() + 5_000;
    let again = 429;
    while (again === 429 && Date.now() < end) {
      again = (await fetch(`${s.url}/v1/models`, { headers: as(single) })).status;
      if (again === 429) await new Promise((r) => setTimeout(r, 50));
    }
    expect(again).toBe(200);
  });

  it("a handle is decoded only with the key that made it; another key gets 404 unknown_handle", async () => {
    const handle = (await postJson(`${s.url}/v1/prefill`, { prompt: "Alice's private prompt", temperature: 0 }, as(alice))).body as Handle;
    expect(handle.request_id).toMatch(/^alice:req-/);
    const stolen = await postJson(`${s.url}/v1/decode`, { handle, max_tokens: 2 }, as(bob));
    expect(stolen.status).toBe(404);
    expect(stolen.body.error.code).toBe("unknown_handle");
    // The answer is the same as for a handle that never existed.
    const made = await postJson(`${s.url}/v1/decode`, { handle: { ...handle, request_id: "bob:never" }, max_tokens: 2 }, as(bob));
    expect(made.body.error.code).toBe("unknown_handle");
    expect((await postJson(`${s.url}/v1/decode`, { handle, max_tokens: 2, temperature: 0 }, as(alice))).status).toBe(200);
  });

  it("request ids are per key: another key's id neither collides nor lets it take the handle", async () => {
    const a = await postJson(`${s.url}/v1/prefill`, { prompt: "Same id", request_id: "order-1" }, as(alice));
    const b = await postJson(`${s.url}/v1/prefill`, { prompt: "Same id", request_id: "order-1" }, as(bob));
    expect([a.status, b.status]).toEqual([200, 200]);
    expect([a.body.request_id, b.body.request_id]).toEqual(["alice:order-1", "bob:order-1"]);
    expect((await postJson(`${s.url}/v1/prefill`, { prompt: "again", request_id: "order-1" }, as(alice))).body.error.code).toBe(
      "request_id_conflict",
    );
    const colon = await postJson(`${s.url}/v1/prefill`, { prompt: "x", request_id: "alice:order-1" }, as(bob));
    expect(colon.status).toBe(400);
    expect(colon.body.error.param).toBe("request_id");
    // Bob sending Alice's handle with his own request id cannot take her chunks either (see security-chunk-theft).
    const taken = await postJson(`${s.url}/v1/decode`, { handle: a.body, max_tokens: 1 }, as(bob));
    expect(taken.body.error.code).toBe("unknown_handle");
  });

  it("identical prefixes of different keys get different chunks; one key's repeat reuses its own", async () => {
    const prompt = "A prefix two tenants share word for word.";
    const a1 = (await postJson(`${s.url}/v1/prefill`, { prompt }, as(alice))).body as Handle;
    const a2 = (await postJson(`${s.url}/v1/prefill`, { prompt }, as(alice))).body as Handle;
    const b1 = (await postJson(`${s.url}/v1/prefill`, { prompt }, as(bob))).body as Handle;
    expect(a2.chunk_ids).toEqual(a1.chunk_ids);
    expect(b1.chunk_ids.some((id) => a1.chunk_ids.includes(id))).toBe(false);
    const [ka, kb] = await Promise.all([s.rt.registry.chunks.get(a1.chunk_ids[0]!), s.rt.registry.chunks.get(b1.chunk_ids[0]!)]);
    expect(ka!.key).not.toBe(kb!.key);
    // The keyless tenant keeps the unsalted key.
    const base = { fingerprint: s.rt.model.fingerprint, prefixTokens: [1, 2, 3], tokenStart: 0, layerIds: [0, 1] };
    expect(chunkKey(base)).not.toBe(chunkKey({ ...base, salt: "alice" }));
    expect(chunkKey({ ...base, salt: "alice" })).not.toBe(chunkKey({ ...base, salt: "bob" }));
    // Reuse shows nowhere public: not in the handle, and status is internal only.
    expect(JSON.stringify(a2)).not.toMatch(/reuse/);
    const status = await getJson(`${s.internalUrl}/v1/prefill/status`, { authorization: `Bearer ${s.security.internalSecret}` });
    expect(status.status).toBe(200);
    expect(status.body.totals.chunks_reused).toBeGreaterThan(0);
  });

  it("the internal listener: prefill calls need a capability, status the shared secret", async () => {
    const plain = await postJson(`${s.internalUrl}/v1/prefill`, { prompt: "hi" }, as(alice));
    expect(plain.status).toBe(401);
    const cap = s.security.internal.sign({ route: "prefill", tenant: "alice", exp: Date.now() + 10_000, nonce: InternalAuth.nonce() });
    const ok = await postJson(`${s.internalUrl}/v1/prefill`, { prompt: "hi" }, { authorization: `Bearer ${cap}` });
    expect(ok.status).toBe(200);
    expect(ok.body.request_id).toMatch(/^alice:/);
    // The same capability again (a replay): refused.
    const replay = await postJson(`${s.internalUrl}/v1/prefill`, { prompt: "hi" }, { authorization: `Bearer ${cap}` });
    expect(replay.status).toBe(401);
    expect(replay.body.error.message).toMatch(/used already/);
    expect((await getJson(`${s.internalUrl}/v1/decode/status`, as(alice))).status).toBe(401);
    expect((await getJson(`${s.internalUrl}/v1/decode/status`, { authorization: `Bearer ${s.security.internalSecret}` })).status).toBe(200);
  });

  it("421 for a Host this server does not answer for (DNS rebinding); probes answer any Host", async () => {
    const withHost = (url: string, host: string) =>
      new Promise<number>((resolve, reject) => {
        const req = http.get(url, { headers: { host, ...as(alice) } }, (res) => {
          res.resume();
          resolve(res.statusCode!);
        });
        req.on("error", reject);
      });
    expect(await withHost(`${s.url}/v1/models`, "evil.example")).toBe(421);
    expect(await withHost(`${s.url}/docs`, "evil.example:8080")).toBe(421);
    expect(await withHost(`${s.internalUrl}/v1/decode/status`, "evil.example")).toBe(421);
    expect(await withHost(`${s.url}/health`, "10.1.2.3:8080")).toBe(200);
    expect(await withHost(`${s.url}/v1/models`, "localhost")).toBe(200);
  });

  it("/docs loads Swagger UI from this server (pinned swagger-ui-dist), nothing from a CDN", async () => {
    const page = await fetch(`${s.url}/docs`);
    expect(page.status).toBe(200);
    const html = await page.text();
    expect(html).not.toMatch(/https?:\/\//);
    expect(page.headers.get("content-security-policy")).toMatch(/default-src 'self'/);
    for (const src of [...html.matchAll(/(?:src|href)="([^"]+)"/g)].map((m) => m[1]!)) {
      expect(src).toMatch(/^\/docs\/assets\//);
      expect((await fetch(`${s.url}${src}`)).status, src).toBe(200);
    }
    expect((await fetch(`${s.url}/docs/assets/..%2fpackage.json`)).status).toBe(404);
  });
});
