// tsx bench/gpu/report.ts DIR   (DIR: a GPU run's files, e.g. results/gpu/run-1)
//
// Ours vs llama.cpp CUDA from one GPU run: reads every bench JSON in DIR (bench.json, the merged
// runs of device-run.sh, and any other *.json a later command of the same session wrote with
// ctxbank_gpu_bench) and llama.cpp's figures: measured in the same run (bench.json's "llama", when
// the run carried llama.cpp) or else bench/gpu/llama-h100.json (recorded on the same machine kind),
// and writes DIR/gpu.json, gpu.md and gpu.svg. Per point, ours is the faster of CUDA graphs off and
// on, for the simple kernels and for the fastest kernel set measured there (named).
import { readdir, readFile } from "node:fs/promises";
import { join } from "node:path";
import { fileURLToPath } from "node:url";

import { Results } from "../../tools/lib/bench-runner.ts";
import { renderChart } from "../../tools/lib/svg-chart.ts";
import { fmtNum, markdownTable } from "../../shared/platform/table.ts";

interface Point {
  test: "decode" | "prefill" | "batched";
  kernels: string;
  graphs?: boolean;
  context?: number;
  tokens?: number;
  batch?: number;
  ms_per_token?: number;
  tokens_per_second?: number;
}
interface Run {
  device_description: string;
  kernels: string;
  points: Point[];
}
interface Llama {
  about: string;
  decode_ms_per_token: Record<string, number>;
  prefill_tokens_per_second: Record<string, number>;
  batched_tokens_per_second_at_4096: Record<string, number>;
}

const dir = process.argv[2];
if (!dir) throw new Error("usage: tsx bench/gpu/report.ts DIR");
const runs: Run[] = [];
let measuredLlama: Llama | undefined;
for (const f of (await readdir(dir)).filter((f) => f.endsWith(".json") && !["gtest.json", "gpu.json"].includes(f)).sort()) {
  const doc = JSON.parse(await readFile(join(dir, f), "utf8")) as { runs?: Run[]; llama?: Llama } & Partial<Run>;
  if (doc.runs) runs.push(...doc.runs);
  else if (doc.points) runs.push(doc as Run);
  measuredLlama ??= doc.llama;
}
if (runs.length === 0) throw new Error(`${dir} holds no bench JSON`);
const llama = measuredLlama ?? (JSON.parse(await readFile(fileURLToPath(new URL("./llama-h100.json", import.meta.url)), "utf8")) as Llama);
const points = runs.flatMap((r) => r.points);
const device = runs[0]!.device_description;

// The best value of a point over graphs off/on (and over repeated runs), per kernel set.
type Key = { test: Point["test"] } & Partial<Pick<Point, "context" | "tokens" | "batch">>;
const lowerIsBetter = (test: Point["test"]) => test === "decode";
const value = (p: Point) => (p.test === "decode" ? p.ms_per_token : p.tokens_per_second)!;
function best(key: Key, kernels?: string): { value: number; kernels: string } | undefined {
  const matching = points.filter(
    (p) =>
      p.test === key.test &&
      (kernels === undefined || p.kernels === kernels) &&
      p.context === key.context &&
      p.tokens === key.tokens &&
      p.batch === key.batch,
  );
  let out: { value: number; kernels: string } | undefined;
  for (const p of matching) {
    const v = value(p);
    if (!out || (lowerIsBetter(key.test) ? v < out.value : v > out.value)) out = { value: v, kernels: p.kernels };
  }
  return out;
}
const keys = (test: Point["test"], field: "context" | "tokens" | "batch") =>
  [...new Set(points.filter((p) => p.test === test).map((p) => p[field]!))].sort((a, b) => a - b);
const batchedContext = points.find((p) => p.test === "batched")?.context ?? 4096;

