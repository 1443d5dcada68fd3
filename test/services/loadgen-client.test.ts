// tools/loadgen's client and runner against a local scripted SSE server (tools/loadgen/fake-server.ts):
// TTFT/ITL/TPOT timing, usage-based token counts, error classes (429, 5xx, mid-stream errors,
// timeouts, refused connections), the arrival processes as the server sees them, caps, multi-turn
// sessions (x-session-id per conversation, whole sessions in a closed loop, the router's header and
// ctxbank's reuse/placement reports per round), and the policy check against a server's OpenAPI document.
import http from "node:http";
import type { AddressInfo } from "node:net";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { StreamingClient, type RequestSpec } from "../../tools/loadgen/client.ts";
import { startFakeServer, type FakeScript, type FakeServer } from "../../tools/loadgen/fake-server.ts";
import { PromptSource } from "../../tools/loadgen/prompts.ts";
import { runLoad } from "../../tools/loadgen/runner.ts";
import { roundStats, serverCounts } from "../../tools/loadgen/stats.ts";
import { policyValues } from "../../tools/loadgen/target.ts";
import { WorkloadFactory } from "../../tools/loadgen/workloads.ts";
import { seededRng } from "../../tools/lib/random.ts";
import { resolveModel } from "../../shared/inference/model/resolve.ts";
import { GgufTokenizer } from "../../shared/inference/tokenizer/tokenizer.ts";
import { ChatTemplate } from "../../shared/inference/tokenizer/chat-template.ts";

const spec = (endpoint: "chat" | "completions" = "completions"): RequestSpec => ({
  endpoint,
  body: endpoint === "chat" ? { messages: [{ role: "user", content: "hi" }], max_tokens: 8 } : { prompt: "hi", max_tokens: 8 },
  promptTokensSent: 3,
});

let server: FakeServer;
let script: (body: any, headers: http.IncomingHttpHeaders) => FakeScript = () => ({});

beforeAll(async () => {
  server = await startFakeServer((body, _n, headers) => script(body, headers));
});
afterAll(async () => {
  await server.close();
});

const client = (timeoutMs = 10_000) => new StreamingClient({ baseUrl: server.url, model: "m", timeoutMs, extraBody: { policy: "omnikv" } });

describe("streaming client timing", () => {
  it("TTFT, every ITL gap, TPOT and E2E of a paced stream; usage gives the token count", async () => {
    script = () => ({ ttftMs: 200, itlMs: 40, tokens: 6 });
    const c = client();
    const r = await c.send(spec("chat"));
    await c.close();
    expect(r.ok).toBe(true);
    expect(r.tokenChunks).toBe(6);
    expect(r.outputTokens).toBe(6);
    expect(r.itlMs).toHaveLength(5);
    expect(r.ttftMs!).toBeGreaterThanOrEqual(195);
    expect(r.ttftMs!).toBeLessThan(600);
    for (const g of r.itlMs) {
      expect(g).toBeGreaterThanOrEqual(30);
      expect(g).toBeLessThan(250);
    }
    const span = r.itlMs.reduce((s, g) => s + g, 0);
    expect(r.tpotMs!).toBeCloseTo(span / 5, 6);
    expect(r.e2eMs!).toBeGreaterThanOrEqual(r.ttftMs! + span);
    expect(r.text).toBe("tok0 tok1 tok2 tok3 tok4 tok5 ");
    expect(r.finishReason).toBe("length");
    expect(r.promptTokens).toBe(7);
    // The request carried the model, stream flags and extra fields.
    expect(server.received.at(-1)).toMatchObject({
      model: "m",
      stream: true,
      stream_options: { include_usage: true },
      policy: "omnikv",
      max_tokens: 8,
    });
  });

  it("events split across writes and CRLF line ends time the same tokens; usage overrides chunk counts", async () => {
    script = () => ({ ttftMs: 20, itlMs: 10, tokens: 5, splitWrites: true, crlf: true, usageTokens: 9 });
    const c = client();
    const r = await c.send(spec("completions"));
    await c.close();
    expect(r.ok).toBe(true);
    expect(r.tokenChunks).toBe(5);
    expect(r.outputTokens).toBe(9); // the server said 9 tokens came in 5 chunks
    expect(r.itlMs).toHaveLength(4);
    const span = r.itlMs.reduce((s, g) => s + g, 0);
    expect(r.tpotMs!).toBeCloseTo(span / 8, 6);
  });

  it("classifies 429, 5xx, mid-stream errors, timeouts and refused connections", async () => {
    const c = client(300);
    script = () => ({ status: 429 });
    expect(await c.send(spec())).toMatchObject({ ok: false, status: 429, errorKind: "rate_limited" });
    script = () => ({ status: 400 });
    expect(await c.send(spec())).toMatchObject({ ok: false, errorKind: "http_4xx" });
    script = () => ({ status: 502 });
    expect(await c.send(spec())).toMatchObject({ ok: false, errorKind: "http_5xx" });
    script = () => ({ tokens: 5, errorAfter: 2 });
    const mid = await c.send(spec());
    expect(mid).toMatchObject({ ok: false, errorKind: "stream_error" });
    expect(mid.error).toMatch(/scripted failure/);
    script = () => ({ ttftMs: 2000, tokens: 1 });
    expect(await c.send(spec())).toMatchObject({ ok: false, errorKind: "timeout" });
    await c.close();
    const dead = new StreamingClient({ baseUrl: "http://127.0.0.1:1/v1", model: "m", timeoutMs: 2000 });
    expect(await dead.send(spec())).toMatchObject({ ok: false, errorKind: "network" });
    await dead.close();
  });
});

