// The planner's four quantities measured on this machine with the engine, for a prompt of n
// tokens and `out` generated tokens:
//   prefill      — n tokens into a fresh sequence in 512-token micro-batches (as the prefill
//                  service does), the engine's threads; best of `reps`;
//   decode       — ms per step at context n: batch 1 (median of 24 greedy steps) and batch 8
//                  (the prefilled KV copied into 7 more sequences; median of 12 steps);
//   memory       — resident memory (VmRSS) of the loaded model and of sequences of capacity
//                  n + out with every KV page written, and how many such sequences fit a budget
//                  (memory-fit.ts, in a fresh process);
//   KV handoff   — through the services as deployed: `ctxbank prefill` + a `ctxbank decode` per
//                  transport (shm, http) on a PostgreSQL 15; POST /v1/prefill, then /v1/decode of
//                  the handle, whose answer reports the KV load's time and bytes.
import { execFile } from "node:child_process";
import { join, resolve } from "node:path";
import { promisify } from "node:util";
import { mkdtemp, rm } from "node:fs/promises";
import { Engine, loadModel, type NativeSequence } from "../../shared/inference/engine/engine.ts";
import { argmax } from "../../shared/inference/engine/sampler.ts";
import { GgufTokenizer } from "../../shared/inference/tokenizer/tokenizer.ts";
import { startPostgres } from "../lib/postgres.ts";
import { startService, type ServiceProcess } from "../lib/services.ts";
import { benchText } from "../lib/bench-text.ts";
import { reniceProcess } from "../loadgen/deployments.ts";

const run = promisify(execFile);

const median = (xs: number[]) => {
  const s = [...xs].sort((a, b) => a - b);
  return s.length % 2 ? s[(s.length - 1) / 2]! : (s[s.length / 2 - 1]! + s[s.length / 2]!) / 2;
};

export function promptIds(modelPath: string, n: number): number[] {
  const tok = GgufTokenizer.fromGguf(modelPath);
  const ids = tok.encode(benchText(Math.ceil(n / 400) + 2));
  if (ids.length < n) throw new Error(`bench text gives only ${ids.length} tokens`);
  return ids.slice(0, n);
}

export interface EngineMeasurement {
  tokens: number;
  out: number;
  prefillS: number[];
  decodeStepMs: { batch1: number; batch8: number };
}

export interface MemoryMeasurement {
  rssBeforeLoad: number;
  rssAfterLoad: number;
  /** RSS growth from loading the model and one warm-up forward. */
  modelBytes: number;
  budget: number;
  fits: Array<{ tokens: number; fit: number; bytesPerSequence: number }>;
}

/** memory-fit.ts in a fresh process (see there). */
export async function measureMemory(modelPath: string, threads: number, budgetBytes: number, tokens: number[]): Promise<MemoryMeasurement> {
  const { stdout } = await run(
    process.execPath,
    ["--import", "tsx", join(import.meta.dirname, "memory-fit.ts"), modelPath, String(threads), String(budgetBytes), ...tokens.map(String)],
    {
      cwd: resolve(import.meta.dirname, "../.."),
      maxBuffer: 1 << 20,
    },
  );
  return JSON.parse(stdout.trim().split("\n").pop()!) as MemoryMeasurement;
}

export class EngineBench {
  private constructor(readonly engine: Engine) {}

  static async open(modelPath: string, threads: number): Promise<EngineBench> {
    const engine = new Engine(await loadModel(modelPath), { threads });
    const warm = engine.createSequence(16);
    await engine.prefill(warm, promptIds(modelPath, 16));
    warm.release();
    return new EngineBench(engine);
  }

  private async prefill(ids: number[], capacity: number): Promise<{ seq: NativeSequence; s: number; logits: Float32Array }> {
    const seq = this.engine.createSequence(capacity);
    const t0 = performance.now();
    let logits!: Float32Array;
    for (let i = 0; i < ids.length; i += 512) logits = await this.engine.prefill(seq, ids.slice(i, i + 512));
    return { seq, s: (performance.now() - t0) / 1000, logits };
  }

