// A real model's logits against llama.cpp's at long prompts: the measurement of
// test/engine/arch-oracle.test.ts (tools/lib/oracle-compare.ts) at lengths a test cannot afford,
// by default Gemma 3 270M at 1K, 8K and 30K tokens. Per length: the prompt's last logits (max and
// mean |Δlogit|, KL, top-1), then teacher-forced decode on llama.cpp's greedy tokens (the same
// figures over the steps, top-1 agreement, ties) and free-running greedy decode (steps until the
// first divergence, and llama.cpp's top-1/top-2 gap there), beside llama.cpp's own noise floor
// (its f16 KV cache against its f32 one). llama.cpp runs with flash attention off and an f32 cache.
//
// The prompt is this repository's docs/ (varied prose, tables and code), BOS first, cut to length.
//
//   npm run bench:oracle [-- --model gemma-3-270m] [--lengths 1024,8192,30720] [--steps 32] [--threads 2]
import { createHash } from "node:crypto";
import { readdirSync, readFileSync } from "node:fs";
import { join } from "node:path";

import { loadModel } from "../../shared/inference/engine/engine.ts";
import { resolveModel } from "../../shared/inference/model/resolve.ts";
import { loadOracle } from "../../tools/lib/llama-oracle.ts";
import { compareWithLlama, describeComparison, type OracleComparison } from "../../tools/lib/oracle-compare.ts";
import { benchCli, REPO_ROOT } from "../../tools/lib/bench-runner.ts";
import { renderChart } from "../../tools/lib/svg-chart.ts";

const bench = benchCli({
  name: "oracle",
  script: "npm run bench:oracle --",
  options: {
    model: { type: "string", default: "gemma-3-270m" },
    lengths: { type: "string", default: "1024,8192,30720" },
    steps: { type: "string", default: "32" },
    threads: { type: "string", default: "2" },
    tie: { type: "string", default: "0.5" },
  },
  help: `  --model NAME|PATH   the model (default gemma-3-270m)
  --lengths LIST      prompt tokens (default 1024,8192,30720)
  --steps N           decode steps compared (default 32)
  --threads N         threads of both engines (default 2)
  --tie X             a top-1/top-2 gap below X counts as a tie (default 0.5, as the test's for Gemma)`,
  replot: true,
});

type Row = { idsSha256: string } & OracleComparison;
interface OracleResult {
  command: string;
  model: { name: string; fingerprint: string };
  rows: Row[];
}
if (bench.replot) {
  await writeReport(await bench.results.readJson<OracleResult>("oracle"));
  process.exit(0);
}
const args = bench.values;
const lengths = args.lengths!.split(",").map(Number);
const steps = Number(args.steps);
const threads = Number(args.threads);
const tie = Number(args.tie);
if (lengths.some((n) => !Number.isInteger(n) || n < 16)) throw new Error("--lengths must be integers >= 16");
if (!Number.isInteger(steps) || steps < 1 || steps > 256) throw new Error("--steps must be an integer in [1, 256]");
if (!Number.isInteger(threads) || threads < 1 || threads > 256) throw new Error("--threads must be an integer in [1, 256]");
if (!(tie >= 0)) throw new Error("--tie must be a number >= 0");

const path = await resolveModel({ path: args.model });
const model = await loadModel(path);
const maxPrompt = Math.max(...lengths);
if (maxPrompt + steps + 16 > model.config.nCtxTrain)
  throw new Error(`${maxPrompt} prompt tokens + ${steps} steps exceed ${model.config.name}'s context of ${model.config.nCtxTrain}`);

// The prompt: docs/*.md in name order, tokenized by llama.cpp, BOS first.
const docs = readdirSync(join(REPO_ROOT, "docs"))
  .filter((f) => f.endsWith(".md"))
  .sort()
  .map((f) => readFileSync(join(REPO_ROOT, "docs", f), "utf8"))
  .join("\n\n");
