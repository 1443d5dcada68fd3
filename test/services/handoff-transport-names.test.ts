// Every way the KV reaches a decode says which one it was: over shm, HTTP (the socket reader) and
// UCX (where its addon is built) a decode's load names its own transport in the request's `kv`
// and in the transfer metrics (bytes and load time under that label, none under another), both
// when the chunks stream in while the prompt is prefilled and when they are read after the handle
// (a client's /v1/decode). Under `serve` the prompt is handed over in process: the result says
// in_process and no transfer is recorded. The prefill is a process of its own over PostgreSQL 15;
// the decodes run here, so the streamed load's result (which the OpenAI answers do not show) can
// be read. A streamed UCX load used to report shm.
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { loadConfig, type Config } from "../../shared/platform/config.ts";
import type { Handle } from "../../shared/platform/http/wire.ts";
import type { DecodeEvent } from "../../services/decode/service.ts";
import { startServices, type RunningServices } from "../../services/process.ts";
import { openRuntime, type Runtime } from "../../services/runtime.ts";
import { ucxAvailable } from "../../services/handoff/transport/ucx.ts";
import { startPostgres, type TestPostgres } from "../../tools/lib/postgres.ts";
import { startService, tempShardDir, TEST_INTERNAL_SECRET, type ServiceProcess } from "../../tools/lib/services.ts";
import { parseProm } from "../harness/prom.ts";
import { postJson } from "../harness/http.ts";
import { clusterArgs } from "../harness/serve.ts";

const TRANSPORTS: Array<"shm" | "http" | "ucx"> = ["shm", "http", ...(ucxAvailable() ? (["ucx"] as const) : [])];
if (!ucxAvailable()) console.warn("[handoff-transport-names] the UCX case is skipped: the UCX transport addon is not built");
// Several 64-token blocks: several chunks per load.
const PROMPT = "The lighthouse keeper wrote down every ship that passed the rocks at night. ".repeat(12);

let pg: TestPostgres;
let shards: Awaited<ReturnType<typeof tempShardDir>>;
let prefill: ServiceProcess;
let config: Config;
let rt: Runtime;

beforeAll(async () => {
  [pg, shards] = await Promise.all([startPostgres(), tempShardDir()]);
  prefill = await startService("prefill", [
    ...clusterArgs({ databaseUrl: pg.url, shardDir: shards.dir }),
    "--block-tokens",
    "64",
    "--instance-id",
    "names-prefill",
  ]);
  config = loadConfig(
    "decode",
    {},
    {},
    { databaseUrl: pg.url, shardDir: shards.dir, threads: 1, internalSecret: TEST_INTERNAL_SECRET, logLevel: "silent" },
  );
  rt = await openRuntime(config);
});

afterAll(async () => {
  await rt?.close();
  await prefill?.stop();
  await pg?.stop();
  await shards?.remove();
});

/** Services of `role` in this process on the shared runtime, reading KV over `transport`. */
function start(role: "decode" | "serve", transport: Config["transport"]): Promise<RunningServices> {
  const own = { ...config, role, transport, instanceId: `names-${role}-${transport}` };
  return startServices(own, { ...rt, config: own });
}

/** The decode's own request (what the OpenAI routes run), collected. */
async function complete(s: RunningServices): Promise<Extract<DecodeEvent, { type: "done" }>> {
  let done: Extract<DecodeEvent, { type: "done" }> | undefined;
  for await (const ev of s.services.decode!.complete(
    { prompt: PROMPT },
    { maxTokens: 4, temperature: 0 },
    new AbortController().signal,
    rt.log,
  ))
    if (ev.type === "done") done = ev;
  return done!;
}

/** The transfer series of a decode's metrics, by transport: bytes read, and loads timed. */
async function transfers(s: RunningServices): Promise<Record<string, { bytes: number; loads: number }>> {
  const m = parseProm(await s.metrics.text());
  const by: Record<string, { bytes: number; loads: number }> = {};
  for (const t of ["shm", "http", "ucx", "in_process"])
    by[t] = {
      bytes: m.sum("ctxbank:kv_transfer_bytes_total", { transport: t }),
      loads: m.sum("ctxbank:kv_transfer_seconds_count", { transport: t }),
    };
  return by;
}

describe("a KV load reports the transport it used", () => {
  it.each(TRANSPORTS)("over %s: streamed while prefilled, and after the handle", async (transport) => {
    const s = await start("decode", transport);
    try {
      expect(s.rt.config.kvStreaming).toBe(true);
      const streamed = await complete(s);
      expect(streamed.kv).toMatchObject({ transport, recomputed: false });
      expect(streamed.kv.chunks).toBeGreaterThan(1);

      const p = await postJson(`${prefill.url}/v1/prefill`, { prompt: `${PROMPT} Again.` });
      expect(p.status, JSON.stringify(p.body)).toBe(200);
      const d = await postJson(`${s.url}/v1/decode`, { handle: p.body as Handle, max_tokens: 4, temperature: 0 });
      expect(d.status, JSON.stringify(d.body)).toBe(200);
      expect(d.body.kv).toMatchObject({ transport, chunks: (p.body as Handle).chunk_ids.length, recomputed: false });

      const byTransport = await transfers(s);
      expect(byTransport[transport]!.loads).toBe(2);
      expect(byTransport[transport]!.bytes).toBe(streamed.kv.bytes + d.body.kv.bytes);
      for (const other of Object.keys(byTransport).filter((t) => t !== transport))
        expect(byTransport[other], other).toEqual({ bytes: 0, loads: 0 });
    } finally {
      await s.stop();
    }
  });

  it("in process (serve): the result says in_process, and no transfer is recorded", async () => {
    const s = await start("serve", "auto");
    try {
      const done = await complete(s);
      expect(done.kv).toEqual({ transport: "in_process", chunks: 0, bytes: 0, ms: 0, recomputed: false });
      expect(done.ctxbank.handoff).toEqual({ path: "in_process" });
      for (const [t, moved] of Object.entries(await transfers(s))) expect(moved, t).toEqual({ bytes: 0, loads: 0 });
    } finally {
      await s.stop();
    }
  });
});
