// The services' HTTP API in one process (`serve` wiring), on PGlite and on a real PostgreSQL 15:
// the prefill → handle → decode flow, and every edge answered with a machine-readable 4xx/5xx.
import { randomUUID } from "node:crypto";
import { afterAll, beforeAll, describe, expect, it, onTestFinished } from "vitest";
import { generate } from "../../shared/inference/generate.ts";
import type { Handle } from "../../shared/platform/http/wire.ts";
import { startPostgres } from "../../tools/lib/postgres.ts";
import { getJson } from "../../tools/lib/services.ts";
import { type Serve, startDecodeBeside, startServe } from "../harness/serve.ts";
import { parseSse, postJson } from "../harness/http.ts";

const backends = [
  { name: "PGlite", start: async () => ({ url: "pglite://memory", stop: async () => {} }) },
  { name: "PostgreSQL 15", start: startPostgres },
];

describe.each(backends)("services API on $name", (backend) => {
  let db: { url: string; stop(): Promise<void> };
  let s: Serve;
  let url: string;

  beforeAll(async () => {
    db = await backend.start();
    s = await startServe({
      databaseUrl: db.url,
      shardBytes: 8 << 20, // 8 MiB: ~360 tokens of KV
      maxBodyBytes: 64 << 10,
      maxBatch: 1,
      maxQueue: 0,
      maxPrefills: 1,
      maxPrefillQueue: 0,
      kvBudgetBytes: 600 * 23040,
    });
    url = s.url;
  });

  afterAll(async () => {
    await s?.stop();
    await db?.stop();
  });

  const prefill = (body: object) => postJson(`${url}/v1/prefill`, body);
  const decode = (body: object) => postJson(`${url}/v1/decode`, body);
  async function reference(ids: number[], maxTokens: number): Promise<number[]> {
    const out: number[] = [];
    for await (const ev of generate(s.rt.engine, s.rt.tokenizer, ids, { maxTokens, temperature: 0 }))
      if (ev.type === "token") out.push(ev.id);
    return out;
  }

  it("is healthy and ready", async () => {
    expect(await getJson(`${url}/health`)).toEqual({ status: 200, body: { status: "ok" } });
    expect((await getJson(`${url}/ready`)).status).toBe(200);
  });

  it("prefill answers a handle; decode gives the tokens one process would; the handle is then spent", async () => {
    const res = await prefill({ prompt: "The quick brown fox", request_id: `api-${randomUUID()}`, session_id: "sess-1", round_id: 3 });
    expect(res.status).toBe(200);
    const handle = res.body as Handle;
    expect(handle).toMatchObject({
      shard_epoch: 1,
      model_fingerprint: s.rt.model.fingerprint,
      layer_groups: [Array.from({ length: 30 }, (_, i) => i)],
    });
    expect(handle.chunk_ids).toHaveLength(1);
    const rows = await s.rt.registry.chunks.ofRequest(handle.request_id);
    expect(rows.map((r) => [r.state, r.sessionId, r.roundId, r.tokenStart, r.tokenEnd])).toEqual([
      ["ready", "sess-1", 3, 0, handle.prompt_tokens],
    ]);

    const out = await decode({ handle, max_tokens: 10, temperature: 0 });
    expect(out.status).toBe(200);
    const expected = await reference(handle.prompt_token_ids, 10);
    expect(out.body.token_ids).toEqual(expected);
    expect(handle.first_token).toBe(expected[0]);
    expect(out.body.text).toBe(s.rt.tokenizer.decode(expected));
    expect(out.body.kv).toMatchObject({ transport: "shm", chunks: 1, recomputed: false });
    expect(out.body.kv.bytes).toBeGreaterThan(handle.prompt_tokens * 23040);
    expect(await s.rt.registry.requests.get(handle.request_id)).toMatchObject({ state: "done", outputTokens: 10 });
    // The KV was copied out, so the chunk was released for the owner to reclaim.
    expect(await s.rt.registry.chunks.ofRequest(handle.request_id)).toEqual([]);

    const again = await decode({ handle, max_tokens: 4 });
    expect(again.status).toBe(409);
    expect(again.body.error).toMatchObject({ code: "handle_released", type: "conflict_error" });
  });

  it("streams /v1/decode as SSE: token events, then done", async () => {
    const { body: handle } = await prefill({ messages: [{ role: "user", content: "Say hi." }] });
    const res = await fetch(`${url}/v1/decode`, {
      method: "POST",
      headers: { "content-type": "application/json" },
      body: JSON.stringify({ handle, max_tokens: 6, temperature: 0, stream: true }),
    });
    expect(res.headers.get("content-type")).toMatch(/text\/event-stream/);
    const events = parseSse(await res.text());
    const tokens = events.filter((e) => e.event === "token").map((e) => JSON.parse(e.data));
    const done = JSON.parse(events.at(-1)!.data);
    expect(events.at(-1)!.event).toBe("done");
    expect(tokens.map((t) => t.id)).toEqual(done.token_ids);
    expect(tokens[0].id).toBe(handle.first_token);
    expect(done.token_ids).toEqual(await reference(handle.prompt_token_ids, 6));
  });

  it("rejects malformed bodies with 400 and the offending field", async () => {
    const noHandle = await decode({ max_tokens: 3 });
    expect(noHandle.status).toBe(400);
    expect(noHandle.body.error).toMatchObject({ code: "invalid_request", param: "handle" });
    const both = await prefill({ prompt: "a", prompt_token_ids: [1, 2] });
    expect(both.status).toBe(400);
    expect(both.body.error.message).toMatch(/exactly one of prompt, messages or prompt_token_ids/);
    const badToken = await prefill({ prompt_token_ids: [1, 10_000_000] });
    expect(badToken.body.error).toMatchObject({ code: "invalid_request", param: "prompt_token_ids" });
    const notJson = await fetch(`${url}/v1/prefill`, { method: "POST", headers: { "content-type": "application/json" }, body: "{nope" });
    expect(notJson.status).toBe(400);
    expect(((await notJson.json()) as { error: { code: string } }).error.code).toBe("invalid_request");
    const badTemp = await postJson(`${url}/v1/completions`, { model: "default", prompt: "x", temperature: -1 });
    expect(badTemp.body.error).toMatchObject({ code: "invalid_request", param: "temperature" });
    expect((await getJson(`${url}/v1/nothing-here`)).body.error.code).toBe("not_found");
  });

  it("404 for an unknown handle, 400 for a handle from another model", async () => {
    const { body: handle } = await prefill({ prompt: "Hello" });
    const unknown = await decode({ handle: { ...handle, request_id: `nope-${randomUUID()}` } });
    expect(unknown.status).toBe(404);
    expect(unknown.body.error.code).toBe("unknown_handle");
    const other = await decode({ handle: { ...handle, model_fingerprint: "0".repeat(64) } });
    expect(other.status).toBe(400);
    expect(other.body.error.code).toBe("model_mismatch");
  });

  it("413 for a body over the limit, 400 for a prompt over the context", async () => {
    const big = await prefill({ prompt: "x".repeat(100 << 10) });
    expect(big.status).toBe(413);
    expect(big.body.error.code).toBe("payload_too_large");
    const long = await prefill({ prompt_token_ids: Array.from({ length: 8192 }, () => 100) });
    expect(long.status).toBe(400);
    expect(long.body.error.code).toBe("context_length_exceeded");
    // The connection the 413 closed is not reused for the next request.
    expect((await getJson(`${url}/health`)).status).toBe(200);
  });

  it("429 when the shard, the KV budget, the decode places or the prefill places are used up", async () => {
    const shardFull = await prefill({ prompt_token_ids: Array.from({ length: 400 }, (_, i) => 100 + i) });
    expect(shardFull.status).toBe(429);
    expect(shardFull.body.error.code).toBe("shard_full");

    const { body: handle } = await prefill({ prompt: "Count to ten:" });
    const budget = await decode({ handle, max_tokens: 1000 });
    expect(budget.status).toBe(429);
    expect(budget.body.error).toMatchObject({ code: "kv_memory_full", type: "rate_limit_error" });

    // The handle was not spent by the refusal: a smaller request takes it, and while it streams
    // the only decode place is taken.
    const { body: other } = await prefill({ prompt: "Count to five:" });
    const ac = new AbortController();
    const streaming = await fetch(`${url}/v1/decode`, {
      method: "POST",
      headers: { "content-type": "application/json" },
      body: JSON.stringify({ handle, max_tokens: 200, stream: true }),
      signal: ac.signal,
    });
    expect(streaming.status).toBe(200);
    const full = await decode({ handle: other, max_tokens: 4 });
    expect(full.status).toBe(429);
    expect(full.body.error.code).toBe("queue_full");
    ac.abort();
    await streaming.body?.cancel().catch(() => {});

    const long = Array.from({ length: 300 }, (_, i) => 200 + i);
    const [a, b] = await Promise.all([
      prefill({ prompt_token_ids: long }),
      new Promise((r) => setTimeout(r, 50)).then(() => prefill({ prompt: "hi" })),
    ]);
    expect(a.status).toBe(200);
    expect(b.status).toBe(429);
    expect(b.body.error.code).toBe("queue_full");
  });

  it("503 when no prefill instance is alive (a decode without a prefill in its process)", async () => {
    const id = s.services.prefill!.instanceId;
    const d = await startDecodeBeside(s);
    onTestFinished(() => d.stop());
    await s.rt.registry.instances.markDraining(id);
    try {
      const res = await postJson(`${d.url}/v1/completions`, { model: "default", prompt: "hi", max_tokens: 2 });
      expect(res.status).toBe(503);
      expect(res.body.error).toMatchObject({ code: "no_prefill_instance", type: "service_unavailable" });
    } finally {
      await s.rt.registry.instances.register({ id, role: "prefill", baseUrl: s.internalUrl, hostId: s.rt.config.hostId });
    }
    expect((await postJson(`${d.url}/v1/completions`, { model: "default", prompt: "hi", max_tokens: 2 })).status).toBe(200);
  });
});
