// Calibration: runs full attention over a few long prompts and a multi-round conversation,
// records each decode step's attention per layer (the engine's probe), and measures OmniKV's
// filter capability per layer and Round Attention's layer-to-layer KL of round-level attention.
// Writes JSON and charts under results/calibrate/ and records the recommended filter
// layers and watershed layer as this model's defaults (shared/inference/policy/model-defaults.json).
//
//   npm run calibrate [-- --model PATH] [--steps N] [--out DIR]
import { readFileSync } from "node:fs";
import { join } from "node:path";

import { Engine, loadModel } from "../../shared/inference/engine/engine.ts";
import { readGgufMetadata, type NativeSequence } from "../../shared/inference/engine/native.ts";
import { argmax } from "../../shared/inference/engine/sampler.ts";
import { resolveModel } from "../../shared/inference/model/resolve.ts";
import {
  coverage,
  filterCapability,
  layerToLayerRoundKl,
  recommendFilterLayers,
  recommendGlobalFilterLayers,
  similarityMatrix,
  watershedLayer,
  type Probe,
} from "../../shared/inference/policy/calibration.ts";
import { loadPolicyDefaults, policyDefaultsFile } from "../../shared/inference/policy/defaults.ts";
import { ChatTemplate } from "../../shared/inference/tokenizer/chat-template.ts";
import { GgufTokenizer } from "../../shared/inference/tokenizer/tokenizer.ts";
import { benchText } from "../../tools/lib/bench-text.ts";
import { benchCli, REPO_ROOT } from "../../tools/lib/bench-runner.ts";
import { writeFileAtomic } from "../../tools/lib/json.ts";
import { renderHeatmap } from "../../tools/lib/heatmap.ts";
import { renderChart } from "../../tools/lib/svg-chart.ts";
import { multiRoundConversation } from "./conversation.ts";

const SPAN = 12; // capability: mean over the next 12 layers (OmniKV uses 8-16)
const TOP_FRACTION = 0.067; // top-n = OmniKV's default budget fraction of the context
const FILTERS = 3;
const MAX_FIRST = 2; // at most 2 dense layers before the first filter layer (OmniKV's setting)
const KL_THRESHOLD = 0.05; // nats: consecutive layers' round distributions this close are "the same"

const bench = benchCli({
  name: "calibrate",
  script: "npm run calibrate --",
  options: { model: { type: "string" }, steps: { type: "string", default: "8" } },
  help: `  --model PATH     the GGUF to calibrate (default: ctxbank's default model)
  --steps N        decode steps probed per prompt (default 8)`,
});
const args = bench.values;
const steps = Number(args.steps);
if (!Number.isInteger(steps) || steps < 1 || steps > 256) throw new Error("--steps must be an integer in [1, 256]");
const modelPath = await resolveModel(args.model ? { path: args.model } : {});
const model = await loadModel(modelPath);
const engine = new Engine(model, { threads: 2 });
const tokenizer = GgufTokenizer.fromGguf(modelPath);
// A base model without a chat template reads the documents as they are.
const chat = ChatTemplate.fromMetadataIfAny(readGgufMetadata(modelPath), tokenizer);
const L = model.config.nLayer;
// With sliding-window layers the policies act on the global layers only (docs/algorithms.md).
const globals = Array.from({ length: L }, (_, l) => l).filter((l) => !model.config.slidingLayers.includes(l));
const sliding = globals.length < L;

/** Prefills `ids` and decodes greedily for `steps` steps, returning each step's probe. */
async function probeRun(ids: number[]): Promise<Probe[]> {
  const seq: NativeSequence = engine.createSequence(ids.length + steps + 1);
  let next = argmax(await engine.prefill(seq, ids));
  const probes: Probe[] = [];
  const logits = new Float32Array(model.config.nVocab);
  for (let s = 0; s < steps; s++) {
    const n = seq.nPast + 1;
    const flat = new Float32Array(L * n);
    await engine.native.forward([{ seq, tokens: Int32Array.of(next), logits, probe: flat }]);
    probes.push(Array.from({ length: L }, (_, l) => flat.subarray(l * n, (l + 1) * n)));
    next = argmax(logits);
  }
  seq.release();
  return probes;
}

