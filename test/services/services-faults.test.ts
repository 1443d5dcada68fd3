// Faults, on PGlite and on PostgreSQL 15: a corrupted chunk byte is detected before the engine
// uses it (every transport: http, shm, and UCX where its addon is built); expired leases (unread handles, crashed readers) are reclaimed and
// the shard space reused; a cancelled stream or prefill frees its KV at once, visibly in the
// registry and in the services' memory accounting.
import { randomUUID } from "node:crypto";
import { open } from "node:fs/promises";
import { sql } from "drizzle-orm";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { generate } from "../../shared/inference/generate.ts";
import type { Handle } from "../../shared/platform/http/wire.ts";
import { chunkHeaderSize } from "../../services/handoff/format/chunk.ts";
import { startPostgres } from "../../tools/lib/postgres.ts";
import { until } from "../../tools/lib/services.ts";
import { ucxAvailable } from "../../services/handoff/transport/ucx.ts";
import { postJson } from "../harness/http.ts";
import { type Serve, startServe } from "../harness/serve.ts";

// UCX runs where the addon was built with it (CI installs libucx-dev); elsewhere its cases skip, saying so.
const TRANSPORTS = ucxAvailable() ? (["http", "shm", "ucx"] as const) : (["http", "shm"] as const);
if (!ucxAvailable()) console.warn("[services-faults] UCX cases skipped: the UCX transport addon is not built");

const backends = [
  { name: "PGlite", start: async () => ({ url: "pglite://memory", stop: async () => {} }) },
  { name: "PostgreSQL 15", start: startPostgres },
];

