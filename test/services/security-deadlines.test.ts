// Deadlines on decode's internal calls, with fake peers registered in the registry next to a real
// decode (the real model): a prefill that hangs while it keeps heartbeating ends the request with
// 504 prefill_timeout at the prefill deadline; a prefill process that is SIGSTOPped mid-call ends
// it with 502 prefill_failed as soon as the registry declares it dead, well before the deadline;
// a chunk owner that never answers ends the KV load with 502 kv_load_failed at kvTimeoutMs, and
// one that goes silent ends it as soon as it is declared dead.
// Nothing is left held afterwards.
import { spawn, type ChildProcess } from "node:child_process";
import { randomBytes, randomUUID } from "node:crypto";
import http from "node:http";
import type { AddressInfo } from "node:net";
import { afterAll, afterEach, beforeAll, describe, expect, it } from "vitest";
import type { Config } from "../../shared/platform/config.ts";
import { LAYOUT_VERSION, chunkByteLength } from "../../services/handoff/format/chunk.ts";
import { kvShape } from "../../services/handoff/format/seq-io.ts";
import { startServices, type RunningServices } from "../../services/process.ts";
import { openRuntime, type Runtime } from "../../services/runtime.ts";
import { tempShardDir } from "../../tools/lib/services.ts";
import { testConfig } from "../harness/serve.ts";

const HEARTBEAT_MS = 200;
const HEARTBEAT_TIMEOUT_MS = 1_000;
const PREFILL_TIMEOUT_MS = 4_000;
const KV_TIMEOUT_MS = 4_000;

/** A server that reads requests and never answers (a hung peer that keeps its sockets open). */
async function hungServer(): Promise<{ url: string; close(): Promise<void> }> {
  const server = http.createServer((req) => req.resume());
  await new Promise<void>((r) => server.listen(0, "127.0.0.1", r));
  return {
    url: `http://127.0.0.1:${(server.address() as AddressInfo).port}`,
    close: () => new Promise<void>((r) => (server.closeAllConnections(), server.close(() => r()))),
  };
}

/** A child process serving POST /v1/prefill slowly (3 s), so it can be SIGSTOPped mid-call. */
async function slowPrefillProcess(): Promise<{ child: ChildProcess; url: string; requests(): number }> {
  const code = `
    const http = require("node:http");
    let n = 0;
    const s = http.createServer((req, res) => { req.resume(); n++; process.stdout.write("req\\n");
      setTimeout(() => { res.writeHead(500, {"content-type": "application/json"}); res.end('{"error":{"message":"late","code":"internal_error"}}'); }, 3000); });
    s.listen(0, "127.0.0.1", () => process.stdout.write("port " + s.address().port + "\\n"));`;
  const child = spawn(process.execPath, ["-e", code], { stdio: ["ignore", "pipe", "inherit"] });
  let out = "";
  child.stdout!.setEncoding("utf8").on("data", (d: string) => (out += d));
  const port = await new Promise<number>((resolve, reject) => {
    const t = setTimeout(() => reject(new Error("fake prefill did not start")), 10_000);
    child.stdout!.on("data", () => {
      const m = /port (\d+)/.exec(out);
      if (m) {
        clearTimeout(t);
        resolve(Number(m[1]));
      }
    });
  });
  return { child, url: `http://127.0.0.1:${port}`, requests: () => out.split("\n").filter((l) => l === "req").length };
}