describe("runner against the fake server", () => {
  let factory: WorkloadFactory;
  beforeAll(async () => {
    const path = await resolveModel();
    const tok = GgufTokenizer.fromGguf(path);
    const prompts = new PromptSource(tok, "The quick brown fox jumps over the lazy dog. ".repeat(400), ChatTemplate.fromGguf(path, tok));
    factory = new WorkloadFactory(
      {
        kind: "synthetic",
        endpoint: "completions",
        input: { kind: "fixed", value: 64 },
        output: { kind: "fixed", value: 8 },
        promptFormat: "ids",
      },
      prompts,
    );
  });

  it("Poisson: sends the seeded schedule, records timing, attainment and 429s separately", async () => {
    let n = 0;
    script = () => (n++ % 5 === 4 ? { status: 429 } : { ttftMs: 30, itlMs: 5, tokens: 4 });
    const c = client();
    const run = await runLoad(c, factory, {
      arrivals: { kind: "poisson", rate: 40 },
      maxRequests: 30,
      durationS: 60,
      drainS: 10,
      warmup: 2,
      seed: 3,
      slo: { ttftMs: 1000, tpotMs: 100 },
      progress: false,
    });
    await c.close();
    expect(run.warmup).toMatchObject({ sent: 2, ok: 2 });
    expect(run.results).toHaveLength(30);
    expect(run.stats.errors.rate_limited).toBe(6);
    expect(run.stats.ok).toBe(24);
    expect(run.stats.slo!.attainment).toBeCloseTo(24 / 30, 12);
    // Sent on schedule (open loop): lag small against the 25 ms mean gap.
    expect(run.stats.sendLagMs.p50).toBeLessThan(20);
    for (const r of run.results.filter((x) => x.ok)) expect(r.promptTokensSent).toBe(64);
    const body = server.received.at(-1);
    expect(body.prompt).toHaveLength(64); // token ids: exact lengths
  });

  it("closed loop keeps exactly C requests in flight; the request cap holds", async () => {
    script = () => ({ ttftMs: 40, itlMs: 5, tokens: 3 });
    server.resetInFlight();
    const c = client();
    const run = await runLoad(c, factory, {
      arrivals: { kind: "concurrency", concurrency: 3 },
      maxRequests: 12,
      durationS: 60,
      drainS: 10,
      warmup: 0,
      seed: 1,
      progress: false,
    });
    await c.close();
    expect(run.results).toHaveLength(12);
    expect(server.maxInFlight()).toBe(3);
  });

  it("the duration cap stops sending; requests past the drain are aborted as timeouts", async () => {
    script = () => ({ ttftMs: 3000, tokens: 1 });
    const c = client(60_000);
    const t0 = performance.now();
    const run = await runLoad(c, factory, {
      arrivals: { kind: "burst", size: 2, periodS: 0.4 },
      maxRequests: 100,
      durationS: 1,
      drainS: 0.5,
      warmup: 0,
      seed: 1,
      progress: false,
    });
    await c.close();
    expect(performance.now() - t0).toBeLessThan(2500);
    expect(run.results).toHaveLength(6); // bursts at 0, 0.4, 0.8 s
    expect(run.stats.errors.timeout).toBe(6);
  });
});

