// The prompt-theft attack through the chunk route, as an attacker would run it: another client
// of the same server (its own valid API key) learns a victim's shard, epoch and chunk ranges (the
// old public /v1/prefill/status named them) and asks for the bytes — the whole chunk, a sub-range
// of a live allocation, and while the victim's prompt is still being prefilled. Every attempt is
// refused; only the decode that leased exactly that chunk for the victim's request can read it.
// On the old code the public GET /v1/chunks/... answered the bytes to anyone.
import { sql } from "drizzle-orm";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { newApiKey } from "../../shared/platform/auth/api-keys.ts";
import { InternalAuth } from "../../shared/platform/auth/capability.ts";
import type { Handle } from "../../shared/platform/http/wire.ts";
import type { ChunkRow } from "../../shared/platform/registry/schema.ts";
import { chunkRequestPath } from "../../services/handoff/transport/types.ts";
import { until } from "../../tools/lib/services.ts";
import { postJson } from "../harness/http.ts";
import { type Serve, startServe } from "../harness/serve.ts";

const victim = newApiKey("victim", { rate: 0 });
const mallory = newApiKey("mallory", { rate: 0 });
const as = (key: { key: string }) => ({ authorization: `Bearer ${key.key}` });

let s: Serve;

beforeAll(async () => {
  s = await startServe({
    blockTokens: 64,
    apiKeys: `${victim.line}\n${mallory.line}`,
    transport: "http", // the decode reads over the chunk route too, so the legitimate path is exercised
    prefillChunking: "off",
  });
});

afterAll(() => s?.stop());

const secretCap = () => s.security.internal;
const chunkUrl = (base: string, c: Pick<ChunkRow, "shardId" | "shardEpoch" | "offset" | "length">, offset = c.offset, length = c.length) =>
  base + chunkRequestPath({ shardId: c.shardId, epoch: c.shardEpoch, offset, length });
/** A capability as a peer holding the secret would sign it (the strongest attacker: a buggy or compromised peer). */
function signed(
  auth: InternalAuth,
  c: ChunkRow,
  over: Partial<{ request: string; tenant: string; offset: number; length: number }> = {},
): string {
  return auth.sign({
    route: "chunk",
    tenant: over.tenant ?? "victim",
    request: over.request ?? c.requestId,
    chunk: c.id,
    shard: c.shardId,
    epoch: c.shardEpoch,
    offset: over.offset ?? c.offset,
    length: over.length ?? c.length,
    exp: Date.now() + 60_000,
  });
}
const get = (url: string, token?: string) => fetch(url, token === undefined ? {} : { headers: { authorization: `Bearer ${token}` } });

