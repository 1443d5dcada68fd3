// The colocated reference for bench/handoff, run as its own process (started and niced like the
// service processes, so neither side inherits the other's state): loads the model, prefills the
// token ids in the file given as argv[2] exactly as the prefill service does (a sequence of
// capacity n, 512-token micro-batches; argv[3] engine threads, argv[4] the engine's context) and
// samples the first token greedily. Prints one JSON line:
// { "ttftMs": …, "firstToken": … }. The load and a short warm-up prefill are not timed.
import { readFileSync } from "node:fs";
import { Engine, loadModel } from "../../shared/inference/engine/engine.ts";
import { argmax } from "../../shared/inference/engine/sampler.ts";
import { resolveModel } from "../../shared/inference/model/resolve.ts";

const [, , idsFile, threadsArg, maxContextArg] = process.argv;
const ids = JSON.parse(readFileSync(idsFile!, "utf8")) as number[];
const engine = new Engine(await loadModel(await resolveModel()), {
  threads: Number(threadsArg ?? 2),
  maxContext: maxContextArg === undefined ? undefined : Number(maxContextArg),
});
// Warm up as a long-running service is (first-forward allocations), then let the caller renice
// every thread (the engine's included) before the timed part.
const warm = engine.createSequence(16);
await engine.prefill(warm, ids.slice(0, 16));
warm.release();
process.stdout.write("loaded\n");
await new Promise<void>((resolve) => process.stdin.once("data", () => resolve()));
const t0 = performance.now();
const seq = engine.createSequence(ids.length);
let logits!: Float32Array;
for (let i = 0; i < ids.length; i += 512) logits = await engine.prefill(seq, ids.slice(i, i + 512));
const firstToken = argmax(logits);
const ttftMs = performance.now() - t0;
seq.release();
process.stdout.write(JSON.stringify({ ttftMs, firstToken }) + "\n");
process.exit(0);