describe("multi-turn sessions against the fake server", () => {
  let prompts: PromptSource;
  beforeAll(async () => {
    const path = await resolveModel();
    const tok = GgufTokenizer.fromGguf(path);
    prompts = new PromptSource(tok, "The quick brown fox jumps over the lazy dog. ".repeat(400), ChatTemplate.fromGguf(path, tok));
  });
  const multiturn = (sessionIds?: boolean) =>
    new WorkloadFactory(
      {
        kind: "multiturn",
        rounds: 3,
        thinkS: 0,
        input: { kind: "fixed", value: 20 },
        output: { kind: "fixed", value: 4 },
        ...(sessionIds === undefined ? {} : { sessionIds }),
      },
      prompts,
      { runTag: "t1" },
    );

  it("each conversation sends its own x-session-id on every round (default on), a closed loop runs whole sessions; the answers' route, reuse and placement are recorded and counted per round", async () => {
    // The server answers like ctxbank's router: a route header, and the reused tokens and placement in the last chunk.
    script = (body, headers) => {
      const round = (body.messages.length - 1) / 2;
      // The first measured session is slow: a closed loop must not start a fifth session in its place.
      const slow = headers["x-session-id"] === "lg-t1-1" ? 300 : 0;
      return {
        ttftMs: 5 + 10 * round + slow,
        itlMs: 2,
        tokens: 3,
        headers: { "x-ctxbank-route": `decode-${round % 2}; reason=${round === 0 ? "load" : "session"}` },
        ctxbank: {
          session: { id: headers["x-session-id"], reused_tokens: 50 * round, turns: round + 1 },
          prefill: round === 0 ? { where: "remote", cause: "long", reason: "r" } : { where: "local", cause: "fraction", reason: "r" },
        },
      };
    };
    const from = server.received.length;
    const c = client();
    const run = await runLoad(c, multiturn(), {
      arrivals: { kind: "concurrency", concurrency: 2 },
      maxRequests: 12,
      durationS: 60,
      drainS: 10,
      warmup: 1,
      seed: 5,
      progress: false,
    });
    await c.close();
    // The warm-up round names no session; then 4 sessions of 3 rounds.
    const headers = server.receivedHeaders.slice(from);
    expect(headers[0]!["x-session-id"]).toBeUndefined();
    const measured = headers.slice(1).map((h) => h["x-session-id"]);
    expect(measured).toHaveLength(12);
    for (const id of measured) expect(id).toMatch(/^lg-t1-\d+$/);
    expect(new Set(measured).size).toBe(4);
    // Every request of one session carried that session's id, and the result records it.
    for (const r of run.results) expect(r.sessionId).toBe(run.results.find((x) => x.session === r.session && x.round === 0)!.sessionId);
    expect(new Set(run.results.map((r) => r.sessionId)).size).toBe(4);
    expect(run.sessions).toMatchObject({ started: 4, completed: 4, sessionIds: true });
    for (let i = 0; i < 4; i++) expect(run.results.filter((r) => r.session === i).map((r) => r.round)).toEqual([0, 1, 2]);
    // Per round: the last turn is round index 2.
    expect(run.rounds!.map((r) => [r.round, r.requests, r.ok])).toEqual([
      [0, 4, 4],
      [1, 4, 4],
      [2, 4, 4],
    ]);
    expect(run.rounds![2]!.reusedTokens!.p50).toBe(100);
    expect(run.rounds![2]!.ttftMs.p50).toBeGreaterThan(run.rounds![0]!.ttftMs.p50 + 10);
    expect(run.results.find((r) => r.round === 1)).toMatchObject({
      route: { decode: "decode-1", reason: "session" },
      reusedTokens: 50,
      prefill: { where: "local", cause: "fraction" },
    });
    expect(run.server).toMatchObject({
      routeReason: { load: 4, session: 8 },
      routeDecode: { "decode-0": 8, "decode-1": 4 },
      prefillWhere: { remote: 4, local: 8 },
      prefillCause: { "remote/long": 4, "local/fraction": 8 },
      sessions: { reported: 12, reused: 8, reusedTokens: 4 * (50 + 100) },
    });
    expect(roundStats(run.results)).toHaveLength(3);
  });

  it("with session ids off, nothing names a session; a server without ctxbank's reports gives no counts", async () => {
    script = () => ({ ttftMs: 2, itlMs: 1, tokens: 2 });
    const from = server.received.length;
    const c = client();
    const run = await runLoad(c, multiturn(false), {
      arrivals: { kind: "concurrency", concurrency: 1 },
      maxRequests: 6,
      durationS: 60,
      drainS: 10,
      warmup: 0,
      seed: 5,
      progress: false,
    });
    await c.close();
    expect(run.results).toHaveLength(6);
    for (const h of server.receivedHeaders.slice(from)) expect(h["x-session-id"]).toBeUndefined();
    for (const r of run.results) expect(r.sessionId).toBeUndefined();
    expect(run.sessions).toMatchObject({ completed: 2, sessionIds: false });
    expect(run.rounds).toHaveLength(3);
    expect(run.server).toBeUndefined();
    expect(serverCounts(run.results)).toBeUndefined();
  });

  it("the same seed draws the same conversations with session ids on or off", () => {
    const a = multiturn(true).next(seededRng(9));
    const b = multiturn(false).next(seededRng(9));
    if (a.kind !== "session" || b.kind !== "session") throw new Error("not a session");
    expect(a.round(0, []).spec.body).toEqual(b.round(0, []).spec.body);
    expect(a.round(0, []).spec.headers).toEqual({ "x-session-id": a.sessionId });
    expect(b.round(0, []).spec.headers).toBeUndefined();
  });
});