  async measure(ids: number[], out: number, reps: number): Promise<EngineMeasurement> {
    const n = ids.length;
    const capacity = n + out + 32;
    const prefillS: number[] = [];
    let kept: { seq: NativeSequence; logits: Float32Array } | undefined;
    for (let r = 0; r < reps; r++) {
      const p = await this.prefill(ids, capacity);
      prefillS.push(p.s);
      if (kept) p.seq.release();
      else kept = p;
    }
    const src = kept!.seq;
    let token = argmax(kept!.logits);
    const steps1: number[] = [];
    for (let i = 0; i < 24; i++) {
      const t0 = performance.now();
      const [logits] = await this.engine.decode([src], [token]);
      steps1.push(performance.now() - t0);
      token = argmax(logits!);
    }
    // Batch 8: the same KV in 7 more sequences of the same capacity (same layout, byte copy).
    const clones = Array.from({ length: 7 }, () => {
      const s = this.engine.createSequence(capacity);
      new Uint8Array(s.kvBuffer()).set(new Uint8Array(src.kvBuffer()));
      s.setLength(src.nPast);
      return s;
    });
    const seqs = [src, ...clones];
    let tokens = seqs.map(() => token);
    const steps8: number[] = [];
    for (let i = 0; i < 12; i++) {
      const t0 = performance.now();
      const logits = await this.engine.decode(seqs, tokens);
      steps8.push(performance.now() - t0);
      tokens = logits.map((l) => argmax(l));
    }
    for (const s of seqs) s.release();
    return { tokens: n, out, prefillS, decodeStepMs: { batch1: median(steps1), batch8: median(steps8) } };
  }
}

export interface HandoffMeasurement {
  tokens: number;
  transport: "shm" | "http";
  bytes: number;
  chunks: number;
  ms: number;
  prefillMs: number;
}

/** KV handoff per prompt length and transport, through the deployed services. */
export async function measureHandoff(
  modelPath: string,
  lengths: number[],
  o: { nice?: number; prefillThreads: number },
): Promise<HandoffMeasurement[]> {
  const pg = await startPostgres("ctxbank_planner");
  const shardDir = await mkdtemp("/dev/shm/ctxbank-planner-");
  const procs: ServiceProcess[] = [];
  try {
    const db = ["--database-url", pg.url, "--shard-dir", shardDir];
    const prefill = await startService("prefill", [...db, "--threads", String(o.prefillThreads), "--instance-id", "planner-prefill"]);
    procs.push(prefill);
    const decoders = {
      shm: await startService("decode", [...db, "--threads", "1", "--transport", "shm", "--instance-id", "planner-decode-shm"]),
      http: await startService("decode", [...db, "--threads", "1", "--transport", "http", "--instance-id", "planner-decode-http"]),
    };
    procs.push(decoders.shm, decoders.http);
    if (o.nice !== undefined) for (const p of procs) reniceProcess(p.child.pid, o.nice);
    const post = async (url: string, body: unknown) => {
      const res = await fetch(url, { method: "POST", headers: { "content-type": "application/json" }, body: JSON.stringify(body) });
      // biome-ignore lint/suspicious/noExplicitAny: the services' answers, read field by field below and checked by what uses them
      const j = (await res.json()) as any;
      if (!res.ok) throw new Error(`${url}: ${res.status} ${JSON.stringify(j)}`);
      return j;
    };
    const out: HandoffMeasurement[] = [];
    // Warm-up through both decoders (connections, JIT, first imports).
    for (const t of ["shm", "http"] as const) {
      const h = await post(`${prefill.url}/v1/prefill`, { prompt_token_ids: promptIds(modelPath, 64), max_tokens: 2 });
      await post(`${decoders[t].url}/v1/decode`, { handle: h, max_tokens: 2 });
    }
    for (const n of lengths) {
      const ids = promptIds(modelPath, n);
      for (const t of ["shm", "http"] as const) {
        const handle = await post(`${prefill.url}/v1/prefill`, { prompt_token_ids: ids, max_tokens: 2 });
        // max_tokens 2: the first token comes with the handle, the second is the first that needs the KV.
        const res = await post(`${decoders[t].url}/v1/decode`, { handle, max_tokens: 2 });
        if (res.kv.transport !== t) throw new Error(`expected a ${t} load, got ${res.kv.transport}`);
        out.push({ tokens: n, transport: t, bytes: res.kv.bytes, chunks: res.kv.chunks, ms: res.kv.ms, prefillMs: handle.prefill_ms });
      }
    }
    return out;
  } finally {
    await Promise.all(procs.map((p) => p.stop()));
    await pg.stop();
    await rm(shardDir, { recursive: true, force: true });
  }
}
