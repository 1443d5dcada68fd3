// tsx bench/gpu/report.ts DIR   (DIR: the files a GPU run brought back from $OUT)
//
// Ours vs llama.cpp CUDA from one GPU run: reads DIR/bench-ours.json, DIR/llama-prefill.json,
// DIR/llama-decode.json and DIR/llama-batched.jsonl, and writes bench/gpu/results/gpu.json,
// gpu.md and gpu.svg. llama.cpp's best of flash attention on and off is taken per point.
import { existsSync } from "node:fs";
import { mkdir, readFile, writeFile } from "node:fs/promises";
import { join } from "node:path";
import { fileURLToPath } from "node:url";

import { renderChart } from "../../tools/lib/svg-chart.ts";
import { fmtNum, markdownTable } from "../../tools/lib/table.ts";

interface Ours {
  deviceDescription: string;
  decodeBatch1: { context: number; msPerToken: number }[];
  decodeBatch1Graphs?: { context: number; msPerToken: number }[];
  prefill: { tokens: number; tokensPerSecond: number }[];
  aggregateDecode: { batch: number; tokensPerSecond: number }[];
  aggregateDecodeGraphs?: { batch: number; tokensPerSecond: number }[];
}
interface LlamaBenchRow { n_prompt: number; n_gen: number; n_depth?: number; flash_attn: boolean | number; avg_ts: number }
interface BatchedRow { pp: number; tg: number; pl: number; speed_tg: number; flash_attn?: boolean | number }

const dir = process.argv[2];
if (!dir) throw new Error("usage: tsx bench/gpu/report.ts DIR");
const readJson = async <T>(f: string): Promise<T | undefined> => (existsSync(join(dir, f)) ? (JSON.parse(await readFile(join(dir, f), "utf8")) as T) : undefined);

const ours = await readJson<Ours>("bench-ours.json");
if (!ours) throw new Error(`${dir}/bench-ours.json is missing`);
const prefillRows = (await readJson<LlamaBenchRow[]>("llama-prefill.json")) ?? [];
const decodeRows = (await readJson<LlamaBenchRow[]>("llama-decode.json")) ?? [];
const batchedRows: BatchedRow[] = existsSync(join(dir, "llama-batched.jsonl"))
  ? (await readFile(join(dir, "llama-batched.jsonl"), "utf8")).split("\n").filter((l) => l.trim().startsWith("{")).map((l) => JSON.parse(l) as BatchedRow)
  : [];

const best = (xs: number[]) => (xs.length ? Math.max(...xs) : undefined);
const llamaPrefill = (n: number) => best(prefillRows.filter((r) => r.n_prompt === n && r.n_gen === 0).map((r) => r.avg_ts));
const llamaDecodeMs = (ctx: number) => {
  const ts = best(decodeRows.filter((r) => r.n_prompt === 0 && r.n_gen > 0 && (r.n_depth ?? 0) === ctx).map((r) => r.avg_ts));
  return ts ? 1000 / ts : undefined;
};
const llamaAggregate = (b: number) => best(batchedRows.filter((r) => r.pl === b).map((r) => r.speed_tg));

// Ours: the better of without and with CUDA graphs (both kept in the JSON).
const graphMs = (ctx: number) => ours.decodeBatch1Graphs?.find((g) => g.context === ctx)?.msPerToken;
const graphTs = (b: number) => ours.aggregateDecodeGraphs?.find((g) => g.batch === b)?.tokensPerSecond;
const decode = ours.decodeBatch1.map((p) => ({
  context: p.context,
  ours: Math.min(p.msPerToken, graphMs(p.context) ?? Infinity),
  noGraphs: p.msPerToken,
  graphs: graphMs(p.context),
  llama: llamaDecodeMs(p.context),
}));
const prefill = ours.prefill.map((p) => ({ tokens: p.tokens, ours: p.tokensPerSecond, llama: llamaPrefill(p.tokens) }));
const aggregate = ours.aggregateDecode.map((p) => ({
  batch: p.batch,
  ours: Math.max(p.tokensPerSecond, graphTs(p.batch) ?? 0),
  noGraphs: p.tokensPerSecond,
  graphs: graphTs(p.batch),
  llama: llamaAggregate(p.batch),
}));