describe("policy check", () => {
  it("reads the allowed values of a request's policy field from /openapi.json", async () => {
    let doc: unknown = {};
    const srv = http.createServer((req, res) => {
      if (req.url === "/openapi.json" && doc) res.writeHead(200, { "content-type": "application/json" }).end(JSON.stringify(doc));
      else res.writeHead(404).end();
    });
    await new Promise<void>((r) => srv.listen(0, "127.0.0.1", r));
    const base = `http://127.0.0.1:${(srv.address() as AddressInfo).port}/v1`;
    const path = "/v1/chat/completions";
    doc = {
      paths: { [path]: { post: { requestBody: { content: { "application/json": { schema: { $ref: "#/components/schemas/Chat" } } } } } } },
      components: {
        schemas: { Chat: { properties: { policy: { anyOf: [{ type: "string", enum: ["full", "omnikv"] }, { type: "null" }] } } } },
      },
    };
    expect(await policyValues(base, path)).toEqual(["full", "omnikv"]);
    doc = { paths: { [path]: { post: { requestBody: { content: { "application/json": { schema: { properties: { model: {} } } } } } } } } };
    expect(await policyValues(base, path)).toEqual([]);
    doc = {
      paths: {
        [path]: { post: { requestBody: { content: { "application/json": { schema: { properties: { policy: { type: "object" } } } } } } } },
      },
    };
    expect(await policyValues(base, path)).toEqual(["*"]);
    doc = null;
    expect(await policyValues(base, path)).toBeUndefined();
    srv.close();
  });
});
