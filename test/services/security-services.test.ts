// Issue 10's smaller findings through the running services (serve on PostgreSQL 15): 100,000
// chunk ids are a 400 and nothing logs SQL parameters; /v1/chunks errors use the shared error
// shape; a stream whose request fails after tokens were sent ends with an error event and
// `[DONE]`; /ready is 503 and requests are 503 (not 500) while the database is down. Plus, without
// services: DATABASE_URL passwords are redacted in both forms, and the model fingerprint covers
// the weights.
import { randomUUID } from "node:crypto";
import { copyFile, mkdtemp, readFile, rm, writeFile } from "node:fs/promises";
import os from "node:os";
import path from "node:path";
import { DrizzleQueryError } from "drizzle-orm/errors";
import { afterAll, beforeAll, describe, expect, it, onTestFinished } from "vitest";
import { chunkRoutes } from "../../services/prefill/routes.ts";
import type { RunningServices } from "../../services/process.ts";
import { KvLoadError } from "../../services/handoff/index.ts";
import { loadModel } from "../../shared/inference/engine/engine.ts";
import type { Handle } from "../../shared/platform/http/wire.ts";
import { openDatabase } from "../../shared/platform/registry/db.ts";
import { isDatabaseUnavailable } from "../../shared/platform/registry/db-probe.ts";
import { redactDatabaseUrl } from "../../shared/platform/registry/redact-url.ts";
import { tinyLlama } from "../harness/gguf-writer.ts";
import { startPostgres, type TestPostgres } from "../../tools/lib/postgres.ts";
import { until } from "../../tools/lib/services.ts";
import { postJson } from "../harness/http.ts";
import { logTo, type Serve, startDecodeBeside, startServe } from "../harness/serve.ts";

