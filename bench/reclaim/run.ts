// KV a long generation holds under the evicting policies (scope, streaming, h2o), with their
// evicted tokens' rows only masked (the default) and reclaimed (`reclaim: true`,
// native/src/kv_slots.h), on each model family: deviceBytesUsed sampled as the generation goes,
// against full attention's (every token kept) and the bound admission reserves for a reclaiming
// sequence (reclaimedRows). The greedy tokens of the two runs of a policy are compared: reclamation
// must change none.
//
//   npm run bench:reclaim [-- --models smollm2-135m-instruct,gemma-3-270m] [--prompt 1024] [--generate 1024]
import { DECODE_RING_BATCH, Engine, loadModel } from "../../shared/inference/engine/engine.ts";
import type { AttentionPolicy } from "../../shared/inference/engine/native.ts";
import { argmax } from "../../shared/inference/engine/sampler.ts";
import { resolveModel } from "../../shared/inference/model/resolve.ts";
import { reclaimedRows, withReclaim } from "../../shared/inference/policy/reclaim.ts";
import { completePolicy } from "../../shared/inference/policy/schema.ts";
import { fmtNum, markdownTable } from "../../shared/platform/table.ts";
import { benchCli } from "../../tools/lib/bench-runner.ts";
import { renderChart, type Series } from "../../tools/lib/svg-chart.ts";

const bench = benchCli({
  name: "reclaim",
  script: "npm run bench:reclaim --",
  options: {
    models: { type: "string", default: "smollm2-135m-instruct,gemma-3-270m" },
    prompt: { type: "string", default: "1024" },
    generate: { type: "string", default: "1024" },
    threads: { type: "string", default: "2" },
  },
  help: `  --models LIST       catalogue names or paths (default smollm2-135m-instruct,gemma-3-270m)
  --prompt N          prompt tokens (default 1024)
  --generate N        generated tokens per run (default 1024)
  --threads N         engine threads (default 2)`,
});
const args = bench.values;
const promptTokens = Number(args.prompt);
const generate = Number(args.generate);
const SAMPLE = 64; // deviceBytesUsed every this many tokens
const RINGS = { ringBatch: DECODE_RING_BATCH }; // a decode's sequences: sliding layers' rings of the window + 64 rows

/** Budgets of about half a 2K context each, so that the generation runs past them. */
const POLICIES: Array<{ id: string; policy: AttentionPolicy }> = [
  { id: "scope 256+256", policy: { kind: "scope", scope: { beta1: 256, beta2: 256, maxOutput: generate } } },
  { id: "streaming 4+508", policy: { kind: "streaming", streaming: { sinks: 4, window: 508 } } },
  { id: "h2o 512/128", policy: { kind: "h2o", h2o: { budget: 512, recent: 128 } } },
];

/** Greedy generation: the tokens and deviceBytesUsed every SAMPLE tokens. */
async function run(engine: Engine, policy: AttentionPolicy, ids: number[]) {
  const seq = engine.createSequence(promptTokens + generate + 1, RINGS); // as a decode's
  try {
    engine.applyPolicy(seq, policy);
    let tok = argmax(await engine.prefill(seq, ids));
    const tokens = [tok];
    const bytes: Array<[number, number]> = [[0, seq.deviceBytesUsed]];
    for (let i = 1; i <= generate; i++) {
      tok = argmax((await engine.decode([seq], [tok]))[0]!);
      tokens.push(tok);
      if (i % SAMPLE === 0 || i === generate) bytes.push([i, seq.deviceBytesUsed]);
    }
    return { tokens, bytes, final: seq.deviceBytesUsed };
  } finally {
    seq.release();
  }
}

const mib = (b: number) => b / 2 ** 20;
const rows = [];
const panels = [];
for (const name of args.models!.split(",")) {
  const model = await loadModel(await resolveModel({ path: name }));
  const c = model.config;
  const engine = new Engine(model, { threads: Number(args.threads), maxContext: promptTokens + generate + 1 });
  const ids = Array.from({ length: promptTokens }, (_, i) => 1000 + ((i * 7919) % 20000));
  const total = promptTokens + generate;
  const full = engine.kvBytes(total, RINGS);
  const series: Series[] = [
    {
      name: "full attention / masking",
      color: "#999999",
      dash: "6 4",
      points: [
        [0, mib(engine.kvBytes(promptTokens, RINGS))],
        [generate, mib(full)],
      ],
    },
  ];
  const colors = ["#1f77b4", "#ff7f0e", "#2ca02c"];
  for (const [i, { id, policy }] of POLICIES.entries()) {
    const masked = await run(engine, policy, ids);
    const reclaimed = await run(engine, withReclaim(policy), ids);
    const bound = engine.kvBytes(total, { ...RINGS, globalRows: reclaimedRows(completePolicy(withReclaim(policy)), promptTokens) });
    const row = {
      model: c.name,
      policy: id,
      tokens: total,
      fullBytes: full,
      maskedBytes: masked.final,
      reclaimedBytes: reclaimed.final,
      boundBytes: bound,
      reclaimedVsMasked: reclaimed.final / masked.final,
      sameTokens: reclaimed.tokens.every((t, j) => t === masked.tokens[j]),
      reclaimedSamples: reclaimed.bytes,
    };
    rows.push(row);
    series.push({ name: `${id}, reclaimed`, color: colors[i]!, points: reclaimed.bytes.map(([x, b]) => [x, mib(b)] as [number, number]) });
    console.log(
      `${c.name} ${id}: masked ${fmtNum(mib(masked.final))} MiB, reclaimed ${fmtNum(mib(reclaimed.final))} MiB ` +
        `(bound ${fmtNum(mib(bound))}), tokens ${row.sameTokens ? "the same" : "DIFFER"}`,
    );
  }
  panels.push({
    title: `${c.name} (${c.nLayer - c.slidingLayers.length} global layers)`,
    xLabel: "generated tokens",
    yLabel: "KV held (MiB)",
    series,
    note: `prompt ${promptTokens} tokens; masking holds full attention's rows`,
  });
}

await bench.results.json("reclaim", {
  what: "deviceBytesUsed after a greedy generation under scope/streaming/h2o, evicted rows masked vs reclaimed, and the bound admission reserves",
  ...bench.record(),
  promptTokens,
  generate,
  rows,
});
await bench.results.markdown(
  "reclaim",
  markdownTable({
    headers: ["model", "policy", "full / masked (MiB)", "reclaimed (MiB)", "bound (MiB)", "reclaimed vs masked", "tokens"],
    rows: rows.map((r) => [
      r.model,
      r.policy,
      `${fmtNum(mib(r.fullBytes))} / ${fmtNum(mib(r.maskedBytes))}`,
      fmtNum(mib(r.reclaimedBytes)),
      fmtNum(mib(r.boundBytes)),
      `${fmtNum(r.reclaimedVsMasked * 100, 0)}%`,
      r.sameTokens ? "the same" : "differ",
    ]),
  }),
);
await bench.results.chart(
  "reclaim",
  renderChart(panels, {
    title: "KV held by a long generation: evicted rows masked vs reclaimed",
    subtitle: `greedy, ${promptTokens}-token prompt, ${generate} tokens generated; deviceBytesUsed`,
    panelWidth: 520,
    panelHeight: 340,
  }),
);
