// The fault matrix (issue 10): separate `prefill` and `decode` processes on PostgreSQL 15. For each
// fault — SIGKILL and SIGSTOP of the prefill, of the decode, and PostgreSQL stopped and restarted —
// at each stage a request passes through (queued behind another prompt for the single prefill
// place, prefilling, writing chunks, decode loading the KV, decoding), every request must end within
// its deadline with a result (a recompute included) or a clean error: a 4xx/5xx in the shared error
// shape, or an SSE error event. Where the process the client talks to (the decode) is the one hit,
// nothing can answer: the client's own deadline ends it. Then recovery — a killed process is
// replaced by a new one under another id, a SIGSTOPped one is resumed (SIGCONT) and must rejoin —
// and nothing may be left behind: no chunk rows, refs or open (or unpruned) request rows in the
// registry, no shard file but the live prefill's, no allocated shard bytes, nothing held in the
// services. Stages that last milliseconds (a chunk being written, the decode's leased read) are
// held open by the services' fault points (shared/platform/faults.ts; armed in these processes by CTXBANK_FAULT_PAUSE, bin/faults.ts).
import { readdirSync, statSync, writeFileSync } from "node:fs";
import path from "node:path";
import pg from "pg";
import { afterAll, beforeAll, expect, it } from "vitest";
import { startPostgres, type TestPostgres } from "../../tools/lib/postgres.ts";
import { startService, tempShardDir, TEST_INTERNAL_SECRET, until, type ServiceProcess } from "../../tools/lib/services.ts";
import { parseSse } from "../harness/http.ts";

const HEARTBEAT_MS = 250;
const HEARTBEAT_TIMEOUT_MS = 2_000;
const PREFILL_TIMEOUT_MS = 30_000;
const KV_TIMEOUT_MS = 5_000;
const DB_TIMEOUT_MS = 3_000;
/** The service's promise: every request it answers ends within this (prefill + KV deadlines + decoding, generously). */
const SERVICE_DEADLINE_MS = 60_000;
/** The client's own deadline once the decode it talks to is frozen. */
const CLIENT_DEADLINE_AFTER_FREEZE_MS = 5_000;
/** How long a fault point holds a stage open (the fault lands inside it). */
const PAUSE_MS = 3_000;
const OUTAGE_MS = 3_000;

type Stage = "queued" | "prefilling" | "writing" | "loading" | "decoding";
type Fault = "kill prefill" | "stop prefill" | "kill decode" | "stop decode" | "postgres down";
const STAGES: Stage[] = ["queued", "prefilling", "writing", "loading", "decoding"];
const FAULTS: Fault[] = ["kill prefill", "stop prefill", "kill decode", "stop decode", "postgres down"];

let db: TestPostgres;
let sql: pg.Client;
let shards: Awaited<ReturnType<typeof tempShardDir>>;
let serial = 0;
const summary: string[] = [];

/** A running service and whether its fault point is still armed (it fires once per process). */
interface Proc {
  p: ServiceProcess;
  id: string;
  armed: boolean;
}
let prefill: Proc | undefined;
let decode: Proc | undefined;
const all: ServiceProcess[] = [];

const common = () => [
  "--threads",
  "1",
  "--database-url",
  db.url,
  "--shard-dir",
  shards.dir,
  "--heartbeat-ms",
  String(HEARTBEAT_MS),
  "--heartbeat-timeout-ms",
  String(HEARTBEAT_TIMEOUT_MS),
  "--sweep-ms",
  "500",
  "--reap-ms",
  "250",
  "--retain-ms",
  "2000",
  "--request-retention-ms",
  "1000",
  "--read-lease-ms",
  "6000",
  "--write-lease-ms",
  "6000",
  "--db-timeout-ms",
  String(DB_TIMEOUT_MS),
  "--drain-ms",
  "3000",
];

async function startPrefill(armed: boolean): Promise<Proc> {
  const id = `pf-${++serial}`;
  const p = await startService(
    "prefill",
    [...common(), "--instance-id", id, "--max-prefills", "1", "--block-tokens", "256", "--shard-bytes", String(256 << 20)],
    { DATABASE_URL: db.url, ...(armed ? { CTXBANK_FAULT_PAUSE: `prefill.write:${PAUSE_MS}` } : {}) },
  );
  all.push(p);
  return { p, id, armed };
}