describe.each(backends)("faults on $name", (backend) => {
  let db: { url: string; stop(): Promise<void> };
  let s: Serve;

  beforeAll(async () => {
    db = await backend.start();
    s = await startServe({ databaseUrl: db.url, blockTokens: 32, reapMs: 50 });
  });
  afterAll(async () => {
    await s?.stop();
    await db?.stop();
  });

  const prefill = async (body: object) => {
    const res = await postJson(`${s.url}/v1/prefill`, body);
    expect(res.status, JSON.stringify(res.body)).toBe(200);
    return res.body as Handle;
  };
  const decodeStatus = () => s.services.decode!.status();
  const prefillStatus = () => s.services.prefill!.status();
  const idle = () => {
    const d = decodeStatus();
    return d.admitted === 0 && d.live_sequences === 0 && d.kv_reserved_bytes === 0 && d.running === 0;
  };
  async function reference(ids: number[], n: number) {
    const out: number[] = [];
    for await (const ev of generate(s.rt.engine, s.rt.tokenizer, ids, { maxTokens: n, temperature: 0 }))
      if (ev.type === "token") out.push(ev.id);
    return out;
  }
  async function flipByte(handle: Handle, chunkIndex: number, at: number) {
    const row = (await s.rt.registry.chunks.get(handle.chunk_ids[chunkIndex]!))!;
    const shard = (await s.rt.registry.shards.get(row.shardId, row.shardEpoch))!;
    const fh = await open(shard.path, "r+");
    try {
      const b = Buffer.alloc(1);
      await fh.read(b, 0, 1, row.offset + at);
      b[0]! ^= 0x10;
      await fh.write(b, 0, 1, row.offset + at);
    } finally {
      await fh.close();
    }
  }

  it.each(TRANSPORTS)("a corrupted chunk byte is detected over %s: 502, or a recompute when asked", async (transport) => {
    s.rt.config.transport = transport;
    try {
      const prompt =
        "A corrupted byte must never reach the engine, whatever the transport is that carried it: checksums are verified on arrival, before the import, for every chunk. ".repeat(
          2,
        );
      const intact = await postJson(`${s.url}/v1/decode`, {
        handle: await prefill({ prompt: `${transport} carries this prompt intact.` }),
        max_tokens: 2,
        temperature: 0,
      });
      expect(intact.body.kv).toMatchObject({ transport, recomputed: false }); // the bytes did come over it
      const [a, b] = [await prefill({ prompt }), await prefill({ prompt: `${prompt} Again.` })];
      expect(a.chunk_ids.length).toBeGreaterThan(1);
      const payloadByte = chunkHeaderSize(30) + 1234;
      await flipByte(a, 1, payloadByte);
      await flipByte(b, 0, payloadByte);

      const failed = await postJson(`${s.url}/v1/decode`, { handle: a, max_tokens: 4, temperature: 0 });
      expect(failed.status).toBe(502);
      expect(failed.body.error.code).toBe("kv_load_failed");
      expect(failed.body.error.message).toMatch(/failed verification: checksum_mismatch/);
      expect(await s.rt.registry.requests.get(a.request_id)).toMatchObject({ state: "failed" });

      const recomputed = await postJson(`${s.url}/v1/decode`, { handle: b, max_tokens: 6, temperature: 0, on_kv_failure: "recompute" });
      expect(recomputed.status).toBe(200);
      expect(recomputed.body.kv).toMatchObject({ transport: "recompute", recomputed: true });
      expect(recomputed.body.kv.error).toMatch(/checksum_mismatch/);
      expect(recomputed.body.token_ids).toEqual(await reference(b.prompt_token_ids, 6));
      // Nothing is left held: no read lease, no chunk of either request, no sequence.
      expect(await s.rt.registry.chunks.ofRequest(a.request_id)).toEqual([]);
      expect(await s.rt.registry.chunks.ofRequest(b.request_id)).toEqual([]);
      expect(idle()).toBe(true);
    } finally {
      s.rt.config.transport = "auto";
    }
  });

  it.skipIf(!ucxAvailable())(
    "auto: shm on the owner's host, UCX for an owner elsewhere that publishes an endpoint, else HTTP",
    async () => {
      const decodeOver = async (prompt: string) =>
        (await postJson(`${s.url}/v1/decode`, { handle: await prefill({ prompt }), max_tokens: 2, temperature: 0 })).body.kv;
      expect(s.rt.config.transport).toBe("auto");
      expect(await decodeOver("Read on the owner's own host.")).toMatchObject({ transport: "shm" });
      const hostId = s.rt.config.hostId;
      s.rt.config.hostId = "another-host"; // the decode now sees the prefill as remote
      const shardId = prefillStatus().shard!.id;
      const [row] = (
        (await s.rt.db.db.execute(sql`select ucx_endpoint from shards where id = ${shardId} and state = 'active'`)) as unknown as {
          rows: { ucx_endpoint: string }[];
        }
      ).rows;
      try {
        expect(await decodeOver("Read from a remote owner that publishes UCX.")).toMatchObject({ transport: "ucx" });
        await s.rt.db.db.execute(sql`update shards set ucx_endpoint = null where id = ${shardId} and state = 'active'`);
        expect(await decodeOver("Read from a remote owner without UCX.")).toMatchObject({ transport: "http" });
      } finally {
        s.rt.config.hostId = hostId;
        await s.rt.db.db.execute(sql`update shards set ucx_endpoint = ${row!.ucx_endpoint} where id = ${shardId} and state = 'active'`);
      }
    },
  );

  it.each(TRANSPORTS)(
    "an expired lease is reclaimed by the owner's reaper and its shard space reused (decode over %s)",
    async (transport) => {
      s.rt.config.transport = transport;
      try {
        await expiredLease();
      } finally {
        s.rt.config.transport = "auto";
      }
    },
  );

  async function expiredLease() {
    await until("the shard is empty", () => prefillStatus().shard!.bytes_used === 0);
    const before = prefillStatus().totals.ranges_reclaimed;
    const unread = await prefill({ prompt: "Nobody will ever decode this handle." });
    const [row] = await s.rt.registry.chunks.ofRequest(unread.request_id);
    expect(prefillStatus().shard!.bytes_used).toBeGreaterThan(0);

    // Time passes beyond the retention: the lease runs out.
    await s.rt.db.db.execute(sql`update chunks set lease_expires_at = now() - interval '1 second' where id = ${row!.id}`);
    await until("the reaper reclaimed the range", () => prefillStatus().shard!.bytes_used === 0);
    expect(prefillStatus().totals.ranges_reclaimed).toBe(before + unread.chunk_ids.length);
    expect(await s.rt.registry.chunks.get(row!.id)).toBeUndefined();

    const late = await postJson(`${s.url}/v1/decode`, { handle: unread, max_tokens: 4 });
    expect(late.status).toBe(409);
    expect(late.body.error.code).toBe("handle_expired");

    // The space is reused: the next chunk lands where the reclaimed one was.
    const next = await prefill({ prompt: "A new prompt takes the space." });
    const [reused] = await s.rt.registry.chunks.ofRequest(next.request_id);
    expect(reused!.offset).toBe(row!.offset);

    // A reader that crashed while holding a read lease: the lease expires and the chunk is reclaimed too.
    await s.rt.registry.chunks.acquireRead(next.chunk_ids, 60_000);
    await s.rt.registry.chunks.releaseRequest(next.request_id);
    expect((await s.rt.registry.chunks.get(reused!.id))!.state).toBe("reading");
    await s.rt.db.db.execute(sql`update chunks set lease_expires_at = now() - interval '1 second' where id = ${reused!.id}`);
    await until("the crashed reader's chunk is reclaimed", () => prefillStatus().shard!.bytes_used === 0);
  }

  it.each(["/v1/decode", "/v1/completions"] as const)("a cancelled %s stream frees its KV and its chunks at once", async (route) => {
    await until("idle, with an empty shard", () => idle() && prefillStatus().shard!.bytes_used === 0);
    const prompt = "Once upon a time, in a land far away, there lived";
    const body =
      route === "/v1/decode"
        ? { handle: await prefill({ prompt }), max_tokens: 500, temperature: 0, stream: true }
        : { model: "default", prompt, max_tokens: 500, temperature: 0, stream: true };
    const cancelled = async () =>
      (
        (await s.rt.db.db.execute(
          sql`select id, output_tokens from requests where state = 'cancelled' order by arrival_at desc`,
        )) as unknown as {
          rows: { id: string; output_tokens: number }[];
        }
      ).rows;
    const before = (await cancelled()).length;
    const ac = new AbortController();
    const res = await fetch(`${s.url}${route}`, {
      method: "POST",
      headers: { "content-type": "application/json" },
      body: JSON.stringify(body),
      signal: ac.signal,
    });
    expect(res.status).toBe(200);
    const reader = res.body!.getReader();
    let text = "";
    while ((text.match(/\n\n/g) ?? []).length < 4) text += new TextDecoder().decode((await reader.read()).value);
    // Streaming: one sequence holds KV for prompt + 500 tokens.
    expect(decodeStatus()).toMatchObject({ live_sequences: 1, admitted: 1 });
    expect(decodeStatus().kv_reserved_bytes).toBeGreaterThan(500 * 23040);
    ac.abort();
    await until("the sequence and its reservation are freed", idle, 2_000);
    await until("the request is recorded as cancelled", async () => (await cancelled()).length > before);
    const row = (await cancelled())[0]!;
    if ("handle" in body) expect(row.id).toBe(body.handle!.request_id);
    expect(row.output_tokens).toBeGreaterThan(0);
    expect(row.output_tokens).toBeLessThan(500);
    expect(await s.rt.registry.chunks.ofRequest(row.id)).toEqual([]);
    await until("the shard space is reclaimed", () => prefillStatus().shard!.bytes_used === 0);
  });

  it("a client that goes away during prefill frees the prefill's KV and shard space", async () => {
    await until("the shard is empty", () => prefillStatus().shard!.bytes_used === 0 && prefillStatus().prefills_running === 0);
    const requestId = `gone-${randomUUID()}`;
    const ac = new AbortController();
    const ids = Array.from({ length: 700 }, (_, i) => 100 + ((i * 7919) % 30000));
    const pending = fetch(`${s.url}/v1/prefill`, {
      method: "POST",
      headers: { "content-type": "application/json" },
      body: JSON.stringify({ prompt_token_ids: ids, request_id: requestId }),
      signal: ac.signal,
    }).catch((e: unknown) => e);
    await until("the prefill is computing", () => prefillStatus().prefills_running === 1 && prefillStatus().kv_bytes_in_flight > 0);
    ac.abort();
    await pending;
    await until(
      "the prefill stopped and released everything",
      () => prefillStatus().prefills_running === 0 && prefillStatus().kv_bytes_in_flight === 0,
      30_000,
    );
    await until("its request is cancelled", async () => (await s.rt.registry.requests.get(requestId))?.state === "cancelled");
    await until("its shard space is free", () => prefillStatus().shard!.bytes_used === 0);
    expect(await s.rt.registry.chunks.ofRequest(requestId)).toEqual([]);
  });
});