const ratio = (a?: number, b?: number) => (a !== undefined && b !== undefined ? fmtNum(a / b, 2) + "×" : "—");
const k = (n: number) => (n >= 1024 ? `${n / 1024}K` : String(n));
const md = [
  `# Ours vs llama.cpp CUDA — ${ours.deviceDescription}`,
  "",
  "Batch-1 decode, ms/token (lower is better; target: ours ≤ llama.cpp everywhere, ≤ 0.5 ms at short context)",
  "",
  markdownTable({
    headers: ["context", "ours", "(no graphs / graphs)", "llama.cpp", "llama.cpp / ours"],
    rows: decode.map((d) => [k(d.context), fmtNum(d.ours, 3), `${fmtNum(d.noGraphs, 3)} / ${fmtNum(d.graphs, 3)}`, fmtNum(d.llama, 3), ratio(d.llama, d.ours)]),
  }),
  "",
  "Prefill, tokens/s (target at 8K: ours ≥ 1.0× llama.cpp)",
  "",
  markdownTable({ headers: ["prompt", "ours", "llama.cpp", "ours / llama.cpp"], rows: prefill.map((p) => [k(p.tokens), fmtNum(p.ours), fmtNum(p.llama), ratio(p.ours, p.llama)]) }),
  "",
  "Aggregate decode at a 4K context, tokens/s (target at B = 128: ours ≥ 1.2× llama.cpp)",
  "",
  markdownTable({
    headers: ["batch", "ours", "(no graphs / graphs)", "llama.cpp", "ours / llama.cpp"],
    rows: aggregate.map((p) => [String(p.batch), fmtNum(p.ours), `${fmtNum(p.noGraphs)} / ${fmtNum(p.graphs)}`, fmtNum(p.llama), ratio(p.ours, p.llama)]),
  }),
  "",
].join("\n");

const series = <T>(rows: T[], x: (r: T) => number, y: (r: T) => number | undefined) =>
  rows.flatMap((r) => (y(r) === undefined ? [] : [[x(r), y(r)!] as [number, number]]));
const svg = renderChart(
  [
    { title: "Batch-1 decode", xLabel: "context (tokens)", yLabel: "ms/token", xLog2: false, xTickFormat: k, series: [
      { name: "ours", color: "#d62728", points: series(decode, (d) => d.context, (d) => d.ours), labels: true },
      { name: "llama.cpp", color: "#1f77b4", dash: "5,3", points: series(decode, (d) => d.context, (d) => d.llama) },
    ] },
    { title: "Prefill", xLabel: "prompt (tokens)", yLabel: "tokens/s", xLog2: true, xTickFormat: k, series: [
      { name: "ours", color: "#d62728", points: series(prefill, (p) => p.tokens, (p) => p.ours), labels: true },
      { name: "llama.cpp", color: "#1f77b4", dash: "5,3", points: series(prefill, (p) => p.tokens, (p) => p.llama) },
    ] },
    { title: "Aggregate decode, 4K context", xLabel: "batch", yLabel: "tokens/s", xLog2: true, series: [
      { name: "ours", color: "#d62728", points: series(aggregate, (p) => p.batch, (p) => p.ours), labels: true },
      { name: "llama.cpp", color: "#1f77b4", dash: "5,3", points: series(aggregate, (p) => p.batch, (p) => p.llama) },
    ] },
  ],
  { title: "ctxbank CUDA backend vs llama.cpp CUDA", subtitle: ours.deviceDescription },
);

const out = fileURLToPath(new URL("./results/", import.meta.url));
await mkdir(out, { recursive: true });
await writeFile(join(out, "gpu.json"), JSON.stringify({ device: ours.deviceDescription, decode, prefill, aggregate }, null, 2) + "\n");
await writeFile(join(out, "gpu.md"), md);
await writeFile(join(out, "gpu.svg"), svg);
console.log(md);
