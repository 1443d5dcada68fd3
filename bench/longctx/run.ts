// Long-context decode speed, one run, same GGUF and threads: ms/token for our engine under each
// decode policy and for llama.cpp's full attention, at contexts 512..8K built from real text, and
// for ours alone at 16K and 32K with a synthetic KV cache (random values written straight into
// the cache: speed only; past the model's trained 8K context quality is not claimed).
//
//   npm run bench:longctx [-- --steps 32] [--quick]
//   npm run bench:longctx -- --model gemma-3-270m --contexts 8192,30720 --synthetic "" --prefill-threads 2
// (a model trained at 32K: real text at every context; prefill on 2 threads, decode timed on 1)
import { argmax } from "../../shared/inference/engine/sampler.ts";
import { Engine, loadModel } from "../../shared/inference/engine/engine.ts";
import type { NativeSequence } from "../../shared/inference/engine/native.ts";
import { resolveModel } from "../../shared/inference/model/resolve.ts";
import { policyDefaultsFor } from "../../shared/inference/policy/defaults.ts";
import { type FlashAttention, loadLlama, LlamaBackend } from "../engine/engines.ts";
import { benchTokens } from "../../tools/lib/bench-text.ts";
import { benchCli } from "../../tools/lib/bench-runner.ts";
import { fillSyntheticKv } from "../../tools/lib/synthetic-kv.ts";
import { renderChart, type Series } from "../../tools/lib/svg-chart.ts";
import { median } from "../../tools/lib/timing.ts";
import { benchPolicies } from "./policies.ts";

const bench = benchCli({
  name: "longctx",
  script: "npm run bench:longctx --",
  options: {
    steps: { type: "string", default: "32" },
    model: { type: "string" },
    contexts: { type: "string" },
    synthetic: { type: "string" },
    "prefill-threads": { type: "string", default: "1" },
    "llama-fa": { type: "string", default: "auto" },
  },
  help: `  --steps N              greedy decode steps per point (default 32)
  --model NAME|PATH      the model (default: the default model)
  --contexts LIST        contexts of real text (default 512,2048,4096,8159)
  --synthetic LIST       contexts of synthetic KV, ours only (default 16384,32768; "" for none)
  --prefill-threads N    our prefill's threads (decode steps run on 1; llama.cpp runs on 1)
  --llama-fa LIST        llama.cpp's flash attention settings, auto,on,off (default auto); each is
                         run and the faster one is the llama.cpp figure (the peer's best setting)`,
  quick: "contexts 512 and 2048 only",
});
const STEPS = Number(bench.values.steps);
if (!Number.isInteger(STEPS) || STEPS < 4 || STEPS > 512) throw new Error("--steps must be an integer in [4, 512]");
const list = (v: string | undefined) =>
  v
    ?.split(",")
    .filter((x) => x.trim() !== "")
    .map(Number);
const REAL = list(bench.values.contexts) ?? (bench.quick ? [512, 2048] : [512, 2048, 4096, 8192 - STEPS - 1]);
const SYNTHETIC = list(bench.values.synthetic) ?? (bench.quick ? [] : [16384, 32768]);
const PREFILL_THREADS = Number(bench.values["prefill-threads"]);
const CHUNK = 512;

const modelPath = await resolveModel(bench.values.model ? { path: bench.values.model } : {});
const model = await loadModel(modelPath);
const filterLayers = policyDefaultsFor(model.fingerprint)?.filterLayers ?? [2, 8, 18];
const policies = benchPolicies(filterLayers, STEPS);
const maxContext = Math.max(...REAL, ...SYNTHETIC) + STEPS + 1;
const engine = new Engine(model, { threads: PREFILL_THREADS, decodeThreads: 1, maxContext });
const rt = await loadLlama(modelPath);
const faList = bench.values["llama-fa"]!.split(",").map((s) => s.trim()) as FlashAttention[];
for (const f of faList) if (!["auto", "on", "off"].includes(f)) throw new Error(`--llama-fa: "${f}" is not auto|on|off`);
const llamas = faList.map((flashAttention, i) => ({
  fa: flashAttention,
  backend: new LlamaBackend(rt, { batchSize: CHUNK, flashAttention }, i === 0),
}));
const tokens = benchTokens((t) => Array.from(rt.model.tokenize(t)) as number[], Math.max(...REAL));

