// npm run bench:engine [-- options]   (tsx bench/engine/run.ts)
//
// Ours vs llama.cpp on the same GGUF: prefill tokens/s at several prompt lengths and decode
// ms/token at several contexts. Writes results/engine/engine.json, engine.svg and engine.md, and
// prints the tables. See bench/engine/README.md; --help for options.
import { execFileSync } from "node:child_process";
import { existsSync } from "node:fs";
import { join, relative } from "node:path";
import { createHash } from "node:crypto";
import { getModuleVersion } from "node-llama-cpp";

import { addon, type ReadBandwidth } from "../../shared/inference/engine/native.ts";
import { resolveModel } from "../../shared/inference/model/resolve.ts";
import { benchCli, REPO_ROOT, type Results } from "../../tools/lib/bench-runner.ts";
import {
  autogroup,
  fileStamp,
  machineInfo,
  mappedLibraries,
  restoreAutogroupNice,
  setProcessNice,
  threadNiceValues,
} from "../../tools/lib/machine.ts";
import { renderChart, type Panel, type Series } from "../../tools/lib/svg-chart.ts";
import { fmtNum, markdownTable, textTable, type Table } from "../../shared/platform/table.ts";
import {
  currentOtherLoad,
  decodeBreakdown,
  effectiveLength,
  prefillBreakdown,
  runBench,
  type BenchOptions,
  type BenchResult,
  type PointRecord,
} from "./bench.ts";
import { LlamaBackend, loadLlama, OursBackend, type Backend, type FlashAttention } from "./engines.ts";
import { benchTokens, PARAGRAPHS } from "../../tools/lib/bench-text.ts";

const addonPath = join(REPO_ROOT, "native/build/Release/ctxbank_native.node");

const HELP = `  --lengths LIST          prompt lengths / decode contexts (default 512,2048,4096,8192)
  --prefill-threads LIST  thread counts for prefill (default 1,2)
  --decode-threads LIST   thread counts for decode (default 1)
  --steps N               greedy decode steps per decode point (default 64)
  --decode-runs N          decode runs per repetition, KV rolled back to the prompt between (default 3)
  --reps SPEC             repetitions: N, or per length "512:3,2048:3,4096:2,8192:1" (the default)
  --chunk N               prefill tokens per call, timed separately (default 512 = ubatch; 0 = one call)
  --ubatch N              our micro-batch and llama.cpp's batch size (default 512)
  --max-context N         context limit (default: the model's, 8192)
  --engines LIST          ours,llama (default both)
  --llama-fa LIST         llama.cpp flash attention: auto,on,off, one variant each (default auto)
  --quiet-threshold X     contention: others' load above cpus − threads + X cores, or we got < 85% of
                          our threads' cores (default 0.35); short contended runs are redone
  --quiet-wait S          wait up to S seconds for a quiet machine before each run (default 5)
  --retry-budget S        seconds allowed for redoing contended runs ≤ 30 s long (default 150)
  --model PATH            GGUF to use (default: resolveModel(), i.e. CTXBANK_MODEL or the cache)
  --build                 (re)build the native addon first (cmake-js, incremental)
  --nice=N                run every thread of the benchmark at nice N, e.g. --nice=-10 (negative needs root)`;

function list(s: string | undefined, dflt: number[]): number[] {
  if (s === undefined) return dflt;
  const xs = s
    .split(",")
    .filter((x) => x.trim() !== "")
    .map((x) => Number(x));
  if (xs.length === 0 || xs.some((x) => !Number.isInteger(x) || x < 0)) throw new Error(`bad list of integers: ${s}`);
  return xs;
}

function int(s: string | undefined, dflt: number, name: string): number {
  if (s === undefined) return dflt;
  const x = Number(s);
  if (!Number.isInteger(x) || x < 0) throw new Error(`--${name} needs a non-negative integer, got ${s}`);
  return x;
}

function num(s: string | undefined, dflt: number, name: string): number {
  if (s === undefined) return dflt;
  const x = Number(s);
  if (!Number.isFinite(x) || x < 0) throw new Error(`--${name} needs a non-negative number, got ${s}`);
  return x;
}