describe("deadlines on decode's internal calls", () => {
  let shards: Awaited<ReturnType<typeof tempShardDir>>;
  let rt: Runtime;
  let decode: RunningServices;
  let base: Config;
  const cleanups: Array<() => Promise<void> | void> = [];

  beforeAll(async () => {
    shards = await tempShardDir();
    base = testConfig({
      shardDir: shards.dir,
      transport: "http",
      heartbeatMs: HEARTBEAT_MS,
      heartbeatTimeoutMs: HEARTBEAT_TIMEOUT_MS,
      prefillTimeoutMs: PREFILL_TIMEOUT_MS,
      kvTimeoutMs: KV_TIMEOUT_MS,
    });
    rt = await openRuntime(base);
    // Only a decode: the prefill instances it can call are the fakes registered below.
    decode = await startServices({ ...base, role: "decode", instanceId: "deadline-decode" }, rt);
  });
  afterEach(async () => {
    for (const f of cleanups.splice(0).reverse()) await f();
  });
  afterAll(async () => {
    await decode?.stop();
    await rt?.close();
    await shards?.remove();
  });

  /** Registers a fake prefill instance and heartbeats it until the returned function is called. */
  async function fakeInstance(id: string, baseUrl: string): Promise<() => void> {
    await rt.registry.instances.register({ id, role: "prefill", baseUrl, hostId: base.hostId });
    const beat = setInterval(() => void rt.registry.instances.heartbeat(id).catch(() => {}), HEARTBEAT_MS);
    const stop = () => clearInterval(beat);
    cleanups.push(async () => {
      stop();
      await rt.registry.instances.markDraining(id).catch(() => {});
    });
    return stop;
  }

  const complete = async () => {
    const t0 = performance.now();
    const res = await fetch(`${decode.url}/v1/completions`, {
      method: "POST",
      headers: { "content-type": "application/json" },
      body: JSON.stringify({ model: "default", prompt: "Hello", max_tokens: 2 }),
    });
    return { status: res.status, body: (await res.json()) as any, ms: performance.now() - t0 };
  };

  const settled = () => {
    const s = decode.services.decode!.status();
    const q = decode.services.decode!.handoff.prefillCalls;
    return s.admitted === 0 && s.live_sequences === 0 && q.running === 0 && q.queued === 0;
  };

  it("a prefill that hangs but keeps heartbeating: 504 prefill_timeout at the deadline", async () => {
    const hung = await hungServer();
    cleanups.push(() => hung.close());
    await fakeInstance("hung-prefill", hung.url);
    const r = await complete();
    expect(r.status, JSON.stringify(r.body)).toBe(504);
    expect(r.body.error).toMatchObject({ code: "prefill_timeout", type: "timeout_error" });
    expect(r.ms).toBeGreaterThanOrEqual(PREFILL_TIMEOUT_MS - 100);
    expect(r.ms).toBeLessThan(PREFILL_TIMEOUT_MS + 2_000);
    expect(settled()).toBe(true);
  });

  it("a prefill process SIGSTOPped mid-call: 502 prefill_failed once the registry declares it dead, before the deadline", async () => {
    const fake = await slowPrefillProcess();
    cleanups.push(() => {
      fake.child.kill("SIGCONT");
      fake.child.kill("SIGKILL");
    });
    const stopBeating = await fakeInstance("stopped-prefill", fake.url);
    const pending = complete();
    await new Promise<void>((resolve) => {
      const check = setInterval(() => fake.requests() > 0 && (clearInterval(check), resolve()), 20);
    });
    // The process freezes: no answer, no heartbeat, its sockets stay open.
    fake.child.kill("SIGSTOP");
    stopBeating();
    const r = await pending;
    expect(r.status, JSON.stringify(r.body)).toBe(502);
    expect(r.body.error.code).toBe("prefill_failed");
    expect(r.body.error.message).toMatch(/stopped-prefill .*(declared dead|silent)/);
    expect(r.ms).toBeLessThan(PREFILL_TIMEOUT_MS);
    expect(r.ms).toBeLessThan(HEARTBEAT_TIMEOUT_MS + 3 * HEARTBEAT_MS + 1_000);
    expect(settled()).toBe(true);
  });

  /** A committed one-chunk handle whose bytes live on `owner`'s (fake) shard. */
  async function fakeHandle(owner: string) {
    const { model } = rt;
    const shape = kvShape(model.config);
    const shard = await rt.registry.shards.create({
      id: owner,
      instanceId: owner,
      sizeBytes: 64 << 20,
      pathFor: (e) => `${shards.dir}/${owner}.${e}.shard`,
    });
    const n = 8;
    const requestId = `req-${randomUUID()}`;
    await rt.registry.requests.create({ id: requestId, sessionId: null, roundId: null, promptTokens: n });
    const layerIds = Array.from({ length: shape.nLayer }, (_, i) => i);
    const length = chunkByteLength({
      fingerprint: model.fingerprint,
      dtype: "f16",
      layerIds,
      hkv: shape.hkv,
      headDim: shape.headDim,
      tokenStart: 0,
      tokenCount: n,
    });
    const begun = await rt.registry.chunks.begin({
      key: randomBytes(32).toString("hex"),
      requestId,
      sessionId: null,
      roundId: null,
      layerGroup: 0,
      layerIds,
      tokenStart: 0,
      tokenEnd: n,
      shardId: owner,
      shardEpoch: shard.epoch,
      offset: 0,
      length,
      dtype: "f16",
      layoutVersion: LAYOUT_VERSION,
      modelFingerprint: model.fingerprint,
      writeLeaseMs: 60_000,
    });
    await rt.registry.chunks.commit(begun.chunk.id, { checksum: 1, retainMs: 60_000 });
    const handle = {
      request_id: requestId,
      first_token: 100,
      chunk_ids: [begun.chunk.id],
      shard_id: owner,
      shard_epoch: shard.epoch,
      model_fingerprint: model.fingerprint,
      prompt_tokens: n,
      prompt_token_ids: Array.from({ length: n }, (_, i) => 100 + i),
      layer_groups: [layerIds],
      block_tokens: 32,
      sampling: { temperature: 0, top_p: 1, top_k: 40, seed: 1 },
      prefill_ms: 1,
      expires_at: new Date(Date.now() + 60_000).toISOString(),
    };
    return { handle, chunkId: begun.chunk.id };
  }

  const decodeHandle = async (handle: object) => {
    const t0 = performance.now();
    const res = await fetch(`${decode.url}/v1/decode`, {
      method: "POST",
      headers: { "content-type": "application/json" },
      body: JSON.stringify({ handle, max_tokens: 4 }),
    });
    return { status: res.status, body: (await res.json()) as any, ms: performance.now() - t0 };
  };

  it("a chunk owner that never answers: the KV load ends with 502 kv_load_failed at kvTimeoutMs and its leases are released", async () => {
    const hung = await hungServer();
    cleanups.push(() => hung.close());
    await fakeInstance("hung-owner", hung.url);
    const { handle, chunkId } = await fakeHandle("hung-owner");
    const r = await decodeHandle(handle);
    expect(r.status, JSON.stringify(r.body)).toBe(502);
    expect(r.body.error.code).toBe("kv_load_failed");
    expect(r.body.error.message).toMatch(/deadline/);
    expect(r.ms).toBeGreaterThanOrEqual(KV_TIMEOUT_MS - 100);
    expect(r.ms).toBeLessThan(KV_TIMEOUT_MS + 2_000);
    const row = await rt.registry.chunks.get(chunkId);
    expect(row?.readerCount ?? 0).toBe(0);
    expect(settled()).toBe(true);
  });

  it("a chunk owner that goes silent mid-read: the KV load ends as soon as the registry declares it dead, before kvTimeoutMs", async () => {
    const hung = await hungServer();
    cleanups.push(() => hung.close());
    const stopBeating = await fakeInstance("silent-owner", hung.url);
    const { handle } = await fakeHandle("silent-owner");
    stopBeating();
    const r = await decodeHandle(handle);
    expect(r.status, JSON.stringify(r.body)).toBe(502);
    expect(r.body.error.code).toBe("kv_load_failed");
    expect(r.body.error.message).toMatch(/owner is gone: instance silent-owner (was declared dead|has been silent)/);
    expect(r.ms).toBeLessThan(HEARTBEAT_TIMEOUT_MS + 3 * HEARTBEAT_MS + 1_000);
    expect(r.ms).toBeLessThan(KV_TIMEOUT_MS);
    expect(settled()).toBe(true);
  });
});
