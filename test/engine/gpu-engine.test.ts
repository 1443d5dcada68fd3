// The CUDA engine on the real model against the CPU engine, through the same TS API the services
// use. Skipped, with the reason, where no GPU is usable (CI). Not yet run on a GPU: that needs Node
// and the real weights on the GPU machine (bench/gpu/README.md). Needs the real weights:
// $CTXBANK_MODEL, else the default model.
// Writes its measured figures to $CTXBANK_GPU_RESULTS/gpu-engine.json when that is set.
import { mkdir, writeFile } from "node:fs/promises";
import { join } from "node:path";
import OpenAI from "openai";
import { afterAll, beforeAll, describe, expect, it } from "vitest";

import { Engine, loadModel, type LoadedModel } from "../../shared/inference/engine/engine.ts";
import { cudaStatus } from "../../shared/inference/engine/native.ts";
import { resolveModel } from "../../shared/inference/model/resolve.ts";
import { chunkByteLength, chunkHeaderSize, type ChunkMeta } from "../../services/handoff/format/chunk.ts";
import { exportChunk, importVerifiedChunk, kvShape } from "../../services/handoff/format/seq-io.ts";

const status = cudaStatus();
const gpu = status.usable;
const why = gpu ? "" : `no usable GPU (${status.code}: ${status.message})`;
if (!gpu) console.log(`test/engine/gpu-engine.test.ts skipped: ${why}`);

const results: Record<string, unknown> = {};
let model: LoadedModel;
let cpu: Engine;
let cuda: Engine;

beforeAll(async () => {
  if (!gpu) return;
  model = await loadModel(process.env.CTXBANK_MODEL || (await resolveModel()));
  cpu = new Engine(model, { threads: 4, maxContext: 8192 });
  cuda = new Engine(model, { device: "cuda", maxContext: 8192 });
}, 120_000);

afterAll(async () => {
  const dir = process.env.CTXBANK_GPU_RESULTS;
  if (gpu && dir) {
    await mkdir(dir, { recursive: true });
    await writeFile(join(dir, "gpu-engine.json"), JSON.stringify({ device: cuda?.native.info.deviceDescription, ...results }, null, 2));
  }
});

const prompt = (n: number, seed: number, vocab: number) => Array.from({ length: n }, (_, i) => (i * 7919 + seed * 104729 + 17) % vocab);
const maxAbsDiff = (a: Float32Array, b: Float32Array) => a.reduce((m, x, i) => Math.max(m, Math.abs(x - b[i]!)), 0);
const argmax = (a: Float32Array) => a.reduce((best, x, i) => (x > a[best]! ? i : best), 0);
/** The GPU's top token is the CPU's, or the CPU scores it within `tol` of its own best (a near-tie). */
const sameTopWithin = (cpuLogits: Float32Array, gpuLogits: Float32Array, tol: number) =>
  cpuLogits[argmax(cpuLogits)]! - cpuLogits[argmax(gpuLogits)]! <= tol;

