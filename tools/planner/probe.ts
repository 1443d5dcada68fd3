// Short probes of this machine for the planner's hardware inputs. What each one measures:
//   flops   — a timed engine prefill of a 512-token prompt (one micro-batch, the engine's threads,
//             best of 5 after a warm-up): the planner's prefill FLOPs of 512 tokens / its time.
//             So it is the engine's sustained matrix-product rate, attention at 512 included.
//   memBw   — read bandwidth of one thread: Buffer.compare of two equal 256 MiB buffers (memcmp
//             reads both: 512 MiB) — a decode step is one thread reading weights and KV.
//   copyBw  — a 256 MiB Buffer.copy (memcpy; reported as bytes copied / s, reads + writes = 2x).
//   shmBw   — reading a 256 MiB file on /dev/shm into a buffer (fs.readSync: one kernel copy
//             from tmpfs pages), the host-memory "link" of a same-host KV handoff.
//   tcpBw   — 256 MiB over a loopback TCP connection, sent by a worker thread, received by this
//             one (best of 3), the link of an HTTP handoff.
//   flops1  — the same prefill probe with one thread: the rate a decode step (one thread) computes at.
import { closeSync, mkdtempSync, openSync, readSync, rmSync, writeFileSync } from "node:fs";
import net from "node:net";
import os from "node:os";
import { Worker } from "node:worker_threads";
import { join } from "node:path";
import { Engine, loadModel } from "../../shared/inference/engine/engine.ts";
import { benchText } from "../lib/bench-text.ts";
import { GgufTokenizer } from "../../shared/inference/tokenizer/tokenizer.ts";
import { prefillFlops } from "./costs.ts";
import type { ModelFacts } from "./model.ts";

const MiB = 2 ** 20;

function best(reps: number, f: () => number): number {
  let b = Infinity;
  for (let i = 0; i < reps; i++) b = Math.min(b, f());
  return b;
}

function timeMs(f: () => void): number {
  const t0 = performance.now();
  f();
  return performance.now() - t0;
}

export function probeMemory(bytes = 256 * MiB): { readBw: number; copyBw: number } {
  const a = Buffer.alloc(bytes, 7);
  const b = Buffer.alloc(bytes, 7);
  a.copy(b); // fault every page in first
  const readMs = best(3, () => timeMs(() => void Buffer.compare(a, b)));
  const copyMs = best(3, () => timeMs(() => void a.copy(b)));
  return { readBw: (2 * bytes) / (readMs / 1000), copyBw: bytes / (copyMs / 1000) };
}

export function probeShm(bytes = 256 * MiB): number {
  const dir = mkdtempSync(join(os.platform() === "linux" ? "/dev/shm" : os.tmpdir(), "ctxbank-probe-"));
  const file = join(dir, "probe.bin");
  try {
    writeFileSync(file, Buffer.alloc(bytes, 3));
    const into = Buffer.alloc(bytes);
    const ms = best(3, () =>
      timeMs(() => {
        const fd = openSync(file, "r");
        let off = 0;
        while (off < bytes) off += readSync(fd, into, off, Math.min(16 * MiB, bytes - off), off);
        closeSync(fd);
      }),
    );
    return bytes / (ms / 1000);
  } finally {
    rmSync(dir, { recursive: true, force: true });
  }
}

export async function probeTcp(bytes = 256 * MiB): Promise<number> {
  // The sender runs in a worker thread (its own event loop and core), as an owner process would.
  const sender = `
    const net = require("node:net"); const { parentPort, workerData } = require("node:worker_threads");
    const chunk = Buffer.alloc(4 << 20, 5);
    const server = net.createServer((sock) => {
      let sent = 0;
      const pump = () => { while (sent < workerData) { sent += chunk.length; if (!sock.write(chunk)) return void sock.once("drain", pump); } sock.end(); };
      pump();
    });
    server.listen(0, "127.0.0.1", () => parentPort.postMessage(server.address().port));
    parentPort.on("message", () => server.close(() => process.exit(0)));`;
  const worker = new Worker(sender, { eval: true, workerData: bytes });
  const port = await new Promise<number>((r) => worker.once("message", r));
  const once = () =>
    new Promise<number>((resolve, reject) => {
      const t0 = performance.now();
      let got = 0;
      const c = net.connect(port, "127.0.0.1");
      c.on("data", (d: Buffer) => (got += d.length));
      c.on("end", () => resolve(got / ((performance.now() - t0) / 1000)));
      c.on("error", reject);
    });
  try {
    let b = 0;
    for (let i = 0; i < 3; i++) b = Math.max(b, await once());
    return b;
  } finally {
    worker.postMessage("stop");
    await new Promise((r) => worker.once("exit", r));
  }
}

/** Engine prefill of 512 tokens with `threads` threads: FLOP/s by the planner's own FLOP count. */
export async function probeFlops(
  modelPath: string,
  facts: ModelFacts,
  threads: number,
  tokens = 512,
): Promise<{ flops: number; seconds: number; tokens: number }> {
  const tok = GgufTokenizer.fromGguf(modelPath);
  const ids = tok.encode(benchText(4)).slice(0, tokens);
  if (ids.length < tokens) throw new Error("probe text too short");
  const engine = new Engine(await loadModel(modelPath), { threads });
  const run = async () => {
    const seq = engine.createSequence(tokens);
    const t0 = performance.now();
    await engine.prefill(seq, ids);
    const s = (performance.now() - t0) / 1000;
    seq.release();
    return s;
  };
  await run(); // warm-up: first-forward allocations
  let s = Infinity;
  for (let i = 0; i < 5; i++) s = Math.min(s, await run());
  return { flops: prefillFlops(facts, tokens) / s, seconds: s, tokens };
}

export interface ProbeResult {
  flops: number;
  flopsProbe: { seconds: number; tokens: number; threads: number };
  /** One thread (decode steps run on one). */
  flops1: number;
  memReadBw: number;
  memCopyBw: number;
  shmBw: number;
  tcpBw: number;
  memBytes: number;
}

export async function probeAll(modelPath: string, facts: ModelFacts, threads: number): Promise<ProbeResult> {
  const mem = probeMemory();
  const shmBw = probeShm();
  const tcpBw = await probeTcp();
  const f = await probeFlops(modelPath, facts, threads);
  const f1 = threads === 1 ? f : await probeFlops(modelPath, facts, 1);
  return {
    flops: f.flops,
    flopsProbe: { seconds: f.seconds, tokens: f.tokens, threads },
    flops1: f1.flops,
    memReadBw: mem.readBw,
    memCopyBw: mem.copyBw,
    shmBw,
    tcpBw,
    memBytes: os.totalmem(),
  };
}