async function startDecode(armed: boolean): Promise<Proc> {
  const id = `dc-${++serial}`;
  const p = await startService(
    "decode",
    [
      ...common(),
      "--instance-id",
      id,
      "--transport",
      "http",
      "--max-prefill-calls",
      "4",
      "--prefill-timeout-ms",
      String(PREFILL_TIMEOUT_MS),
      "--kv-timeout-ms",
      String(KV_TIMEOUT_MS),
    ],
    { DATABASE_URL: db.url, ...(armed ? { CTXBANK_FAULT_PAUSE: `decode.load:${PAUSE_MS}` } : {}) },
  );
  all.push(p);
  return { p, id, armed };
}

/** Makes sure a prefill and a decode run, each armed exactly when the stage needs its fault point. */
async function ensureProcesses(stage: Stage): Promise<void> {
  const wantPrefill = stage === "writing";
  const wantDecode = stage === "loading";
  const starts: Promise<void>[] = [];
  if (!prefill || prefill.armed !== wantPrefill) {
    const old = prefill;
    starts.push(
      (async () => {
        await old?.p.stop();
        prefill = await startPrefill(wantPrefill);
      })(),
    );
  }
  if (!decode || decode.armed !== wantDecode) {
    const old = decode;
    starts.push(
      (async () => {
        await old?.p.stop();
        decode = await startDecode(wantDecode);
      })(),
    );
  }
  await Promise.all(starts);
  await until("both services are ready", async () => (await ready(prefill!.p)) && (await ready(decode!.p)), 60_000);
  // The decode must see the prefill alive in the registry before it is sent anything.
  await until(
    "the prefill is alive in the registry",
    async () =>
      (await one<{ n: number }>("select count(*)::int as n from instances where id = $1 and state = 'alive'", [prefill!.id])).n === 1,
    30_000,
  );
}

async function ready(p: ServiceProcess): Promise<boolean> {
  return fetch(`${p.url}/ready`).then(
    (r) => r.ok,
    () => false,
  );
}

async function one<T>(text: string, params: unknown[] = []): Promise<T> {
  return (await sql.query(text, params)).rows[0] as T;
}

async function internalStatus(p: ServiceProcess, route: "prefill" | "decode"): Promise<any> {
  const res = await fetch(`${p.internalUrl}/v1/${route}/status`, { headers: { authorization: `Bearer ${TEST_INTERNAL_SECRET}` } });
  return res.json();
}

// A long prompt prefills for seconds on one thread (several 512-token micro-batches, 256-token
// chunks); each scenario's prompts start with their own words so no chunk is shared across them.
const LONG = (tag: string) =>
  `${tag}. ` + "In a quiet village by the sea, the fishermen rose before dawn to mend their nets and count the boats. ".repeat(40);
const SHORT = (tag: string) => `${tag}. Tell me a story about a lighthouse keeper and a storm.`;
/** A prompt greedy decoding continues for hundreds of tokens (no early end of text). */
const COUNTING = (tag: string) => `${tag}. Counting from 1 to 1000: 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12,`;

type Outcome =
  | { kind: "result"; ms: number; text: string }
  | { kind: "error status"; ms: number; status: number; code: string }
  | { kind: "error event"; ms: number; code: string }
  | { kind: "connection ended"; ms: number; detail: string }
  | { kind: "client deadline"; ms: number };

/** A streamed completion from the decode; `tokens` counts the content events seen so far. */
interface Call {
  done: Promise<Outcome>;
  /** Set once the call has ended. */
  ended: Outcome | undefined;
  tokens(): number;
  /** The client gives up `ms` from now (its own deadline). */
  deadlineIn(ms: number): void;
}

