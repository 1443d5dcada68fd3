// The planner's memory measurement, in a process of its own so nothing else's garbage moves the
// numbers: VmRSS before loading the model, after loading it and one warm-up forward, then
// sequences of each requested capacity with every KV page written (what prefill and decode
// write), added until the RSS growth since before the load passes the budget. Prints one JSON line.
//   node --import tsx tools/planner/memory-fit.ts MODEL THREADS BUDGET_BYTES TOKENS...
import { Engine, loadModel, type NativeSequence } from "../../shared/inference/engine/engine.ts";
import { rssBytes } from "./rss.ts";

const [, , modelPath, threadsArg, budgetArg, ...tokenArgs] = process.argv;
const budget = Number(budgetArg);
const rss0 = rssBytes();
const engine = new Engine(await loadModel(modelPath!), { threads: Number(threadsArg) });
const warm = engine.createSequence(16);
await engine.prefill(
  warm,
  Array.from({ length: 16 }, (_, i) => 100 + i),
);
warm.release();
const rss1 = rssBytes();
const median = (xs: number[]) => [...xs].sort((a, b) => a - b)[xs.length >> 1] ?? Number.NaN;
const fits = tokenArgs.map(Number).map((tokens) => {
  const held: NativeSequence[] = [];
  const deltas: number[] = [];
  for (;;) {
    const before = rssBytes();
    const s = engine.createSequence(tokens);
    new Uint8Array(s.kvBuffer()).fill(1);
    s.setLength(tokens);
    const after = rssBytes();
    if (after - rss0 > budget) {
      s.release();
      break;
    }
    held.push(s);
    deltas.push(after - before);
    if (held.length > 100_000) throw new Error("memory fit did not stop");
  }
  for (const s of held) s.release();
  return { tokens, fit: held.length, bytesPerSequence: median(deltas) };
});
process.stdout.write(JSON.stringify({ rssBeforeLoad: rss0, rssAfterLoad: rss1, modelBytes: rss1 - rss0, budget, fits }) + "\n");
process.exit(0);