const rows = [
  ...keys("decode", "context").map((context) => ({ key: { test: "decode", context } as Key, llama: llama.decode_ms_per_token[context] })),
  ...keys("prefill", "tokens").map((tokens) => ({
    key: { test: "prefill", tokens } as Key,
    llama: llama.prefill_tokens_per_second[tokens],
  })),
  ...keys("batched", "batch").map((batch) => ({
    key: { test: "batched", context: batchedContext, batch } as Key,
    llama: batchedContext === 4096 ? llama.batched_tokens_per_second_at_4096[batch] : undefined,
  })),
].map(({ key, llama }) => ({ ...key, llama, simple: best(key, "simple")?.value, fastest: best(key) }));

const k = (n: number) => (n >= 1024 ? `${n / 1024}K` : String(n));
const label = (r: (typeof rows)[number]) =>
  r.test === "decode"
    ? `decode, context ${k(r.context!)} (ms/token)`
    : r.test === "prefill"
      ? `prefill ${k(r.tokens!)} (tok/s)`
      : `batched B = ${r.batch} at ${k(r.context!)} (tok/s)`;
// Speed-up over llama.cpp: > 1 means ours is faster, for times and rates alike.
const speedup = (r: (typeof rows)[number], ours?: number) =>
  ours === undefined || r.llama === undefined ? undefined : r.test === "decode" ? r.llama / ours : ours / r.llama;
const digits = (r: (typeof rows)[number]) => (r.test === "decode" ? 3 : 0);
const md = [
  `# ctxbank CUDA vs llama.cpp CUDA: ${device}`,
  "",
  `llama.cpp: ${llama.about}`,
  "",
  "Ours: the faster of CUDA graphs off and on, for the simple kernels and for the fastest kernel set measured at that point.",
  "Speed-up > 1: ours is faster. Targets: decode ≥ 1.0× at every context and ≤ 0.5 ms/token at short context; prefill 8K ≥ 1.0×; B = 128 ≥ 1.2×.",
  "",
  markdownTable({
    headers: ["test", "llama.cpp", "ours, simple", "ours, fastest", "fastest set", "speed-up (fastest)"],
    rows: rows.map((r) => [
      label(r),
      fmtNum(r.llama, digits(r)),
      fmtNum(r.simple, digits(r)),
      fmtNum(r.fastest?.value, digits(r)),
      r.fastest?.kernels ?? "—",
      speedup(r, r.fastest?.value) === undefined ? "—" : fmtNum(speedup(r, r.fastest?.value), 2) + "×",
    ]),
  }),
  "",
].join("\n");

const series = (test: Point["test"], x: (r: (typeof rows)[number]) => number, y: (r: (typeof rows)[number]) => number | undefined) =>
  rows.filter((r) => r.test === test).flatMap((r) => (y(r) === undefined ? [] : [[x(r), y(r)!] as [number, number]]));
const panel = (test: Point["test"], title: string, xLabel: string, yLabel: string, x: (r: (typeof rows)[number]) => number) => ({
  title,
  xLabel,
  yLabel,
  xLog2: test !== "decode",
  xTickFormat: k,
  series: [
    { name: "ours, fastest", color: "#d62728", points: series(test, x, (r) => r.fastest?.value), labels: true },
    { name: "ours, simple", color: "#ff9896", points: series(test, x, (r) => r.simple) },
    { name: "llama.cpp", color: "#1f77b4", dash: "5,3", points: series(test, x, (r) => r.llama) },
  ],
});
const svg = renderChart(
  [
    panel("decode", "Batch-1 decode", "context (tokens)", "ms/token", (r) => r.context!),
    panel("prefill", "Prefill", "prompt (tokens)", "tokens/s", (r) => r.tokens!),
    panel("batched", `Aggregate decode, ${k(batchedContext)} context`, "batch", "tokens/s", (r) => r.batch!),
  ],
  { title: "ctxbank CUDA backend vs llama.cpp CUDA", subtitle: device },
);
const results = new Results(dir);
await results.json("gpu", { device, llama: llama.about, rows });
await results.markdown("gpu", md);
await results.chart("gpu", svg);
console.log(md);