function complete(url: string, prompt: string, maxTokens: number): Call {
  const ac = new AbortController();
  let timer = setTimeout(() => ac.abort(), SERVICE_DEADLINE_MS + 10_000);
  let text = "";
  const t0 = performance.now();
  const done = (async (): Promise<Outcome> => {
    try {
      const res = await fetch(`${url}/v1/completions`, {
        method: "POST",
        headers: { "content-type": "application/json" },
        body: JSON.stringify({ model: "default", prompt, max_tokens: maxTokens, temperature: 0, stream: true, on_kv_failure: "recompute" }),
        signal: ac.signal,
      });
      if (res.status !== 200) {
        const body = (await res.json()) as any;
        expectErrorShape(body);
        return { kind: "error status", ms: performance.now() - t0, status: res.status, code: body.error.code };
      }
      const decoder = new TextDecoder();
      for await (const chunk of res.body!) text += decoder.decode(chunk as Uint8Array, { stream: true });
      const events = parseSse(text);
      const ms = performance.now() - t0;
      const error = events.find((e) => e.data.includes('"error"'));
      if (error) {
        const body = JSON.parse(error.data);
        expectErrorShape(body);
        expect(events.at(-1)?.data).toBe("[DONE]");
        return { kind: "error event", ms, code: body.error.code };
      }
      if (events.at(-1)?.data !== "[DONE]") return { kind: "connection ended", ms, detail: "stream ended without [DONE]" };
      const finish = events.map((e) => (e.data === "[DONE]" ? undefined : JSON.parse(e.data).choices?.[0]?.finish_reason)).find((f) => f);
      expect(finish).toMatch(/^(stop|length)$/);
      return {
        kind: "result",
        ms,
        text: events.map((e) => (e.data === "[DONE]" ? "" : (JSON.parse(e.data).choices?.[0]?.text ?? ""))).join(""),
      };
    } catch (e) {
      const ms = performance.now() - t0;
      if (ac.signal.aborted) return { kind: "client deadline", ms };
      return { kind: "connection ended", ms, detail: String((e as Error).cause ?? e) };
    } finally {
      clearTimeout(timer);
    }
  })();
  const call: Call = {
    done,
    ended: undefined,
    tokens: () => parseSse(text).filter((e) => e.data.includes('"text"')).length,
    deadlineIn(ms) {
      clearTimeout(timer);
      timer = setTimeout(() => ac.abort(), ms);
    },
  };
  void done.then((o) => (call.ended = o));
  return call;
}

/** Waits until `check` holds while every call is still in flight (one that ended first fails the wait, saying how). */
async function during(calls: Call[], what: string, check: () => Promise<boolean> | boolean, ms = 60_000): Promise<void> {
  await until(
    what,
    async () => {
      const ended = calls.find((c) => c.ended);
      if (ended) throw new Error(`a request ended before ${what}: ${JSON.stringify(ended.ended)}`);
      return check();
    },
    ms,
  );
}

function expectErrorShape(body: any): void {
  expect(body).toMatchObject({
    error: { message: expect.any(String), type: expect.any(String), code: expect.stringMatching(/^[a-z_]+$/) },
  });
  expect(body.error).toHaveProperty("param");
}