describe("services under hostile input and a database outage", () => {
  let pg: TestPostgres;
  let s: Serve;
  const logLines: string[] = [];

  beforeAll(async () => {
    pg = await startPostgres();
    s = await startServe(
      { databaseUrl: pg.url, blockTokens: 32, logLevel: "info", drainMs: 2_000 },
      { log: logTo((line) => void logLines.push(line)) },
    );
  });
  afterAll(async () => {
    await s?.stop().catch(() => {});
    await pg?.stop();
  });

  const longestLogLine = () => Math.max(...logLines.map((l) => l.length));

  async function handle(): Promise<Handle> {
    const res = await postJson(`${s.url}/v1/prefill`, { prompt: "The quick brown fox jumps over the lazy dog. ".repeat(3) });
    expect(res.status, JSON.stringify(res.body)).toBe(200);
    return res.body as Handle;
  }

  /** The SSE `data:` payloads of a streamed chat completion (by default from the serve). */
  async function chatStream(url = s.url): Promise<string[]> {
    const res = await fetch(`${url}/v1/chat/completions`, {
      method: "POST",
      headers: { "content-type": "application/json" },
      body: JSON.stringify({
        model: "default",
        messages: [{ role: "user", content: "Say hi." }],
        max_tokens: 8,
        temperature: 0,
        stream: true,
      }),
    });
    expect(res.status).toBe(200);
    const text = await res.text();
    return text
      .split("\n")
      .filter((l) => l.startsWith("data: "))
      .map((l) => l.slice(6));
  }

  it("100,000 chunk ids are a 400 naming the bound, and no log line carries them", async () => {
    const h = await handle();
    const ids = Array.from({ length: 100_000 }, () => randomUUID());
    const res = await postJson(`${s.url}/v1/decode`, { handle: { ...h, chunk_ids: ids }, max_tokens: 2 });
    expect(res.status).toBe(400);
    expect(res.body).toMatchObject({ error: { code: "invalid_request", param: "handle.chunk_ids" } });
    expect(JSON.stringify(res.body)).toMatch(/16384/);
    expect(longestLogLine()).toBeLessThan(20_000);
    expect(logLines.some((l) => l.includes(ids[500]!))).toBe(false);
  });

  it("/v1/chunks answers errors in the shared error shape", async () => {
    // On the internal listener, a read without a capability is refused before the route runs.
    const refused = await fetch(`${s.internalUrl}/v1/chunks/nope/1?offset=0&length=1`);
    expect(refused.status).toBe(401);
    expect(await refused.json()).toMatchObject({ error: { code: "unauthorized", type: expect.any(String), param: null } });
    // The route's own answers (what an authorised read of a bad range gets), in the same shape.
    const route = chunkRoutes(s.services.prefill!);
    const res = await route.request("/v1/chunks/nope/1?offset=0&length=1");
    expect(res.status).toBe(404);
    expect(await res.json()).toEqual({
      error: { message: "no shard nope here", type: "not_found_error", code: "unknown_shard", param: null },
    });
    const bad = await route.request("/v1/chunks/nope/1?offset=-1&length=1");
    expect(bad.status).toBe(400);
    expect(await bad.json()).toMatchObject({ error: { code: "invalid_request", type: "invalid_request_error", param: null } });
  });

  /**
   * A decode-only service beside the serve, until the test ends: it prefills on the registry's
   * prefill instance (through the shard) and loads the KV after the handle, as a client's
   * /v1/decode does: the first token is out before the load that these tests make fail (a
   * streamed load fails before it).
   */
  async function shardDecode(): Promise<RunningServices> {
    const d = await startDecodeBeside(s, { kvStreaming: false });
    onTestFinished(() => d.stop());
    return d;
  }

  /** Until the test ends, every chunk lease fails with `error` (the load's first step). */
  function leasesFail(error: Error): void {
    const chunks = s.rt.registry.chunks;
    const acquireRead = chunks.acquireRead;
    chunks.acquireRead = async () => {
      throw error;
    };
    onTestFinished(() => {
      chunks.acquireRead = acquireRead;
    });
  }

  it("a stream whose KV load fails after the first token ends with an error event, then [DONE]", async () => {
    const d = await shardDecode(); // the KV load is what fails: `serve`'s in-process handoff has none
    leasesFail(new KvLoadError("cannot read the KV (unreachable): the owner went away", "transport"));
    const events = await chatStream(d.url);
    expect(JSON.parse(events[0]!).choices[0].delta.role).toBe("assistant"); // the handle's first token went out
    const error = JSON.parse(events.at(-2)!);
    expect(error).toMatchObject({ error: { code: "kv_load_failed", type: "upstream_error" } });
    expect(error.error.message).toMatch(/the owner went away/);
    expect(events.at(-1)).toBe("[DONE]");
    expect(d.services.decode!.status()).toMatchObject({ admitted: 0, kv_reserved_bytes: 0 });
  });

  it("an internal failure mid-stream shows no details to the client and logs a bounded line without parameters", async () => {
    const d = await shardDecode(); // the KV load is what fails: `serve`'s in-process handoff has none
    const secret = "secret-param-";
    leasesFail(
      new DrizzleQueryError(
        "select * from chunks where id in ($1, …)",
        Array.from({ length: 200_000 }, (_, i) => `${secret}${i}`),
        new Error("bind message has 200000 parameter formats"),
      ),
    );
    const before = logLines.length;
    const events = await chatStream(d.url);
    expect(JSON.parse(events.at(-2)!)).toEqual({
      error: { message: "internal error; see the service log", type: "server_error", code: "internal_error", param: null },
    });
    expect(events.at(-1)).toBe("[DONE]");
    const logged = logLines.slice(before);
    const line = logged.find((l) => l.includes("a stream failed"));
    expect(line).toBeDefined();
    expect(line).toContain("parameters not logged");
    expect(line).toContain("bind message has 200000 parameter formats"); // the cause stays
    expect(logged.every((l) => l.length < 20_000 && !l.includes(secret))).toBe(true);
  });

  it("the database going down: /ready is 503 and requests are 503 not_ready, not 500", async () => {
    const ready = await fetch(`${s.url}/ready`);
    expect(ready.status).toBe(200);
    expect(await ready.json()).toMatchObject({ status: "ready", database: "reachable" });

    await pg.stop();
    await until("/ready reports the database down", async () => (await fetch(`${s.url}/ready`)).status === 503, 10_000);
    expect(await (await fetch(`${s.url}/ready`)).json()).toMatchObject({ status: "not ready", database: "unreachable" });
    const prefill = await postJson(`${s.url}/v1/prefill`, { prompt: "Hello there" });
    expect(prefill.status, JSON.stringify(prefill.body)).toBe(503);
    expect(prefill.body).toMatchObject({ error: { code: "not_ready", message: expect.stringMatching(/database is unreachable/) } });
    expect((await fetch(`${s.url}/health`)).status).toBe(200);
  });
});

