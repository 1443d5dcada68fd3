// The longest context one sequence can hold in a fixed device arena (OmniKV's 128K -> 450K claim,
// at this model's scale): `full` keeps every layer's KV on the device; `omnikv` with offload
// keeps only the dense, filter and guard layers there, plus the packed rows of each selection,
// and the sparse layers' KV in the host bank. For each policy the engine's own arena check is
// the measurement: at the predicted maximum n a decode step is accepted and at n + 1 it is
// refused. Then decode speed at that context (synthetic KV: speed and memory only). On a model
// with sliding-window layers (Gemma 3) those layers hold a ring of rows whatever the context, and
// the policies act on the global layers: what grows with the context is the global layers' rows.
//
//   npm run bench:capacity [-- --model NAME|PATH] [--budget-mib 256] [--steps 16]
import { argmax } from "../../shared/inference/engine/sampler.ts";
import { Engine, loadModel } from "../../shared/inference/engine/engine.ts";
import type { AttentionPolicy } from "../../shared/inference/engine/native.ts";
import { resolveModel } from "../../shared/inference/model/resolve.ts";
import { policyDefaultsFor } from "../../shared/inference/policy/defaults.ts";
import { benchCli } from "../../tools/lib/bench-runner.ts";
import { renderChart } from "../../tools/lib/svg-chart.ts";
import { fillSyntheticKv } from "../../tools/lib/synthetic-kv.ts";
import { median } from "../../tools/lib/timing.ts";

const bench = benchCli({
  name: "capacity",
  script: "npm run bench:capacity --",
  options: { model: { type: "string" }, "budget-mib": { type: "string", default: "256" }, steps: { type: "string", default: "16" } },
  help: `  --model NAME|PATH  the model (default: the default model)
  --budget-mib N     the device arena (default 256)
  --steps N          decode steps timed at each maximum (default 16)`,
});
const args = bench.values;
const BUDGET = Number(args["budget-mib"]) * 2 ** 20;
const STEPS = Number(args.steps);
if (!Number.isInteger(BUDGET) || BUDGET < 2 ** 20 || BUDGET > 2 ** 34) throw new Error("--budget-mib must be an integer in [1, 16384]");
if (!Number.isInteger(STEPS) || STEPS < 2 || STEPS > 256) throw new Error("--steps must be an integer in [2, 256]");

const model = await loadModel(await resolveModel(args.model ? { path: args.model } : {}));
const { nLayer, nHeadKv, headDim, slidingLayers } = model.config;
const PAIR = 2 * nHeadKv * headDim * 2; // one token's f16 K and V rows of one layer
const nGlobal = nLayer - slidingLayers.length;
const filterLayers = policyDefaultsFor(model.fingerprint)?.filterLayers ?? [2, 8, 18];
const configs: Array<{ id: string; budget?: number; policy: AttentionPolicy }> = [
  { id: "full", policy: { kind: "full" } },
  ...[256, 1024, 2048].map((k) => ({
    id: `omnikv k=${k} offload`,
    budget: k,
    policy: { kind: "omnikv", omnikv: { filterLayers, budget: k, offload: true } } as AttentionPolicy,
  })),
  // Without the guard layer every global layer after the filter layer is sparse and leaves the
  // device (what matters on a model with few global layers: Gemma 3 270M has 3).
  {
    id: "omnikv k=1024 offload, no guard",
    budget: 1024,
    policy: { kind: "omnikv", omnikv: { filterLayers, budget: 1024, offload: true, guard: false } },
  },
];

/**
 * The arena's prediction: the device-tier global layers x tokens + the sliding layers' rings (all
 * on the device, a constant once the context passes them) + packed rows at full budget <= BUDGET.
 */
function predictedMax(
  policy: AttentionPolicy,
  probe: Engine,
): { max: number; deviceLayers: number; ringBytes: number; packedBytes: number } {
  const seq = probe.createSequence(1);
  seq.setPolicy(policy);
  const roles = seq.policyStats.layerRoles;
  seq.release();
  const offloaded = policy.kind === "omnikv" && policy.omnikv.offload ? roles.filter((r) => r === "sparse").length : 0;
  const deviceLayers = nGlobal - offloaded;
  const packedBytes = policy.kind === "omnikv" && policy.omnikv.offload ? offloaded * policy.omnikv.budget! * PAIR : 0;
  const past = model.config.nCtxTrain; // past every ring
  const ringBytes = probe.kvBytes(past) - nGlobal * past * PAIR;
  return { max: Math.floor((BUDGET - packedBytes - ringBytes) / (deviceLayers * PAIR)), deviceLayers, ringBytes, packedBytes };
}