describe.skipIf(!gpu)("CUDA engine vs CPU engine, real model", () => {
  it("logits after prompts of 1, 100 and 1000 tokens", async () => {
    const diffs: Record<string, number> = {};
    for (const n of [1, 100, 1000]) {
      const ids = prompt(n, n, model.config.nVocab);
      const a = await cpu.prefill(cpu.createSequence(2048), ids);
      const b = await cuda.prefill(cuda.createSequence(2048), ids);
      const range = a.reduce((m, x) => Math.max(m, Math.abs(x)), 0);
      diffs[`prompt${n}`] = maxAbsDiff(a, b);
      expect(maxAbsDiff(a, b), `prompt of ${n}`).toBeLessThanOrEqual(0.02 * range);
      expect(sameTopWithin(a, b, 0.02 * range), `top token after a prompt of ${n}`).toBe(true);
    }
    results.maxAbsDeltaLogit = diffs;
  }, 300_000);

  it("greedy tokens agree over 256 steps", async () => {
    // Teacher-forced: both engines are fed the CPU's greedy continuation, and at every step the
    // GPU's greedy pick is compared with the CPU's (a free-running comparison would count every
    // step after one near-tie flip as a disagreement).
    const ids = prompt(64, 3, model.config.nVocab);
    const c = cpu.createSequence(1024);
    const g = cuda.createSequence(1024);
    let lc = await cpu.prefill(c, ids);
    let lg = await cuda.prefill(g, ids);
    let agree = 0;
    let firstDiff = -1;
    let worst = 0;
    for (let i = 0; i < 256; i++) {
      const next = argmax(lc);
      if (argmax(lg) === next) agree++;
      else if (firstDiff < 0) firstDiff = i;
      worst = Math.max(worst, maxAbsDiff(lc, lg));
      lc = (await cpu.decode([c], [next]))[0]!;
      lg = (await cuda.decode([g], [next]))[0]!;
    }
    results.greedy256 = { agree, firstDisagreement: firstDiff, maxAbsDeltaLogit: worst };
    expect(agree).toBeGreaterThanOrEqual(250);
  }, 600_000);

  it("the GPU greedy token equals the argmax of the GPU logits, without copying logits", async () => {
    const seq = cuda.createSequence(256);
    const logits = new Float32Array(model.config.nVocab);
    const best = new Int32Array(1);
    await cuda.native.forward([{ seq, tokens: Int32Array.from(prompt(50, 5, model.config.nVocab)), logits, argmax: best }]);
    expect(best[0]).toBe(argmax(logits));
    const only = new Int32Array(1);
    await cuda.native.forward([{ seq, tokens: Int32Array.of(best[0]!), argmax: only }]);
    expect(only[0]).toBeGreaterThanOrEqual(0);
  });

  it("KV rows exported from a CPU sequence decode the same on a GPU sequence, and back", async () => {
    const ids = prompt(300, 9, model.config.nVocab);
    const layers = Array.from({ length: model.config.nLayer }, (_, l) => l);
    const c = cpu.createSequence(1024);
    await cpu.prefill(c, ids);
    const payload = new Uint8Array(300 * layers.length * 2 * model.config.nHeadKv * model.config.headDim * 2);
    c.exportRows(payload, layers, 0, 300);
    const g = cuda.createSequence(1024);
    expect(() => g.kvBuffer()).toThrow(/GPU memory/);
    g.importRows(payload, layers, 0, 300);
    g.setLength(300);
    const [a] = await cpu.decode([c], [42]);
    const [b] = await cuda.decode([g], [42]);
    expect(maxAbsDiff(a!, b!)).toBeLessThanOrEqual(0.02 * a!.reduce((m, x) => Math.max(m, Math.abs(x)), 0));
    // GPU -> CPU: the imported rows come back bit for bit.
    const back = new Uint8Array(payload.length);
    g.exportRows(back, layers, 0, 300);
    expect(Buffer.compare(Buffer.from(back), Buffer.from(payload))).toBe(0);
  }, 120_000);

  it("a verified chunk import reaches a GPU sequence; a corrupt chunk's rows are not uploaded", () => {
    const shape = kvShape(model.config);
    const layers = Array.from({ length: model.config.nLayer }, (_, l) => l);
    const meta: ChunkMeta = {
      fingerprint: "ef".repeat(32),
      dtype: "f16",
      layerIds: layers,
      hkv: shape.hkv,
      headDim: shape.headDim,
      tokenStart: 0,
      tokenCount: 64,
    };
    const c = cpu.createSequence(128);
    const cache = new Uint16Array(c.kvBuffer());
    for (let i = 0; i < cache.length; i++) cache[i] = (i * 40503) & 0x3fff; // finite f16 values
    const chunk = new Uint8Array(chunkByteLength(meta));
    exportChunk(chunk, meta, c, shape);
    const payload = chunk.subarray(chunkHeaderSize(layers.length));
    const back = new Uint8Array(payload.length);
    const good = cuda.createSequence(128);
    importVerifiedChunk(chunk, { fingerprint: meta.fingerprint }, good, shape);
    good.exportRows(back, layers, 0, 64);
    expect(Buffer.compare(Buffer.from(back), Buffer.from(payload))).toBe(0);
    const corrupt = chunk.slice();
    corrupt[corrupt.length - 1]! ^= 0x01;
    const bad = cuda.createSequence(128);
    expect(() => importVerifiedChunk(corrupt, {}, bad, shape)).toThrow(/checksum/);
    bad.exportRows(back, layers, 0, 64); // what the device holds
    expect(Buffer.compare(Buffer.from(back), Buffer.from(corrupt.subarray(chunkHeaderSize(layers.length))))).not.toBe(0);
    for (const s of [c, good, bad]) s.release();
  });

  it("reports the device and its memory", () => {
    expect(cuda.device).toBe("cuda:0");
    expect(cuda.native.info.deviceWeightBytes).toBeGreaterThan(50e6);
    results.deviceWeightBytes = cuda.native.info.deviceWeightBytes;
  });
});

describe.skipIf(!gpu)("serve --device cuda", () => {
  it("chats through the official openai client, and says it runs on cuda:0", async () => {
    const { startServe } = await import("../harness/serve.ts");
    const s = await startServe({ device: "cuda", threads: 2 });
    try {
      const client = new OpenAI({ baseURL: `${s.url}/v1`, apiKey: "not-needed", maxRetries: 0 });
      const models = await client.models.list();
      expect((models.data[0] as unknown as { device: string }).device).toBe("cuda:0");
      const r = await client.chat.completions.create({
        model: models.data[0]!.id,
        messages: [{ role: "user", content: "Say hello." }],
        max_tokens: 16,
        temperature: 0,
      });
      expect(r.choices[0]!.message.content).toMatch(/\S/);
      expect(await (await fetch(`${s.url}/metrics`)).text()).toContain('device="cuda:0"} 1');
      results.serveChat = r.choices[0]!.message.content;
    } finally {
      await s.stop();
    }
  }, 300_000);
});

it.skipIf(gpu)(`GPU tests skipped: ${why || "a GPU is usable"}`, () => {
  expect(gpu).toBe(false);
});
