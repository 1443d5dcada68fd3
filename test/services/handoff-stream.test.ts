// The streamed handle, with the services as separate processes over PostgreSQL 15: decode loads
// chunks while the prefill is still computing (shown by the order of events, a fault point
// holding the prefill before its last block), gives the greedy tokens one process gives, with
// or without streaming; a chunk corrupted mid-stream is a fast 502; a prefill killed mid-stream
// is a fast 502, or a local recompute when asked, and frees everything the decode held.
import { open } from "node:fs/promises";
import pg from "pg";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { Engine, loadModel } from "../../shared/inference/engine/engine.ts";
import { generate } from "../../shared/inference/generate.ts";
import { resolveModel } from "../../shared/inference/model/resolve.ts";
import { GgufTokenizer } from "../../shared/inference/tokenizer/tokenizer.ts";
import { chunkHeaderSize } from "../../services/handoff/format/chunk.ts";
import { startPostgres, type TestPostgres } from "../../tools/lib/postgres.ts";
import { startService, tempShardDir, TEST_INTERNAL_SECRET, until, type ServiceProcess } from "../../tools/lib/services.ts";
import { postJson } from "../harness/http.ts";
import { argmax } from "../../tools/lib/logits.ts";
import { clusterArgs } from "../harness/serve.ts";

let pgServer: TestPostgres;
let db: pg.Client;
let shards: Awaited<ReturnType<typeof tempShardDir>>;
let prefill: ServiceProcess;
let viaShm: ServiceProcess;
let viaHttp: ServiceProcess;
let unstreamed: ServiceProcess;
let pausedLoad: ServiceProcess;
const extra: ServiceProcess[] = [];
let engine: Engine;
let tok: GgufTokenizer;

const common = () => clusterArgs({ databaseUrl: pgServer.url, shardDir: shards.dir, heartbeat: { everyMs: 500, timeoutMs: 3000 } });
const startPrefill = (id: string, pauseMs: number) =>
  startService("prefill", [...common(), "--block-tokens", "64", "--instance-id", id], { CTXBANK_FAULT_PAUSE: `prefill.last:${pauseMs}` });
// Four 64-token blocks or so: several chunks stream before the last one.
const LONG = "In a quiet village by the sea, the fishermen rose before dawn to mend their nets, and the gulls followed them out. ".repeat(
  9,
);

async function colocated(ids: number[], maxTokens: number): Promise<string> {
  const out: number[] = [];
  for await (const ev of generate(engine, tok, ids, { maxTokens, temperature: 0 })) if (ev.type === "token") out.push(ev.id);
  return tok.decode(out.filter((id) => !tok.isEog(id)));
}

/** KV bytes a decode process has read over `transport` (its Prometheus counter). */
async function transferred(p: ServiceProcess, transport: string): Promise<number> {
  const text = await (await fetch(`${p.url}/metrics`)).text();
  const line = text.split("\n").find((l) => l.startsWith("ctxbank:kv_transfer_bytes_total{") && l.includes(`transport="${transport}"`));
  return line ? Number(line.split(" ").at(-1)) : 0;
}

async function decodeStatus(p: ServiceProcess): Promise<{ admitted: number; live_sequences: number; kv_reserved_bytes: number }> {
  const res = await fetch(`${p.internalUrl}/v1/decode/status`, { headers: { authorization: `Bearer ${TEST_INTERNAL_SECRET}` } });
  return (await res.json()) as never;
}

const complete = (p: ServiceProcess, body: object) => postJson(`${p.url}/v1/completions`, { model: "default", temperature: 0, ...body });