/** Brings a request to `stage` and returns the calls in flight (the one at the stage first). */
async function reach(stage: Stage, tag: string): Promise<Call[]> {
  const pf = prefill!.p;
  const dc = decode!.p;
  switch (stage) {
    case "queued": {
      const ahead = complete(dc.url, LONG(`${tag} ahead`), 8);
      await during([ahead], "a prompt holds the prefill place", async () => (await internalStatus(pf, "prefill")).prefills_running === 1);
      const queued = complete(dc.url, SHORT(tag), 8);
      await during(
        [ahead, queued],
        "a prompt waits for the prefill place",
        async () => (await internalStatus(pf, "prefill")).prefills_queued === 1,
      );
      return [queued, ahead];
    }
    case "prefilling": {
      const call = complete(dc.url, LONG(tag), 8);
      // Prefilling, and no chunk row yet: the first 512-token micro-batch takes seconds.
      await during(
        [call],
        "the prompt is prefilling",
        async () =>
          (
            await one<{ n: number }>(
              "select count(*)::int as n from requests r where state = 'prefilling' and not exists (select 1 from chunks c where c.request_id = r.id)",
            )
          ).n === 1,
      );
      return [call];
    }
    case "writing": {
      const call = complete(dc.url, LONG(tag), 8);
      await during([call], "a chunk is being written", () => pf.log().includes('"msg":"fault point reached"'));
      expect((await one<{ n: number }>("select count(*)::int as n from chunks where state = 'writing'")).n).toBeGreaterThan(0);
      return [call];
    }
    case "loading": {
      const call = complete(dc.url, LONG(tag), 8);
      await during([call], "the decode holds leases on the chunks", () => dc.log().includes('"msg":"fault point reached"'));
      expect((await one<{ n: number }>("select count(*)::int as n from chunks where state = 'reading'")).n).toBeGreaterThan(0);
      // Streamed handle (the default): the load starts while the prefill computes, before the
      // first token (which comes with the handle) can have been streamed.
      expect(call.tokens()).toBeLessThanOrEqual(1);
      return [call];
    }
    case "decoding": {
      const call = complete(dc.url, COUNTING(tag), 400);
      await during([call], "tokens are streaming", () => call.tokens() >= 4);
      return [call];
    }
  }
}

/** Waits until nothing of the scenario is left: registry rows, shard files and bytes, service state. */
async function expectNothingLeft(what: string): Promise<void> {
  const pf = prefill!;
  const dc = decode!;
  let last = "";
  try {
    await until(
      `${what}: nothing is left behind`,
      async () => {
        const counts = await one<Record<string, number>>(
          `select (select count(*)::int from chunks) as chunks,
                  (select count(*)::int from chunk_refs) as refs,
                  (select count(*)::int from requests where state in ('queued', 'prefilling', 'decoding')) as open_requests,
                  (select count(*)::int from requests) as requests,
                  (select count(*)::int from shards s join instances i on i.id = s.instance_id where i.state = 'dead') as dead_shards`,
        );
        const activeFiles = (await sql.query("select path from shards where state = 'active'")).rows
          .map((r) => path.basename(r.path as string))
          .sort();
        // Shard files only: each carries a small owner mark (`.owner`: its owner's pid), which goes with it.
        const all = readdirSync(shards.dir).sort();
        const files = all.filter((f) => !f.endsWith(".owner"));
        const marks = all.filter((f) => f.endsWith(".owner")).map((f) => f.slice(0, -".owner".length));
        const allocated = files.reduce((sum, f) => sum + statSync(path.join(shards.dir, f)).blocks * 512, 0);
        const ps = await internalStatus(pf.p, "prefill");
        const ds = await internalStatus(dc.p, "decode");
        const state = {
          ...counts,
          files,
          marksWithoutFile: marks.filter((m) => !files.includes(m)),
          activeFiles,
          allocated,
          shard_used: ps.shard?.bytes_used,
          prefills: ps.prefills_running + ps.prefills_queued,
          kv_in_flight: ps.kv_bytes_in_flight,
          decode_admitted: ds.admitted,
          decode_sequences: ds.live_sequences,
        };
        last = JSON.stringify(state);
        return (
          counts.chunks === 0 &&
          counts.refs === 0 &&
          counts.open_requests === 0 &&
          counts.requests === 0 &&
          counts.dead_shards === 0 &&
          JSON.stringify(files) === JSON.stringify([`${pf.id}.e${ps.shard.epoch}.shard`]) &&
          JSON.stringify(activeFiles) === JSON.stringify(files) &&
          state.marksWithoutFile.length === 0 &&
          allocated === 0 &&
          state.shard_used === 0 &&
          state.prefills === 0 &&
          state.kv_in_flight === 0 &&
          state.decode_admitted === 0 &&
          state.decode_sequences === 0
        );
      },
      45_000,
    );
  } catch (e) {
    throw new Error(`${(e as Error).message}; last seen ${last}`);
  }
}

beforeAll(async () => {
  [db, shards] = await Promise.all([startPostgres(), tempShardDir()]);
  sql = new pg.Client({ connectionString: db.url });
  sql.on("error", () => {}); // the outage scenario drops this connection too
  await sql.connect();
}, 120_000);