const probe = new Engine(model, { threads: 1 });
const predictions = configs.map((c) => predictedMax(c.policy, probe));
const maxContext = Math.max(...predictions.map((p) => p.max)) + STEPS + 2;
const engine = new Engine(model, { threads: 1, maxContext, deviceBudgetBytes: BUDGET });

const rows = [];
for (const [i, c] of configs.entries()) {
  const { max, deviceLayers, ringBytes, packedBytes } = predictions[i]!;
  const seq = engine.createSequence(max + 1);
  fillSyntheticKv(seq, model.config, max - STEPS);
  seq.setPolicy(c.policy); // under offload: moves the sparse layers' rows into the host bank
  const times: number[] = [];
  let tok = 1;
  for (let s = 0; s < STEPS; s++) {
    const t0 = performance.now();
    tok = argmax((await engine.decode([seq], [tok]))[0]!);
    times.push(performance.now() - t0);
  }
  const atMax = { nPast: seq.nPast, deviceBytes: seq.deviceBytesUsed, hostBytes: seq.hostBytesUsed };
  let refused = "";
  await engine.decode([seq], [tok]).catch((e: Error) => (refused = e.message)); // the (max + 1)-th token
  seq.release();
  if (atMax.nPast !== max || !refused)
    throw new Error(`${c.id}: the arena did not stop at the predicted ${max} tokens (held ${atMax.nPast}, refusal: "${refused}")`);
  const row = {
    id: c.id,
    budget: c.budget ?? null,
    maxContext: max,
    deviceLayers,
    ringBytes,
    packedBytes,
    ...atMax,
    refusal: refused,
    decodeMs: median(times),
  };
  console.error(
    `[capacity] ${c.id.padEnd(22)} max ${max} tokens, device ${(atMax.deviceBytes / 2 ** 20).toFixed(1)} MiB, host ${(atMax.hostBytes / 2 ** 20).toFixed(1)} MiB, ${row.decodeMs.toFixed(1)} ms/token`,
  );
  rows.push(row);
}
const full = rows[0]!.maxContext;
await bench.results.json("capacity", {
  what: "longest context of one sequence in a fixed device arena (KV + packed rows), checked by the engine's arena; decode ms/token at that context, synthetic KV, 1 thread",
  ...bench.record(),
  budgetBytes: BUDGET,
  steps: STEPS,
  filterLayers,
  model: { name: model.config.name, fingerprint: model.fingerprint },
  rows: rows.map((r) => ({ ...r, vsFull: r.maxContext / full })),
});
const omni = rows.filter((r) => r.budget !== null && !r.id.endsWith("no guard"));
const noGuard = rows.filter((r) => r.id.endsWith("no guard"));
await bench.results.chart(
  "capacity",
  renderChart(
    [
      {
        title: `Max context in a ${args["budget-mib"]} MiB device arena`,
        xLabel: "OmniKV budget k (tokens)",
        yLabel: "tokens",
        xLog2: true,
        series: [
          { name: "omnikv + offload", color: "#2ca02c", points: omni.map((r) => [r.budget!, r.maxContext] as [number, number]) },
          {
            name: "omnikv + offload, no guard",
            color: "#9467bd",
            points: noGuard.map((r) => [r.budget!, r.maxContext] as [number, number]),
          },
          { name: "full", color: "#333333", dash: "6 4", points: omni.map((r) => [r.budget!, full] as [number, number]) },
        ],
      },
    ],
    {
      title: `${model.config.name}: context per device budget`,
      subtitle: `filter layers ${filterLayers.join(", ")}; sparse layers' KV in the host bank`,
      panelWidth: 640,
      panelHeight: 360,
    },
  ),
);
for (const r of rows)
  console.log(`${r.id}: ${r.maxContext} tokens (${(r.maxContext / full).toFixed(2)}x full), ${r.decodeMs.toFixed(1)} ms/token`);