const documents: Record<string, string> = {
  license: readFileSync(join(REPO_ROOT, "LICENSE"), "utf8").slice(0, 9000),
  story: benchText(4),
  "http client docs": readFileSync(join(REPO_ROOT, "node_modules/undici/docs/docs/api/Dispatcher.md"), "utf8").slice(0, 9000),
};
const docProbes: Probe[] = [];
for (const [name, text] of Object.entries(documents)) {
  const user = `${text}\n\nSummarize the text above.`;
  const ids = chat
    ? tokenizer.encode(chat.render([{ role: "user", content: user }]), { parseSpecial: true })
    : tokenizer.encode(`${user}\n\n`, { addSpecial: true });
  console.error(`[calibrate] ${name}: ${ids.length} tokens`);
  docProbes.push(...(await probeRun(ids)));
}
const sim = similarityMatrix(docProbes, (n) => Math.max(16, Math.round(TOP_FRACTION * n)));
const capability = filterCapability(sim, SPAN);
// A model with few global layers (Gemma 3 270M: 3 of 18) gets one filter layer per three.
const filterLayers = sliding
  ? recommendGlobalFilterLayers(sim, globals, Math.min(FILTERS, Math.max(1, Math.floor(globals.length / 3)))).filterLayers
  : recommendFilterLayers(sim, FILTERS, MAX_FIRST);

// Round Attention's watershed: measured on a chat; not on a model with sliding-window layers
// (rounds are refused there) or without a chat template.
let roundKl: number[] = [];
let watershed: number | null = null;
if (chat && !sliding) {
  const conv = multiRoundConversation(tokenizer, chat);
  console.error(`[calibrate] conversation: ${conv.ids.length} tokens, ${conv.rounds.length} rounds`);
  roundKl = layerToLayerRoundKl(await probeRun(conv.ids), conv.rounds);
  watershed = watershedLayer(roundKl, KL_THRESHOLD);
}

const name = model.config.name || "model";
const result = {
  ...bench.record(),
  model: { name, path: modelPath, fingerprint: model.fingerprint, layers: L },
  method: {
    steps,
    span: SPAN,
    topFraction: TOP_FRACTION,
    maxFirst: MAX_FIRST,
    klThreshold: KL_THRESHOLD,
    documents: Object.keys(documents),
  },
  similarity: sim,
  capability,
  globalLayers: globals,
  recommendedFilterLayers: filterLayers,
  coverage: sliding ? recommendGlobalFilterLayers(sim, globals, filterLayers.length).coverage : coverage(sim, filterLayers),
  coverageOfOmniKvDefault: coverage(sim, [2, 8, 18]),
  roundKl,
  watershedLayer: watershed,
};
await bench.results.json("calibration", result);
await bench.results.chart(
  "similarity",
  renderHeatmap(sim, {
    title: "Share of layer j's attention on layer i's top tokens",
    subtitle: `${name}; top ${TOP_FRACTION * 100}% tokens; ${docProbes.length} decode steps, ${Object.keys(documents).length} documents`,
    rowLabel: "layer i (selecting)",
    colLabel: "layer j (attending)",
  }),
);
await bench.results.chart(
  "layers",
  renderChart(
    [
      {
        title: `Filter capability (next ${SPAN} layers); chosen ${filterLayers.join(", ")}`,
        xLabel: "layer",
        yLabel: "capability",
        series: [
          {
            name: "capability",
            color: "#1f77b4",
            points: capability.flatMap((c, l) => (Number.isFinite(c) ? [[l, c]] : [])) as Array<[number, number]>,
          },
        ],
      },
      ...(roundKl.length === 0
        ? []
        : [
            {
              title: `Round KL, layer l vs l+1 (watershed: ${watershed ?? "none"})`,
              xLabel: "layer l",
              yLabel: "KL (nats)",
              series: [{ name: "KL", color: "#d62728", points: roundKl.map((k, l) => [l, k] as [number, number]) }],
            },
          ]),
    ],
    { title: `${name}: calibration` },
  ),
);
const defaults = loadPolicyDefaults();
defaults[model.fingerprint] = {
  model: name,
  filterLayers,
  watershedLayer: watershed,
  source: `npm run calibrate (${bench.results}/calibration.json)`,
};
await writeFileAtomic(policyDefaultsFile.pathname, JSON.stringify(defaults, null, 2) + "\n");
console.log(`filter layers ${filterLayers.join(", ")}; watershed layer ${watershed ?? `none below ${KL_THRESHOLD} nats`}`);
console.log(`capability: ${capability.map((c) => (Number.isFinite(c) ? c.toFixed(3) : "-")).join(" ")}`);
console.log(`round KL:   ${roundKl.map((k) => k.toFixed(3)).join(" ")}`);