const tokenizer = await loadOracle(path);
const text = Array.from(tokenizer.tokenize(docs, true)) as number[];
const bos = tokenizer.tokens.bos;
await tokenizer.dispose();
const all = [...(bos !== null ? [bos as number] : []), ...text];
if (all.length < maxPrompt) throw new Error(`docs/ give only ${all.length} tokens, fewer than ${maxPrompt}`);

const rows: Row[] = [];
for (const length of lengths) {
  const ids = all.slice(0, length);
  const c = await compareWithLlama(path, ids, steps, tie, { threads, oracleThreads: threads });
  console.error(`[oracle] ${describeComparison(model.config.name, c)}`);
  rows.push({ idsSha256: createHash("sha256").update(JSON.stringify(ids)).digest("hex"), ...c });
}

const result = {
  what: "ours vs llama.cpp (flash attention off, f32 KV) on one prompt per length; floor = llama.cpp f16 KV vs f32 KV",
  ...bench.record(["native", "shared/inference/engine"]),
  model: { name: model.config.name, fingerprint: model.fingerprint },
  threads,
  rows,
};
await bench.results.json("oracle", result);
await writeReport(result);
console.error(`[oracle] wrote ${bench.results}`);

/** The table and the chart, from the result (a run's, or --replot's JSON). */
async function writeReport(r: OracleResult): Promise<void> {
  const name = r.model.name;
  const e = (x: number) => x.toExponential(2);
  const lines = [
    `# ${name} vs llama.cpp at long prompts`,
    "",
    `\`${r.command}\``,
    "",
    "| prompt tokens | prefill max abs Δlogit | prefill top-1 | decode max abs Δlogit (floor) | decode mean abs Δlogit (floor) | KL (floor) | teacher-forced top-1 | ties | free-running identical |",
    "| ---: | ---: | :---: | ---: | ---: | ---: | ---: | ---: | ---: |",
    ...r.rows.map(
      (x) =>
        `| ${x.promptTokens} | ${e(x.prefill.maxAbs)} | ${x.prefillTop1 ? "same" : "differs"} | ${e(x.ours.maxAbs)} (${e(x.floor.maxAbs)}) | ` +
        `${e(x.ours.meanAbs)} (${e(x.floor.meanAbs)}) | ${e(x.ours.kl)} (${e(x.floor.kl)}) | ${x.top1Agree}/${x.steps} | ${x.ties} | ` +
        `${x.firstDivergence}/${x.steps}${x.divergenceMargin !== undefined ? ` (gap there ${x.divergenceMargin.toFixed(3)})` : ""} |`,
    ),
    "",
    "Floor: llama.cpp's f16 KV cache against its f32 cache, teacher-forced on the same tokens. " +
      `A tie: llama.cpp's top-1/top-2 gap below ${r.rows[0]?.tie}. Teacher-forced top-1 mismatches outside ties: ` +
      (r.rows.some((x) => x.mismatches.length)
        ? r.rows.map((x) => `${x.promptTokens}: ${x.mismatches.map((m) => `step ${m.step}`).join(", ") || "none"}`).join("; ")
        : "none") +
      ".",
    "",
  ];
  await bench.results.markdown("oracle", lines.join("\n"));
  const points = (f: (x: Row) => number) => r.rows.map((x) => [x.promptTokens, f(x)] as [number, number]);
  await bench.results.chart(
    "oracle",
    renderChart(
      [
        {
          title: "decode |Δlogit| vs llama.cpp f32 (dashed: llama.cpp f16 vs f32)",
          xLabel: "prompt tokens",
          yLabel: "|Δlogit|",
          xLog2: true,
          series: [
            { name: "ours max", color: "#1f77b4", points: points((x) => x.ours.maxAbs) },
            { name: "floor max", color: "#1f77b4", dash: "6 4", points: points((x) => x.floor.maxAbs) },
            { name: "ours mean", color: "#2ca02c", points: points((x) => x.ours.meanAbs) },
            { name: "floor mean", color: "#2ca02c", dash: "6 4", points: points((x) => x.floor.meanAbs) },
          ],
        },
      ],
      { title: `${name} vs llama.cpp`, subtitle: r.command, panelWidth: 640, panelHeight: 360 },
    ),
  );
}