function parseReps(s: string | undefined, quick: boolean): { reps: Record<number, number>; defaultReps: number } {
  if (s === undefined) return quick ? { reps: {}, defaultReps: 1 } : { reps: { 512: 3, 2048: 3, 4096: 2, 8192: 1 }, defaultReps: 1 };
  if (/^\d+$/.test(s)) return { reps: {}, defaultReps: Math.max(1, Number(s)) };
  const reps: Record<number, number> = {};
  for (const part of s.split(",")) {
    const m = /^(\d+):(\d+)$/.exec(part.trim());
    if (!m) throw new Error(`bad --reps entry "${part}" (want LENGTH:COUNT)`);
    reps[Number(m[1])] = Math.max(1, Number(m[2]));
  }
  return { reps, defaultReps: 1 };
}

async function main(): Promise<void> {
  const bench = benchCli({
    name: "engine",
    script: "npm run bench:engine --",
    options: {
      lengths: { type: "string" },
      "prefill-threads": { type: "string" },
      "decode-threads": { type: "string" },
      steps: { type: "string" },
      "decode-runs": { type: "string" },
      reps: { type: "string" },
      chunk: { type: "string" },
      ubatch: { type: "string" },
      "max-context": { type: "string" },
      engines: { type: "string" },
      "llama-fa": { type: "string" },
      "quiet-threshold": { type: "string" },
      "quiet-wait": { type: "string" },
      "retry-budget": { type: "string" },
      model: { type: "string" },
      build: { type: "boolean", default: false },
      nice: { type: "string" },
    },
    help: HELP,
    quick: "fast smoke: lengths 512,2048, 16 decode steps, 1 rep, short warm-up, no quiet waits",
    replot: true,
  });
  const { values: a, quick, results } = bench;
  if (bench.replot) {
    const report = await results.readJson<Report>("engine");
    await writeOutputs(report, results);
    // Keep the JSON's derived summary in step with the renderer (the measurements are untouched).
    await results.json("engine", report);
    return;
  }
  const t0 = performance.now();
  const log = (line: string) => console.error(line);

  if (a.build) {
    log("building the native addon (cmake-js compile, incremental) ...");
    execFileSync("npx", ["cmake-js", "compile", "--directory", "native", "--out", "native/build", "--parallel", "2"], {
      cwd: REPO_ROOT,
      stdio: ["ignore", "inherit", "inherit"],
    });
  }
  if (!existsSync(addonPath)) {
    throw new Error(
      `the native addon is not built (${relative(REPO_ROOT, addonPath)} is missing): run ` +
        `"npx cmake-js compile --directory native --out native/build --parallel 2" or pass --build`,
    );
  }

  const engines = (a.engines ?? "ours,llama").split(",").map((s) => s.trim());
  for (const e of engines) if (e !== "ours" && e !== "llama") throw new Error(`--engines: unknown engine "${e}"`);
  const faList = (a["llama-fa"] ?? "auto").split(",").map((s) => s.trim()) as FlashAttention[];
  for (const f of faList) if (!["auto", "on", "off"].includes(f)) throw new Error(`--llama-fa: "${f}" is not auto|on|off`);
  const ubatch = int(a.ubatch, 512, "ubatch");
  const steps = int(a.steps, quick ? 16 : 64, "steps");
  const { reps, defaultReps } = parseReps(a.reps, quick);

  let niceError: string | undefined;
  if (a.nice !== undefined) {
    const n = Number(a.nice);
    if (!Number.isInteger(n) || n < -20 || n > 19) throw new Error(`--nice needs an integer in -20..19, got ${a.nice}`);
    // The scheduler autogroup is shared with the shell that started us: put its nice back on exit.
    const before = /nice (-?\d+)/.exec(autogroup() ?? "")?.[1];
    if (before !== undefined) {
      process.on("exit", () => restoreAutogroupNice(Number(before)));
      for (const sig of ["SIGINT", "SIGTERM"] as const) process.once(sig, () => process.exit(130));
    }
    niceError = setProcessNice(n);
    if (niceError) log(`warning: could not set nice ${n}: ${niceError}`);
  }

  // Stamp the addon and the git state before anything runs: both may change on disk (another
  // checkout user rebuilding or committing) while the benchmark runs.
  const addonStamp = await fileStamp(addonPath);
  const { git, machine, ...record } = bench.record(["native", "shared/inference/engine"]);

  const modelPath = await resolveModel({ path: a.model, progress: "lines" });
  log(`model: ${modelPath}`);

  // llama.cpp is also the tokenizer: both engines get the ids node-llama-cpp's model.tokenize makes.
  const rt = await loadLlama(modelPath);
  const nCtxTrain = rt.model.trainContextSize;
  const maxContext = Math.min(int(a["max-context"], nCtxTrain, "max-context"), nCtxTrain);
  const ours = engines.includes("ours") ? await OursBackend.load(modelPath, { ubatch, maxContext }) : undefined;
  const lengths = list(a.lengths, quick ? [512, 2048] : [512, 2048, 4096, 8192]).filter((l) => l > 0);
  for (const l of lengths) if (effectiveLength(l, steps, maxContext) < 1) throw new Error(`length ${l} leaves no room for ${steps} steps`);

  const opts: BenchOptions = {
    lengths,
    prefillThreads: list(a["prefill-threads"], [1, 2]),
    decodeThreads: list(a["decode-threads"], [1]),
    steps,
    decodeRuns: Math.max(1, int(a["decode-runs"], quick ? 1 : 3, "decode-runs")),
    reps,
    defaultReps,
    chunk: int(a.chunk, ubatch, "chunk"),
    maxContext,
    warmupTokens: Math.min(quick ? 128 : 512, maxContext - 16),
    warmupSteps: quick ? 4 : 8,
    quietThreshold: num(a["quiet-threshold"], 0.35, "quiet-threshold"),
    cpus: machine.cpus,
    quietWaitS: num(a["quiet-wait"], quick ? 0 : 5, "quiet-wait"),
    retryBudgetS: num(a["retry-budget"], quick ? 0 : 150, "retry-budget"),
    retryMaxRunS: 30,
    flashAttention: faList,
    log,
  };
  if (steps < 1) opts.decodeThreads = [];

  const need = Math.max(...lengths.map((l) => effectiveLength(l, steps, maxContext)), opts.warmupTokens);
  const tokens = benchTokens((text) => rt.model.tokenize(text, false), need);
  const tokensSha = createHash("sha256").update(Int32Array.from(tokens)).digest("hex");

  const backends: Backend[] = [];
  if (ours) backends.push(ours);
  const llamaBackends: LlamaBackend[] = [];
  if (engines.includes("llama")) {
    faList.forEach((fa, i) => {
      const b = new LlamaBackend(rt, { batchSize: ubatch, flashAttention: fa }, i === 0);
      llamaBackends.push(b);
      backends.push(b);
    });
  }
  if (backends.length === 0) throw new Error("no engines selected");

  const otherAtStart = await currentOtherLoad();
  log(
    `machine: ${machine.cpuModel}, ${machine.cpus} CPUs, node ${machine.node}; other processes using ` +
      `${otherAtStart?.toFixed(2) ?? "?"} cores right now`,
  );
  const plan = lengths.map((l) => `${effectiveLength(l, steps, maxContext)}×${reps[l] ?? defaultReps}`).join(" ");
  log(
    `plan: prompts ${plan} | prefill threads ${opts.prefillThreads.join(",")} | decode threads ` +
      `${opts.decodeThreads.join(",") || "-"} × ${steps} steps | engines ${backends.map((b) => b.id).join(", ")}`,
  );

  // The memory roofline of decode: read bandwidth at one thread and at every decode thread count,
  // measured before and after the runs (a shared machine only ever lowers it; the best counts).
  const bwThreads = [...new Set([1, 2, ...opts.decodeThreads])].filter((t) => t <= machine.cpus).sort((x, y) => x - y);
  const bwPasses = quick ? 5 : 20;
  const bandwidthBefore = await readBandwidth(bwThreads, bwPasses, log);
  const measured = await runBench(backends, tokens, opts);
  const bandwidthAfter = await readBandwidth(bwThreads, bwPasses, log);
  const durationS = (performance.now() - t0) / 1000;

  // ---- describe what ran
  const llamaPkg = { version: await getModuleVersion() };
  const cpuBackends = mappedLibraries(/libggml-cpu[^/]*\.so/).map((p) => p.replace(/^.*\//, ""));
  const oursInfo = ours ? ours.info(opts.decodeThreads[0] ?? opts.prefillThreads[0] ?? 1) : undefined;

  const report = {
    schema: "ctxbank.bench.engine/1",
    ...record,
    durationS,
    quick,
    variants: backends.map((b) => ({ id: b.id, label: b.label })),
    git,
    machine: {
      ...machine,
      otherProcessesCoresAtStart: otherAtStart,
      loadAvgAtEnd: machineInfo().loadAvg,
      // Nice values of this process's threads at the end (engine and llama.cpp workers included).
      threadNice: [...new Set(threadNiceValues())].sort((x, y) => x - y),
      autogroup: autogroup(),
      ...(niceError ? { niceError } : {}),
      readBandwidth: {
        method: `native/src/membw.h: ${bwThreads.join(" and ")} thread(s) streaming 256 MiB, fastest of ${bwPasses} passes, before and after the runs`,
        before: bandwidthBefore,
        after: bandwidthAfter,
        best: bwThreads.map((t) => ({
          threads: t,
          gbPerS: Math.max(...[...bandwidthBefore, ...bandwidthAfter].filter((b) => b.threads === t).map((b) => b.gbPerS)),
        })),
      },
    },
    model: {
      ...(await fileStamp(modelPath)),
      name: rt.model.fileInfo.metadata?.general?.name,
      trainContext: nCtxTrain,
      ...(ours ? { config: ours.model.config, fingerprint: ours.model.fingerprint } : {}),
    },
    prompt: {
      source: `tools/lib/bench-text.ts: ${PARAGRAPHS.length} English paragraphs repeated, tokenized by node-llama-cpp model.tokenize (no special tokens)`,
      tokensPrepared: tokens.length,
      tokensSha256: tokensSha,
    },
    engines: {
      ...(ours
        ? {
            ours: {
              kernels: oursInfo!.kernels,
              ubatch,
              maxContext,
              kvCache: "F16",
              weightBytesPerToken: oursInfo!.weightBytesPerToken,
              addon: addonStamp,
              addonRebuiltDuringRun: (await fileStamp(addonPath)).sha256 !== addonStamp.sha256,
              api: "shared/inference/engine Engine.forward per prefill chunk / per decode step, greedy token from the engine (argmax)",
            },
          }
        : {}),
      ...(llamaBackends.length > 0
        ? {
            llama: {
              package: `node-llama-cpp@${llamaPkg.version}`,
              llamaCppRelease: rt.llama.llamaCppRelease,
              buildType: rt.llama.buildType,
              systemInfo: rt.llama.systemInfo.trim(),
              cpuBackendLoaded: cpuBackends,
              batchSize: ubatch,
              ubatch,
              kvCache: "F16",
              variants: llamaBackends.map((b) => ({
                id: b.id,
                flashAttentionRequested: b.opts.flashAttention,
                flashAttentionResolved: b.resolvedFlashAttention,
              })),
              api:
                "prefill: LlamaContextSequence.controlledEvaluate per chunk (last token: generateNext greedy); " +
                "decode: LlamaContextSequence.evaluate([first], {temperature: 0, yieldEogToken: true}) generator",
            },
          }
        : {}),
    },
    options: {
      lengths,
      prefillThreads: opts.prefillThreads,
      decodeThreads: opts.decodeThreads,
      steps,
      decodeRuns: opts.decodeRuns,
      reps,
      defaultReps,
      chunk: opts.chunk,
      warmupTokens: opts.warmupTokens,
      warmupSteps: opts.warmupSteps,
      quietThreshold: opts.quietThreshold,
      quietWaitS: opts.quietWaitS,
      retryBudgetS: opts.retryBudgetS,
      retryMaxRunS: opts.retryMaxRunS,
    },
    summary: summaryTables(measured.points, backends),
    chartSubtitle:
      `${machine.cpuModel}, ${machine.cpus} CPUs, node ${machine.node} | ours: ${oursInfo?.kernels ?? "-"} kernels, ubatch ${ubatch} | ` +
      `llama.cpp ${rt.llama.llamaCppRelease.release} via node-llama-cpp ${llamaPkg.version}, batch ${ubatch}, F16 KV, ` +
      `${llamaBackends.map((b) => `FA ${b.opts.flashAttention}→${b.resolvedFlashAttention}`).join(", ")} | ` +
      `${record.date.slice(0, 10)} @ ${git.commit?.slice(0, 8) ?? "?"}${git.dirty ? "+dirty" : ""}`,
    analysis: {
      decode: decodeBreakdown(measured.points),
      prefill: prefillBreakdown(measured.points, opts.chunk > 0 ? opts.chunk : ubatch),
      greedyAgreement: greedyAgreement(measured.points),
      contendedRuns: measured.points.flatMap((p) =>
        p.reps.filter((r) => r.contended).map((r) => `${p.engine} t=${p.threads} L=${p.promptTokens} rep ${r.rep}`),
      ),
      retrySpentS: measured.retrySpentS,
    },
    warmup: measured.warmup,
    points: measured.points,
  };

  await results.json("engine", report);
  await writeOutputs(report as unknown as Report, results);
  await rt.model.dispose();
  await rt.llama.dispose();
}

// ---------------------------------------------------------------------------------------------
// Outputs, all derived from the report object (so --replot can redo them from a saved JSON).

type Variant = { id: string; label: string };

interface Report {
  date: string;
  durationS: number;
  variants: Variant[];
  /** readBandwidth: absent in runs before it was measured. */
  machine: { cpuModel: string; cpus: number; readBandwidth?: { best: Array<{ threads: number; gbPerS: number }> } };
  model: { path: string; name?: string };
  engines: {
    ours?: { kernels: string; ubatch: number; weightBytesPerToken?: number };
    llama?: {
      package: string;
      llamaCppRelease: { release: string };
      variants: Array<{ id: string; flashAttentionRequested: string; flashAttentionResolved: string }>;
    };
  };
  options: { chunk: number };
  summary: ReturnType<typeof summaryTables>;
  chartSubtitle: string;
  analysis: Parameters<typeof renderBreakdown>[0];
  points: PointRecord[];
}

async function writeOutputs(report: Report, results: Results): Promise<void> {
  const variants = report.variants;
  report.summary = summaryTables(report.points, variants); // recomputed: older JSONs lack the contention marks
  const chunk = report.options.chunk > 0 ? report.options.chunk : (report.engines.ours?.ubatch ?? 512);
  const tables = renderTables(report.summary, variants);
  const roofline = rooflineTable(report, variants);
  if (roofline) tables.push(roofline);
  const breakdownText = renderBreakdown(report.analysis, variants);
  console.log(
    `\nctxbank engine benchmark — ${report.model.path.replace(/^.*\//, "")} — ${report.machine.cpuModel}, ${report.machine.cpus} CPUs — ${report.date}`,
  );
  const ll = report.engines.llama;
  console.log(
    `ours: kernels ${report.engines.ours?.kernels ?? "-"} | llama.cpp ${ll?.llamaCppRelease.release ?? "-"} (${ll?.package ?? "-"}), F16 KV, ` +
      `${(ll?.variants ?? []).map((v) => `FA ${v.flashAttentionRequested}→${v.flashAttentionResolved}`).join(", ")}\n`,
  );
  for (const t of tables) console.log(`${t.title}\n${textTable(t.table)}\n`);
  console.log(breakdownText.text);
  console.log(`\n(${report.durationS.toFixed(0)} s; results in ${results})`);

  const svg = renderChart(chartPanels(report.points, variants, chunk), {
    title: `Engine benchmark: ours vs llama.cpp — ${report.model.path.replace(/^.*\//, "")}`,
    subtitle: report.chartSubtitle,
    panelWidth: 430,
    panelHeight: 370,
  });
  await results.chart("engine", svg);
  const md = [...tables.map((t) => `**${t.title}**\n\n${markdownTable(t.table)}\n`), breakdownText.markdown, ""].join("\n");
  await results.markdown("engine", md);
}

// ---------------------------------------------------------------------------------------------
// Summary tables: one row per (length, threads), ours and every llama variant, ratio ours/llama.

interface SummaryRow {
  tokens: number;
  threads: number;
  values: Record<string, number | undefined>;
  ratios: Record<string, number | undefined>;
  /** Engines whose value at this point comes mostly from contended runs (more than half of the reps). */
  contended?: string[];
}

function summaryTables(points: PointRecord[], backends: Variant[]) {
  const build = (kind: "prefill" | "decode"): SummaryRow[] => {
    const rows = new Map<string, SummaryRow>();
    for (const p of points) {
      const v = kind === "prefill" ? p.prefill?.tokPerS.median : p.decode?.msPerToken.median;
      if (v === undefined) continue;
      const k = `${p.promptTokens}/${p.threads}`;
      const row = rows.get(k) ?? { tokens: p.promptTokens, threads: p.threads, values: {}, ratios: {}, contended: [] };
      row.values[p.engine] = v;
      if (2 * p.reps.filter((r) => r.contended).length > p.reps.length) row.contended!.push(p.engine);
      rows.set(k, row);
    }
    for (const row of rows.values()) {
      const o = row.values.ours;
      for (const b of backends)
        if (b.id !== "ours") row.ratios[b.id] = o !== undefined && row.values[b.id] ? o / row.values[b.id]! : undefined;
    }
    return [...rows.values()].sort((x, y) => x.threads - y.threads || x.tokens - y.tokens);
  };
  return {
    prefillTokPerS: build("prefill"),
    decodeMsPerToken: build("decode"),
    ratioNote: "ratio = ours / llama.cpp of the metric: prefill tok/s (>1: ours faster), decode ms/token (>1: ours slower)",
  };
}

function renderTables(s: ReturnType<typeof summaryTables>, backends: Variant[]): Array<{ title: string; table: Table }> {
  const llamas = backends.filter((b) => b.id !== "ours");
  const mk = (rows: SummaryRow[], kind: "prefill" | "decode"): Table => ({
    headers: [
      kind === "prefill" ? "prompt tokens" : "context",
      "threads",
      ...backends.map((b) => (kind === "prefill" ? `${b.label} tok/s` : `${b.label} ms/tok`)),
      ...(backends.some((b) => b.id === "ours") ? llamas.map((b) => (llamas.length > 1 ? `ours/${b.id}` : "ours/llama")) : []),
    ],
    rows: rows.map((r) => {
      const star = (id: string) => (r.contended?.includes(id) ? "*" : "");
      return [
        String(r.tokens),
        String(r.threads),
        ...backends.map((b) => fmtNum(r.values[b.id]) + star(b.id)),
        ...(backends.some((b) => b.id === "ours")
          ? llamas.map((b) => fmtNum(r.ratios[b.id], 2) + (star("ours") || star(b.id) ? "*" : ""))
          : []),
      ];
    }),
  });
  const anyStar = [...s.prefillTokPerS, ...s.decodeMsPerToken].some((r) => (r.contended?.length ?? 0) > 0);
  const star = anyStar ? " — * = most of the reps ran while other processes took CPU from it (see contendedRuns)" : "";
  const out: Array<{ title: string; table: Table }> = [];
  if (s.prefillTokPerS.length > 0)
    out.push({
      title: `Prefill throughput (tokens/s, median; higher is better; ratio >1 = ours faster)${star}`,
      table: mk(s.prefillTokPerS, "prefill"),
    });
  if (s.decodeMsPerToken.length > 0)
    out.push({
      title: `Decode latency (ms/token: mean over the N greedy steps, median over runs; lower is better; ratio >1 = ours slower)${star}`,
      table: mk(s.decodeMsPerToken, "decode"),
    });
  return out;
}

async function readBandwidth(threads: number[], passes: number, log: (line: string) => void): Promise<ReadBandwidth[]> {
  const out: ReadBandwidth[] = [];
  for (const t of threads) {
    const r = await addon().measureReadBandwidth(t, 256, passes);
    log(`read bandwidth, ${t} thread${t > 1 ? "s" : ""}: ${r.gbPerS.toFixed(1)} GB/s`);
    out.push(r);
  }
  return out;
}

/**
 * Decode against the memory roofline: a step reads every weight once, so weights per token /
 * read bandwidth (at the decode's thread count) is its floor; % = floor / measured time. llama.cpp
 * reads the same GGUF tensors (its Q4_1 and Q8_0 blocks take the bytes our packed groups do).
 */
function rooflineTable(report: Report, backends: Variant[]): { title: string; table: Table } | undefined {
  const bytes = report.engines.ours?.weightBytesPerToken;
  const bw = report.machine.readBandwidth?.best;
  if (!bytes || !bw || report.summary.decodeMsPerToken.length === 0) return undefined;
  const rows = report.summary.decodeMsPerToken.flatMap((r) => {
    const gb = bw.find((b) => b.threads === r.threads)?.gbPerS;
    if (!gb) return [];
    const floorMs = (bytes / (gb * 1e9)) * 1e3;
    return [
      [
        String(r.tokens),
        String(r.threads),
        fmtNum(gb, 1),
        fmtNum(floorMs, 2),
        ...backends.map((b) => (r.values[b.id] ? `${((100 * floorMs) / r.values[b.id]!).toFixed(0)}%` : "-")),
      ],
    ];
  });
  return {
    title:
      `Decode against the memory roofline: floor = ${(bytes / 1e6).toFixed(1)} MB of weights per token / the read bandwidth ` +
      `measured at the decode's thread count (KV reads not counted); % = floor / ms per token`,
    table: { headers: ["context", "threads", "read GB/s", "floor ms/tok", ...backends.map((b) => `${b.label} % of floor`)], rows },
  };
}

function greedyAgreement(points: PointRecord[]) {
  // Same point, same rep: how many greedy tokens (first + decoded) ours and llama.cpp agree on.
  const out: Array<{ engine: string; threads: number; context: number; agreeingTokens: number; of: number }> = [];
  const ours = points.filter((p) => p.engine === "ours" && p.decodeTimed);
  for (const o of ours) {
    for (const p of points) {
      if (p.engine === "ours" || !p.decodeTimed || p.threads !== o.threads || p.promptTokens !== o.promptTokens) continue;
      let agree = Infinity;
      let of = 0;
      for (let r = 0; r < Math.min(o.reps.length, p.reps.length); r++) {
        const a = [o.reps[r]!.first, ...(o.reps[r]!.decode?.tokens ?? [])];
        const b = [p.reps[r]!.first, ...(p.reps[r]!.decode?.tokens ?? [])];
        let k = 0;
        while (k < a.length && k < b.length && a[k] === b[k]) k++;
        agree = Math.min(agree, k);
        of = Math.max(of, a.length);
      }
      out.push({ engine: p.engine, threads: p.threads, context: p.promptTokens, agreeingTokens: agree === Infinity ? 0 : agree, of });
    }
  }
  return out;
}

function renderBreakdown(
  an: {
    decode: ReturnType<typeof decodeBreakdown>;
    prefill: ReturnType<typeof prefillBreakdown>;
    greedyAgreement: ReturnType<typeof greedyAgreement>;
    contendedRuns: string[];
  },
  backends: Variant[],
) {
  const label = (id: string) => backends.find((b) => b.id === id)?.label ?? id;
  const dec: Table = {
    headers: ["engine", "threads", "fixed ms/tok", "+ms per 1K ctx", "ctx share @ longest", "r²"],
    rows: an.decode.map((d) => [
      label(d.engine),
      String(d.threads),
      fmtNum(d.fixedMs),
      fmtNum(d.perKContextMs, 3),
      `${(100 * (d.contextShare[d.contextShare.length - 1]?.share ?? Number.NaN)).toFixed(0)}%`,
      fmtNum(d.r2, 3),
    ]),
  };
  const pre: Table = {
    headers: ["engine", "threads", "prompt", "first chunk ms", "last chunk ms", "+ms per 1K pos", "position share"],
    rows: an.prefill.map((p) => [
      label(p.engine),
      String(p.threads),
      String(p.promptTokens),
      fmtNum(p.firstChunkMs),
      fmtNum(p.lastChunkMs),
      fmtNum(p.perKPositionMs, 1),
      `${(100 * p.positionShare).toFixed(0)}%`,
    ]),
  };
  const agree =
    an.greedyAgreement.length > 0
      ? `Greedy tokens agreeing with ours (first token + decode steps, worst rep): ` +
        an.greedyAgreement
          .map(
            (g) =>
              `${new Set(an.greedyAgreement.map((x) => x.engine)).size > 1 ? `${g.engine} ` : ""}${g.context}: ${g.agreeingTokens}/${g.of}`,
          )
          .join(", ")
      : "";
  const cont =
    an.contendedRuns.length > 0
      ? `Runs still contended after retries: ${an.contendedRuns.join("; ")}`
      : "No run was contended by other processes (after retries).";
  const decTitle = "Decode breakdown: ms/token ≈ fixed + k·context (fit over the decode points; the context part is mostly attention)";
  const preTitle = "Prefill breakdown (longest prompt): time per chunk vs its position (growth with position ≈ attention)";
  return {
    text: [
      dec.rows.length ? `${decTitle}\n${textTable(dec)}\n` : "",
      pre.rows.length ? `${preTitle}\n${textTable(pre)}\n` : "",
      agree,
      cont,
    ]
      .filter(Boolean)
      .join("\n"),
    markdown: [
      dec.rows.length ? `**${decTitle}**\n\n${markdownTable(dec)}\n` : "",
      pre.rows.length ? `**${preTitle}**\n\n${markdownTable(pre)}\n` : "",
      agree,
      "",
      cont,
    ]
      .filter((x) => x !== undefined)
      .join("\n"),
  };
}

// ---------------------------------------------------------------------------------------------
// Chart

const COLORS: Record<string, string> = {
  ours: "#1f77b4",
  llama: "#ff7f0e",
  "llama-fa-on": "#2ca02c",
  "llama-fa-off": "#9467bd",
  "llama-fa-auto": "#8c564b",
};
const DASH = ["", "7 4", "2 3", "10 3 2 3"];

function chartPanels(points: PointRecord[], backends: Variant[], chunk: number): Panel[] {
  const threadsOf = (kind: "prefill" | "decode") =>
    [...new Set(points.filter((p) => (kind === "prefill" ? p.prefill : p.decode)).map((p) => p.threads))].sort((a, b) => a - b);
  const series = (kind: "prefill" | "decode"): Series[] => {
    const out: Series[] = [];
    const ts = threadsOf(kind);
    for (const b of backends) {
      ts.forEach((t, ti) => {
        const ps = points.filter((p) => p.engine === b.id && p.threads === t && (kind === "prefill" ? p.prefill : p.decode));
        if (ps.length === 0) return;
        out.push({
          name: `${b.label}, ${t} thread${t > 1 ? "s" : ""}`,
          color: COLORS[b.id] ?? "#444",
          dash: DASH[ti % DASH.length],
          points: ps
            .sort((x, y) => x.promptTokens - y.promptTokens)
            .map((p) => [p.promptTokens, kind === "prefill" ? p.prefill!.tokPerS.median : p.decode!.msPerToken.median]),
          labels: kind === "decode" || ts.length * backends.length <= 2,
        });
      });
    }
    return out;
  };
  const panels: Panel[] = [];
  const pre = series("prefill");
  if (pre.length)
    panels.push({
      title: "Prefill throughput (higher is better)",
      xLabel: "prompt length (tokens)",
      yLabel: "tokens / s",
      xLog2: true,
      series: pre,
      yTickFormat: (v) => String(Math.round(v)),
      xTickFormat: (v) => String(v),
    });
  const dec = series("decode");
  if (dec.length)
    panels.push({
      title: "Decode latency (lower is better)",
      xLabel: "context at start of decode (tokens; linear axis)",
      yLabel: "ms / token",
      series: dec,
      yTickFormat: (v) => (v >= 10 ? String(Math.round(v)) : String(Number(v.toFixed(1)))),
      xTickFormat: (v) => String(v),
    });
  // Per-chunk prefill time of the longest prompt at the lowest prefill thread count.
  const t = threadsOf("prefill")[0];
  if (t !== undefined) {
    const chunkSeries: Series[] = [];
    for (const b of backends) {
      const ps = points.filter((p) => p.engine === b.id && p.threads === t && p.prefill);
      const longest = ps.sort((x, y) => y.promptTokens - x.promptTokens)[0];
      if (!longest || longest.prefill!.chunkMsMedian.length < 2) continue;
      const full = longest.prefill!.chunkMsMedian.slice(0, Math.floor(longest.promptTokens / chunk));
      chunkSeries.push({ name: b.label, color: COLORS[b.id] ?? "#444", points: full.map((ms, i) => [i * chunk, ms]) });
    }
    if (chunkSeries.length)
      panels.push({
        title: `Prefill time per ${chunk}-token chunk (${t} thread${t > 1 ? "s" : ""})`,
        xLabel: "chunk start position (tokens)",
        yLabel: "ms per chunk",
        series: chunkSeries,
        xTicks: chunkTicks(Math.max(...chunkSeries.flatMap((s) => s.points.map(([px]) => px))), chunk),
        xTickFormat: (v) => String(v),
        yTickFormat: (v) => String(Math.round(v)),
        note: "growth with position = attention over the cached context",
      });
  }
  return panels;
}

function chunkTicks(maxPos: number, chunk: number): number[] {
  const step = maxPos >= 6144 ? 2048 : maxPos >= 2048 ? 1024 : chunk;
  const out: number[] = [];
  for (let x = 0; x <= maxPos + 1; x += step) out.push(x);
  return out;
}

main().catch((err: unknown) => {
  console.error(err instanceof Error ? (err.stack ?? err.message) : err);
  process.exitCode = 1;
});

export type { BenchResult };