/** Median ms per decode step over STEPS greedy steps from the current end of `seq`. */
async function decodeMs(seq: NativeSequence, first: number): Promise<number> {
  const times: number[] = [];
  let tok = first;
  for (let i = 0; i < STEPS; i++) {
    const t0 = performance.now();
    tok = argmax((await engine.decode([seq], [tok]))[0]!);
    times.push(performance.now() - t0);
  }
  return median(times);
}

/** Every policy decodes from the same prefilled cache, rolled back in between. */
async function oursAt(seq: NativeSequence, length: number, first: number): Promise<Record<string, number>> {
  const out: Record<string, number> = {};
  for (const { id, policy } of policies) {
    seq.truncate(length);
    seq.setPolicy(policy);
    out[id] = await decodeMs(seq, first);
    console.error(`[longctx] ${String(length).padStart(5)} ${id.padEnd(14)} ${out[id]!.toFixed(2)} ms/token`);
  }
  return out;
}

// llamaMs: llama.cpp's faster flash-attention setting at that context (llamaMsByFa: each one's).
const rows: Array<{
  context: number;
  synthetic: boolean;
  llamaMs?: number;
  llamaMsByFa?: Record<string, number>;
  ours: Record<string, number>;
}> = [];
for (const length of REAL) {
  const prompt = tokens.slice(0, length);
  const seq = engine.createSequence(length + STEPS + 1);
  let logits: Float32Array = new Float32Array(0);
  for (let i = 0; i < length; i += CHUNK) logits = await engine.prefill(seq, prompt.slice(i, i + CHUNK));
  const ours = await oursAt(seq, length, argmax(logits));
  seq.release();
  const llamaMsByFa: Record<string, number> = {};
  for (const { fa, backend } of llamas) {
    const session = await backend.open(1, length + STEPS + 1);
    const pre = await session.prefill(prompt, CHUNK);
    const dec = await session.decode(pre.next, STEPS);
    await session.dispose();
    llamaMsByFa[fa] = median(dec.stepMs);
    console.error(`[longctx] ${String(length).padStart(5)} llama.cpp FA ${fa.padEnd(4)} ${llamaMsByFa[fa]!.toFixed(2)} ms/token`);
  }
  rows.push({ context: length, synthetic: false, llamaMs: Math.min(...Object.values(llamaMsByFa)), llamaMsByFa, ours });
}
for (const length of SYNTHETIC) {
  const seq = engine.createSequence(length + STEPS + 1);
  fillSyntheticKv(seq, model.config, length);
  rows.push({ context: length, synthetic: true, ours: await oursAt(seq, length, tokens[0]!) });
  seq.release();
}

await bench.results.json("longctx", {
  what: "decode ms/token (median of the steps), 1 thread, greedy",
  prefillThreads: PREFILL_THREADS,
  ...bench.record(),
  steps: STEPS,
  filterLayers,
  model: { name: model.config.name, fingerprint: model.fingerprint },
  kernels: engine.native.info.kernels,
  rows,
});
const colors = ["#333333", "#1f77b4", "#2ca02c", "#17becf", "#9467bd", "#ff7f0e"];
const series: Series[] = policies.map(({ id }, i) => ({
  name: `ours ${id}`,
  color: colors[i % colors.length]!,
  points: rows.map((r) => [r.context, r.ours[id]!] as [number, number]),
}));
series.push({
  name: `llama.cpp full (faster of FA ${faList.join(", ")})`,
  color: "#d62728",
  dash: "6 4",
  points: rows.filter((r) => r.llamaMs !== undefined).map((r) => [r.context, r.llamaMs!] as [number, number]),
});
await bench.results.chart(
  "longctx",
  renderChart(
    [
      {
        title: "Decode latency vs context (1 thread)",
        xLabel: SYNTHETIC.length ? `context (tokens; ${SYNTHETIC.map((n) => `${n / 1024}K`).join(", ")} synthetic KV)` : "context (tokens)",
        yLabel: "ms / token",
        xLog2: true,
        series,
      },
    ],
    {
      title: `${model.config.name}: long-context decode`,
      subtitle: `filter layers ${filterLayers.join(", ")}; ${STEPS} steps per point`,
      panelWidth: 760,
      panelHeight: 420,
    },
  ),
);
for (const r of rows) {
  const cells = policies.map(({ id }) => `${id} ${r.ours[id]!.toFixed(1)}`).join(" | ");
  console.log(`${r.context}${r.synthetic ? " (synthetic)" : ""}: llama ${r.llamaMs?.toFixed(1) ?? "-"} | ${cells}`);
}