describe("stealing another client's prompt through the chunk route", () => {
  let handle: Handle;
  let chunk: ChunkRow;

  beforeAll(async () => {
    const res = await postJson(
      `${s.url}/v1/prefill`,
      { prompt: "My secret diagnosis is: nothing to see here, attacker.", temperature: 0 },
      as(victim),
    );
    expect(res.status).toBe(200);
    handle = res.body as Handle;
    chunk = (await s.rt.registry.chunks.ofRequest(handle.request_id))[0]!;
  });

  it("status no longer names shards, epochs or reuse counters on the public listener", async () => {
    for (const path of ["/v1/prefill/status", "/v1/decode/status"]) {
      const res = await fetch(`${s.url}${path}`, { headers: as(mallory) });
      expect(res.status).toBe(404);
      expect(await res.text()).not.toMatch(/shard|chunks_reused/);
    }
    const internal = await fetch(`${s.internalUrl}/v1/prefill/status`, { headers: as(mallory) });
    expect(internal.status).toBe(401);
  });

  it("the public listener has no chunk route at all", async () => {
    const res = await get(chunkUrl(s.url, chunk), undefined);
    expect(res.status).toBe(401); // /v1/* needs a key first
    const withKey = await fetch(chunkUrl(s.url, chunk), { headers: as(mallory) });
    expect(withKey.status).toBe(404);
    expect(((await withKey.json()) as any).error.code).toBe("not_found");
  });

  it("the internal listener wants a capability: none, a client's API key or one signed with another secret are refused", async () => {
    expect((await get(chunkUrl(s.internalUrl, chunk))).status).toBe(401);
    expect((await get(chunkUrl(s.internalUrl, chunk), mallory.key)).status).toBe(401);
    const forged = signed(new InternalAuth("an-attacker-guessed-this-secret-0000000000"), chunk);
    const res = await get(chunkUrl(s.internalUrl, chunk), forged);
    expect(res.status).toBe(401);
    expect(((await res.json()) as any).error.code).toBe("unauthorized");
  });

  it("even a correctly signed capability reads nothing without a live read lease of that request on exactly that range", async () => {
    // The chunk is ready (nobody is reading it): refused.
    expect(chunk.state).toBe("ready");
    expect((await get(chunkUrl(s.internalUrl, chunk), signed(secretCap(), chunk))).status).toBe(403);
    // Lease it as the victim's decode would.
    await s.rt.registry.chunks.acquireRead([chunk.id], 60_000);
    try {
      // A sub-range of the live allocation, signed for exactly that sub-range: refused.
      const sub = { offset: chunk.offset + 4096, length: 4096 };
      expect((await get(chunkUrl(s.internalUrl, chunk, sub.offset, sub.length), signed(secretCap(), chunk, sub))).status).toBe(403);
      // A capability for the whole chunk used on a sub-range: refused.
      expect((await get(chunkUrl(s.internalUrl, chunk, chunk.offset, 4096), signed(secretCap(), chunk))).status).toBe(403);
      // The attacker's own request (its tenant) does not hold the chunk: refused.
      expect(
        (await get(chunkUrl(s.internalUrl, chunk), signed(secretCap(), chunk, { request: "mallory:req-x", tenant: "mallory" }))).status,
      ).toBe(403);
      // The victim's request id under the attacker's tenant: refused.
      expect((await get(chunkUrl(s.internalUrl, chunk), signed(secretCap(), chunk, { tenant: "mallory" }))).status).toBe(403);
      // The holder's exact capability: the bytes (the legitimate read).
      const ok = await get(chunkUrl(s.internalUrl, chunk), signed(secretCap(), chunk));
      expect(ok.status).toBe(200);
      expect((await ok.arrayBuffer()).byteLength).toBe(chunk.length);
      // An expired capability: refused.
      const expired = secretCap().sign({
        route: "chunk",
        tenant: "victim",
        request: chunk.requestId,
        chunk: chunk.id,
        shard: chunk.shardId,
        epoch: chunk.shardEpoch,
        offset: chunk.offset,
        length: chunk.length,
        exp: Date.now() - 1,
      });
      expect((await get(chunkUrl(s.internalUrl, chunk), expired)).status).toBe(401);
    } finally {
      await s.rt.registry.chunks.releaseRead([chunk.id]);
    }
  });

  it("a forged handle naming the victim's chunks under the attacker's own request reads nothing", async () => {
    const own = (await postJson(`${s.url}/v1/prefill`, { prompt: "Hello", temperature: 0 }, as(mallory))).body as Handle;
    const forged = { ...handle, request_id: own.request_id };
    const res = await postJson(`${s.url}/v1/decode`, { handle: forged, max_tokens: 4, temperature: 0 }, as(mallory));
    expect(res.status).toBe(400);
    expect(res.body.error).toMatchObject({ code: "invalid_request", param: "handle.chunk_ids" });
  });

  it("nothing can be read while the victim's prompt is still being prefilled", async () => {
    const ids = Array.from({ length: 1100 }, (_, i) => 200 + ((i * 7919) % 20000));
    const pending = postJson(`${s.url}/v1/prefill`, { prompt_token_ids: ids, request_id: "long-secret" }, as(victim));
    let writing: ChunkRow | undefined;
    await until(
      "a chunk of the long prompt is in the registry",
      async () => {
        const rows = (await s.rt.db.db.execute(sql`select id from chunks where request_id = 'victim:long-secret'`)) as unknown as {
          rows: { id: string }[];
        };
        if (rows.rows.length === 0) return false;
        writing = await s.rt.registry.chunks.get(rows.rows[0]!.id);
        return writing !== undefined;
      },
      60_000,
    );
    const res = await get(chunkUrl(s.internalUrl, writing!), signed(secretCap(), writing!));
    expect(res.status).toBe(403);
    const done = await pending;
    expect(done.status).toBe(200);
    // Once prefilled, still nothing without the lease.
    const [first] = await s.rt.registry.chunks.ofRequest("victim:long-secret");
    expect((await get(chunkUrl(s.internalUrl, first!), signed(secretCap(), first!))).status).toBe(403);
  });

  it("the victim's own decode reads its chunks over the same route", async () => {
    const res = await postJson(`${s.url}/v1/decode`, { handle, max_tokens: 4, temperature: 0 }, as(victim));
    expect(res.status).toBe(200);
    expect(res.body.kv).toMatchObject({ transport: "http", recomputed: false });
  });
});