beforeAll(async () => {
  [pgServer, shards] = await Promise.all([startPostgres(), tempShardDir()]);
  db = new pg.Client({ connectionString: pgServer.url });
  await db.connect();
  prefill = await startPrefill("prefill-a", 4_000);
  [viaShm, viaHttp, unstreamed, pausedLoad] = await Promise.all([
    startService("decode", [...common(), "--transport", "shm", "--instance-id", "decode-shm"]),
    startService("decode", [...common(), "--transport", "http", "--instance-id", "decode-http"]),
    startService("decode", [...common(), "--transport", "shm", "--kv-streaming", "false", "--instance-id", "decode-unstreamed"]),
    startService("decode", [...common(), "--transport", "shm", "--instance-id", "decode-paused"], {
      CTXBANK_FAULT_PAUSE: "decode.load:4000",
    }),
  ]);
  const path = await resolveModel();
  engine = new Engine(await loadModel(path), { threads: 1 });
  tok = GgufTokenizer.fromGguf(path);
}, 180_000);

afterAll(async () => {
  await Promise.all([viaShm, viaHttp, unstreamed, pausedLoad, prefill, ...extra].map((p) => p?.stop()));
  await db?.end();
  await pgServer?.stop();
  await shards?.remove();
});

describe("the streamed handle between processes over PostgreSQL 15", () => {
  it("decode imports the first chunks while the prefill has not finished", async () => {
    const ids = tok.encode(LONG);
    expect(ids.length).toBeGreaterThan(3 * 64);
    const answer = complete(viaShm, { prompt: ids, max_tokens: 6 });
    // The prefill is held before writing its last block; the decode must have read before that.
    await until("the decode read KV", async () => (await transferred(viaShm, "shm")) > 0, 30_000);
    const open_ = await db.query("select id from requests where prefill_start_at is not null and prefill_end_at is null");
    expect(open_.rows).toHaveLength(1);
    expect(prefill.log()).toContain("fault point reached");
    expect(prefill.log()).not.toMatch(/"msg":"prefilled"/);
    const done = await answer;
    expect(done.status, JSON.stringify(done.body)).toBe(200);
    expect(prefill.log()).toMatch(/"msg":"prefilled"/);
    expect(done.body.choices[0].text).toBe(await colocated(ids, 6));
  });

  it("gives the greedy tokens of one process, streamed over shm and http and not streamed", async () => {
    for (const prompt of ["The capital of Italy is", LONG]) {
      const want = await colocated(tok.encode(prompt), 10);
      for (const p of [viaShm, viaHttp, unstreamed]) {
        const res = await complete(p, { prompt, max_tokens: 10 });
        expect(res.status, JSON.stringify(res.body)).toBe(200);
        expect(res.body.choices[0].text, prompt.slice(0, 20)).toBe(want);
      }
    }
    expect(await transferred(viaHttp, "http")).toBeGreaterThan(0);
  });

  it("rounds: the streamed and the unstreamed load read only the picked rounds above the watershed, and decode as one process", async () => {
    const filler = "The fishermen mended their nets while the gulls followed the boats out to sea. ";
    const messages = [
      { role: "user", content: `Remember that the boat is called Marigold. ${filler.repeat(2)}` },
      { role: "assistant", content: "The boat is called Marigold." },
      { role: "user", content: `Describe the harbour. ${filler.repeat(2)}` },
      { role: "assistant", content: "It is small and quiet." },
      { role: "user", content: "What is the boat called?" },
    ];
    const policy = { kind: "rounds", rounds: { watershed_layer: 12, top_k: 1 } };
    // The reference: the prefill's own handle (the prompt's ids and rounds), decoded in one process.
    const handle = (await postJson(`${prefill.url}/v1/prefill`, { messages, policy })).body;
    const starts: number[] = handle.policy.rounds.starts;
    expect(starts).toHaveLength(4); // the system part, two earlier exchanges, the question;
    const seq = engine.createSequence(handle.prompt_tokens + 8);
    seq.setPolicy({ kind: "rounds", rounds: { watershedLayer: 12, starts, topK: 1 } });
    const want: number[] = [];
    for (let logits = await engine.prefill(seq, handle.prompt_token_ids); want.length < 6; ) {
      want.push(argmax(logits));
      if (tok.isEog(want.at(-1)!)) break;
      logits = (await engine.decode([seq], [want.at(-1)!]))[0]!;
    }
    seq.release();
    for (const p of [viaShm, unstreamed]) {
      const res = await postJson(`${p.url}/v1/chat/completions`, { model: "default", messages, policy, max_tokens: 6, temperature: 0 });
      expect(res.status, JSON.stringify(res.body)).toBe(200);
      expect(res.body.choices[0].message.content).toBe(tok.decode(want.filter((id) => !tok.isEog(id))));
      const { bytes, prompt_bytes } = res.body.ctxbank.handoff;
      expect(bytes).toBeGreaterThan(0);
      expect(bytes).toBeLessThan(prompt_bytes);
    }
  });

  it("a chunk corrupted mid-stream: a 502 kv_load_failed, nothing left held", async () => {
    // A prompt of its own (no chunk shared with the other tests through the prefix keys).
    const answer = complete(pausedLoad, { prompt: `Corrupt me. ${LONG}`, max_tokens: 4 });
    // The decode holds a lease on its first chunk and waits before reading it: flip a payload byte
    // of every chunk being read (the other readers may have leased theirs meanwhile).
    await until("the decode leased a chunk", () => pausedLoad.log().includes("fault point reached"), 30_000);
    const { rows } = await db.query(
      "select c.offset, s.path from chunks c join shards s on s.id = c.shard_id and s.epoch = c.shard_epoch where c.state = 'reading' and c.reader_count > 0",
    );
    expect(rows.length).toBeGreaterThan(0);
    for (const row of rows) {
      const fh = await open(row.path, "r+");
      try {
        const at = Number(row.offset) + chunkHeaderSize(30) + 777;
        const b = Buffer.alloc(1);
        await fh.read(b, 0, 1, at);
        b[0]! ^= 0x20;
        await fh.write(b, 0, 1, at);
      } finally {
        await fh.close();
      }
    }
    const res = await answer;
    expect(res.status).toBe(502);
    expect(res.body.error.code).toBe("kv_load_failed");
    expect(res.body.error.message).toMatch(/failed verification/);
    await until("the decode is idle", async () => {
      const s = await decodeStatus(pausedLoad);
      return s.admitted === 0 && s.live_sequences === 0 && s.kv_reserved_bytes === 0;
    });
    const reading = await db.query("select count(*)::int as n from chunks where state = 'reading'");
    expect(reading.rows[0].n).toBe(0);
  });

  it("a prefill killed mid-stream: a fast 502, or a local recompute when asked", async () => {
    await prefill.stop(); // leaves the registry: the next prefill is the only one
    for (const mode of ["fail", "recompute"] as const) {
      const p = await startPrefill(`prefill-${mode}`, 60_000);
      extra.push(p);
      const decode = mode === "fail" ? viaHttp : viaShm;
      const transport = mode === "fail" ? "http" : "shm";
      const before = await transferred(decode, transport);
      const ids = tok.encode(`${LONG} (${mode})`);
      const answer = complete(decode, { prompt: ids, max_tokens: 6, on_kv_failure: mode });
      await until("the prefill holds before its last block", () => p.log().includes("fault point reached"), 30_000);
      await until("the decode read KV", async () => (await transferred(decode, transport)) > before, 30_000);
      await p.kill();
      const res = await answer;
      if (mode === "fail") {
        expect(res.status).toBe(502);
        // Over HTTP the chunks are served by the prefill process itself: its death breaks the
        // prefill call and the chunk reads at once, and whichever the decode notices first names
        // the error (a busy machine decides the race either way).
        expect(["prefill_failed", "kv_load_failed"]).toContain(res.body.error.code);
      } else {
        expect(res.status, JSON.stringify(res.body)).toBe(200);
        expect(res.body.choices[0].text).toBe(await colocated(ids, 6));
      }
      await until("the decode is idle", async () => {
        const s = await decodeStatus(decode);
        return s.admitted === 0 && s.live_sequences === 0 && s.kv_reserved_bytes === 0;
      });
      await new Promise((r) => setTimeout(r, 3_500)); // the registry declares the killed prefill dead
    }
  });
});