afterAll(async () => {
  // To see what the services logged: CTXBANK_FAULT_MATRIX_LOGS=<existing dir>.
  const logDir = process.env.CTXBANK_FAULT_MATRIX_LOGS;
  if (logDir) for (const [i, p] of all.entries()) writeFileSync(path.join(logDir, `${i}.log`), p.log());
  for (const p of all) {
    p.child.kill("SIGCONT");
    await p.kill();
  }
  await sql?.end().catch(() => {});
  await shards?.remove();
  await db?.stop();
  console.log(`fault matrix outcomes:\n${summary.join("\n")}`);
}, 60_000);

async function reconnectSql(): Promise<void> {
  await sql.end().catch(() => {});
  sql = new pg.Client({ connectionString: db.url });
  sql.on("error", () => {});
  await sql.connect();
}

const MATRIX = FAULTS.flatMap((fault) => STAGES.map((stage) => [fault, stage] as const));

it.each(MATRIX)(
  "%s while a request is %s: every request ends cleanly in time, nothing is left",
  async (fault, stage) => {
    await ensureProcesses(stage);
    const tag = `${fault} ${stage} ${serial}`.replace(/[^a-z0-9 ]/g, "");
    const calls = await reach(stage, tag);
    const target = fault.endsWith("prefill") ? prefill! : fault.endsWith("decode") ? decode! : undefined;
    const faultAt = performance.now();
    if (fault.startsWith("kill")) await target!.p.kill();
    else if (fault.startsWith("stop")) target!.p.child.kill("SIGSTOP");
    else {
      await db.shutDown();
      setTimeout(() => void db.startUp(), OUTAGE_MS);
    }
    const clientHit = fault.endsWith("decode");
    if (fault === "stop decode") for (const c of calls) c.deadlineIn(CLIENT_DEADLINE_AFTER_FREEZE_MS);
    const outcomes = await Promise.all(calls.map((c) => c.done));
    summary.push(
      `${fault.padEnd(13)} ${stage.padEnd(10)} ${outcomes.map((o) => `${o.kind}${"code" in o ? ` ${o.code}` : ""} (${Math.round(o.ms)} ms)`).join(", ")}`,
    );
    for (const o of outcomes) {
      if (clientHit) {
        // Nothing can answer: a killed decode's connection ends at once, a frozen one meets the client's deadline.
        expect(o.kind).toBe(fault === "kill decode" ? "connection ended" : "client deadline");
        expect(performance.now() - faultAt).toBeLessThan(CLIENT_DEADLINE_AFTER_FREEZE_MS + 5_000);
      } else {
        expect(["result", "error status", "error event"], JSON.stringify(o)).toContain(o.kind);
        expect(o.ms).toBeLessThan(SERVICE_DEADLINE_MS);
        if (o.kind === "error status") expect(o.status).toBeGreaterThanOrEqual(400);
      }
    }

    // Recovery: a killed process is replaced under another id; a stopped one is resumed and rejoins.
    if (fault.startsWith("kill")) {
      if (fault === "kill prefill") prefill = await startPrefill(false);
      else decode = await startDecode(false);
    } else if (fault.startsWith("stop")) {
      target!.p.child.kill("SIGCONT");
      target!.armed = false;
    } else {
      await until(
        "PostgreSQL is back",
        async () =>
          reconnectSql().then(
            () => true,
            () => false,
          ),
        30_000,
      );
    }
    for (const p of [prefill!, decode!]) if (p.armed && p.p.log().includes('"msg":"fault point reached"')) p.armed = false;
    await until("both services are ready again", async () => (await ready(prefill!.p)) && (await ready(decode!.p)), 30_000);
    await expectNothingLeft(`${fault} / ${stage}`);
    // And the pair serves again.
    const after = await complete(decode!.p.url, SHORT(`${tag} after`), 4).done;
    expect(after.kind, JSON.stringify(after)).toBe("result");
    await expectNothingLeft(`${fault} / ${stage}, after a request`);
  },
  240_000,
);
