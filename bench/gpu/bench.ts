// tsx bench/gpu/bench.ts --model PATH --out FILE [--device cuda] [--quick]
//
// Our engine on a GPU, the figures issue 11 compares with llama.cpp's CUDA build:
// - batch-1 decode ms/token at contexts 0, 4K, 8K, 32K, 128K (the KV past the prompt is declared
//   with setLength, i.e. zeros: speed only, as llama-bench's -d does with its own filler);
// - prefill tokens/s of one 512- and one 8192-token prompt;
// - aggregate decode tokens/s at batch 1, 8, 32, 128, each sequence holding a 4K context.
// Decode steps ask only for the greedy token (argmax on the GPU, no logits copied back), as a
// serving loop with greedy sampling would; decode is measured without and with CUDA graphs
// (cudaGraphs). Each point: a warm-up, then the median of 3 timed runs.
import { writeFile } from "node:fs/promises";
import { parseArgs } from "node:util";

import { Engine, loadModel } from "../../shared/inference/engine/engine.ts";
import type { EngineDevice, NativeSequence } from "../../shared/inference/engine/native.ts";

const { values: a } = parseArgs({
  options: { model: { type: "string" }, out: { type: "string" }, device: { type: "string", default: "cuda" }, quick: { type: "boolean" } },
});
if (!a.model || !a.out) throw new Error("usage: tsx bench/gpu/bench.ts --model PATH --out FILE [--device cuda] [--quick]");

const model = await loadModel(a.model);
const V = model.config.nVocab;
const contexts = a.quick ? [0, 4096] : [0, 4096, 8192, 32768, 131072];
const maxContext = Math.max(...contexts) + 256;
const median = (xs: number[]) => [...xs].sort((x, y) => x - y)[Math.floor(xs.length / 2)]!;
const ids = (n: number, seed: number) => Int32Array.from({ length: n }, (_, i) => (i * 7919 + seed * 104729 + 17) % V);

async function timed(fn: () => Promise<void>): Promise<number> {
  const t0 = process.hrtime.bigint();
  await fn();
  return Number(process.hrtime.bigint() - t0) / 1e6;
}

// `steps` greedy decode steps for every sequence at once; returns ms per step.
async function decodeSteps(engine: Engine, seqs: NativeSequence[], steps: number): Promise<number> {
  const best = seqs.map(() => Int32Array.of(1));
  const ms = await timed(async () => {
    for (let i = 0; i < steps; i++)
      await engine.native.forward(seqs.map((seq, j) => ({ seq, tokens: Int32Array.of(best[j]![0]! % V), argmax: best[j] })));
  });
  return ms / steps;
}

const results: Record<string, unknown> = { model: a.model, device: a.device, quick: Boolean(a.quick), startedAt: new Date().toISOString() };

// Batch-1 decode at each context, without and with CUDA graphs.
for (const cudaGraphs of [false, true]) {
  const engine = new Engine(model, { device: a.device as EngineDevice, maxContext, ubatch: 512, cudaGraphs });
  results.deviceDescription = engine.native.info.deviceDescription;
  const seq = engine.createSequence(maxContext);
  const points = [];
  for (const ctx of contexts) {
    seq.truncate(0);
    seq.setLength(ctx);
    await decodeSteps(engine, [seq], 8); // warm-up
    const runs = [];
    for (let r = 0; r < 3; r++) runs.push(await decodeSteps(engine, [seq], 64));
    points.push({ context: ctx, msPerToken: median(runs), runs });
    console.log(`decode batch 1 at context ${ctx}${cudaGraphs ? " (graphs)" : ""}: ${median(runs).toFixed(3)} ms/token`);
  }
  results[cudaGraphs ? "decodeBatch1Graphs" : "decodeBatch1"] = points;
  seq.release();
}

// Prefill of one prompt.
{
  const engine = new Engine(model, { device: a.device as EngineDevice, maxContext: 8448, ubatch: 2048 });
  const points = [];
  for (const n of a.quick ? [512] : [512, 8192]) {
    const seq = engine.createSequence(n + 8);
    const tokens = ids(n, 1);
    const run = async () => {
      seq.truncate(0);
      return timed(() => engine.native.forward([{ seq, tokens, argmax: new Int32Array(1) }]));
    };
    await run(); // warm-up
    const runs = [await run(), await run(), await run()];
    points.push({ tokens: n, tokensPerSecond: (n / median(runs)) * 1000, runsMs: runs });
    console.log(`prefill ${n}: ${((n / median(runs)) * 1000).toFixed(0)} tok/s`);
    seq.release();
  }
  results.prefill = points;
}

// Aggregate decode: B sequences, each at a 4K context, decoding together; without and with graphs.
for (const cudaGraphs of [false, true]) {
  const engine = new Engine(model, { device: a.device as EngineDevice, maxContext: 4096 + 256, ubatch: 512, cudaGraphs });
  const points = [];
  for (const b of a.quick ? [1, 8] : [1, 8, 32, 128]) {
    const seqs = Array.from({ length: b }, () => engine.createSequence(4096 + 160));
    const reset = () => seqs.forEach((s) => (s.truncate(0), s.setLength(4096)));
    reset();
    await decodeSteps(engine, seqs, 4); // warm-up
    const runs = [];
    for (let r = 0; r < 3; r++) {
      reset();
      runs.push(await decodeSteps(engine, seqs, 32));
    }
    points.push({ batch: b, tokensPerSecond: (b / median(runs)) * 1000, msPerStep: median(runs), runs });
    console.log(`aggregate decode batch ${b} at 4K${cudaGraphs ? " (graphs)" : ""}: ${((b / median(runs)) * 1000).toFixed(0)} tok/s`);
    seqs.forEach((s) => s.release());
  }
  results[cudaGraphs ? "aggregateDecodeGraphs" : "aggregateDecode"] = points;
}

results.finishedAt = new Date().toISOString();
await writeFile(a.out, JSON.stringify(results, null, 2) + "\n");
console.log(`wrote ${a.out}`);