describe("database outage classification", () => {
  it("refused, broken and timed-out connections are outages (503); other errors are not", () => {
    const wrap = (cause: Error) => new DrizzleQueryError("select 1", [], cause);
    const coded = (message: string, code: string) => Object.assign(new Error(message), { code });
    expect(isDatabaseUnavailable(wrap(coded("connect ECONNREFUSED 127.0.0.1:5432", "ECONNREFUSED")))).toBe(true);
    expect(isDatabaseUnavailable(wrap(coded("terminating connection due to administrator command", "57P01")))).toBe(true);
    expect(isDatabaseUnavailable(wrap(new Error("Query read timeout")))).toBe(true); // pg's query_timeout: a hung server
    expect(isDatabaseUnavailable(wrap(new Error("timeout exceeded when trying to connect")))).toBe(true);
    expect(isDatabaseUnavailable(wrap(new Error("Connection terminated unexpectedly")))).toBe(true);
    expect(isDatabaseUnavailable(wrap(coded('duplicate key value violates unique constraint "x"', "23505")))).toBe(false);
    expect(isDatabaseUnavailable(new TypeError("x is undefined"))).toBe(false);
  });
});

describe("DATABASE_URL redaction", () => {
  it("hides the password in user:password@ and in ?password=", async () => {
    expect(redactDatabaseUrl("postgres://app:hunter2@db:5432/x")).toBe("postgres://app:***@db:5432/x");
    expect(redactDatabaseUrl("postgres://app@db/x?sslmode=require&password=hunter2&x=1")).toBe(
      "postgres://app@db/x?sslmode=require&password=***&x=1",
    );
    // Unencoded @, / and ? in the password: nothing of it is left.
    expect(redactDatabaseUrl("postgres://app:hun@ter@2@db:5432/x")).toBe("postgres://app:***@db:5432/x");
    expect(redactDatabaseUrl("postgres://app:a/b?c#d@db/x")).toBe("postgres://app:***@db/x");
    expect(redactDatabaseUrl("postgres://db/x")).toBe("postgres://db/x");
    expect(redactDatabaseUrl("postgresql://db/x?PASSWORD=hunter2")).toBe("postgresql://db/x?PASSWORD=***");
    const err = await openDatabase("postgresql://app@127.0.0.1:1/x?password=hunter2").then(
      () => undefined,
      (e: unknown) => e as Error,
    );
    expect(err?.message).toMatch(/cannot open PostgreSQL at postgresql:\/\/app@127\.0\.0\.1:1\/x\?password=\*\*\*/);
    expect(err?.message).not.toContain("hunter2");
  });
});

describe("model fingerprint", () => {
  let dir: string;
  beforeAll(async () => {
    dir = await mkdtemp(path.join(os.tmpdir(), "ctxbank-fingerprint-"));
  });
  afterAll(async () => {
    await rm(dir, { recursive: true, force: true });
  });

  it("covers the weights: one flipped bit gives another fingerprint, the same bytes the same", async () => {
    const a = path.join(dir, "a.gguf");
    await writeFile(a, tinyLlama());
    await copyFile(a, path.join(dir, "copy.gguf"));
    const flipped = await readFile(a);
    flipped[flipped.length - 5]! ^= 0x01; // a mantissa bit of the last weight
    await writeFile(path.join(dir, "flipped.gguf"), flipped);
    const [ma, mc, mf] = await Promise.all(["a", "copy", "flipped"].map((n) => loadModel(path.join(dir, `${n}.gguf`))));
    expect(ma!.fingerprint).toMatch(/^[0-9a-f]{64}$/);
    expect(mc!.fingerprint).toBe(ma!.fingerprint);
    expect(mf!.fingerprint).not.toBe(ma!.fingerprint);
    expect(mf!.native.weightsCrc32c).not.toBe(ma!.native.weightsCrc32c);
  });
});
