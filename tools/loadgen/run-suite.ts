// npm run bench:loadgen -- --suite [options]   (also: npx tsx tools/loadgen/run-suite.ts)
//
// The committed load test of ctxbank on this machine: two workloads (short chat 256 in / 128 out,
// long-document QA 4K in / 128 out) × two deployments (colocated `ctxbank serve`; disaggregated
// `ctxbank prefill` + `ctxbank decode` on a PostgreSQL 15) × two decode policies (`full`, and
// `omnikv` with the server's defaults), each swept for the highest Poisson rate with >= 90% SLO
// attainment (DistServe's definition). Writes results/loadgen/suite.json, suite.md,
// attainment.svg, cdf.svg.
import { rm } from "node:fs/promises";
import os from "node:os";
import { join } from "node:path";
import { resolveModel } from "../../shared/inference/model/resolve.ts";
import { benchCli, REPO_ROOT, type Results, type RunRecord } from "../lib/bench-runner.ts";
import { setProcessNice } from "../lib/machine.ts";
import { fmtNum, markdownTable } from "../../shared/platform/table.ts";
import { waitForQuiet, type QuietWaitResult } from "../lib/timing.ts";
import { StreamingClient } from "./client.ts";
import { loadCorpus } from "./corpus.ts";
import { startDeployment, type DeploymentKind } from "./deployments.ts";
import { cpuSnapshot, cpuUse, type CpuUse } from "./machine-load.ts";
import { PromptSource } from "./prompts.ts";
import { attainmentPanel, cdfPanel, chart, compactResult } from "./report.ts";
import { runLoad } from "./runner.ts";
import type { RunStats } from "./stats.ts";
import { runSweep } from "./sweep-run.ts";
import type { SweepStop } from "./sweep.ts";
import { policyValues } from "./target.ts";
import type { RequestResult, Slo } from "./types.ts";
import { describeWorkload, WorkloadFactory, type WorkloadSpec } from "./workloads.ts";

const log = (m: string) => process.stderr.write(`[suite] ${m}\n`);

const HELP = `  --workloads LIST     short,long (default both)
  --deployments LIST   colocated,disaggregated (default both)
  --policies LIST      full,omnikv (default both; any ctxbank policy kind)
  --serve-threads N    engine threads of the colocated \`ctxbank serve\` (default 2: both cores)
  --prefill-threads N  engine threads of the disaggregated prefill process (default 1; decode has 1:
                       one core per phase — a 2-thread prefill next to a busy decode process stalls
                       at every barrier of its thread pool, see README)
  --nice=N             nice of this process and the services (default -10; needs root)
  --budget-scale F     multiply every sweep's time budget by F (finer long-document sweeps need ~3)`;

export interface WorkloadDef {
  id: string;
  name: string;
  spec: WorkloadSpec;
  slo: Slo;
  /** Requests per sweep point. */
  perPoint: number;
  /** First rate = startFactor / unloaded TTFT (s). */
  startFactor: number;
  factor: number;
  relTol: number;
  maxPoints: number;
  /** Wall-clock budget of one sweep, s. */
  budgetS: number;
  /** Lowest rate tried = first rate / minRateDiv. */
  minRateDiv: number;
  /** Requests run alone before the sweep, the unloaded reference (their median). */
  refRequests: number;
}

// SLOs for this 2-vCPU box and SmolLM2-135M, from unloaded single requests measured on it
// (colocated, full, warmed up; see README): short chat TTFT ~0.4-0.6 s, TPOT ~9-12 ms; long
// document TTFT ~14-20 s (a 4K prefill on 2 threads), TPOT ~25-45 ms. Each SLO is a few times
// the unloaded figure, as DistServe sets them relative to the model's unloaded latency.
export function workloads(quick: boolean): WorkloadDef[] {
  return [
    {
      id: "short",
      name: "short chat (256 in / 128 out)",
      spec: {
        kind: "synthetic",
        endpoint: "chat",
        input: { kind: "fixed", value: 256 },
        output: { kind: "fixed", value: quick ? 32 : 128 },
        promptFormat: "text",
      },
      slo: { ttftMs: 2000, tpotMs: 50 },
      perPoint: quick ? 8 : 20,
      startFactor: 0.5,
      factor: 2,
      relTol: 0.15,
      maxPoints: quick ? 3 : 6,
      budgetS: quick ? 60 : 140,
      minRateDiv: 8,
      refRequests: 2,
    },
    {
      id: "long",
      name: `long document QA (${quick ? "1K" : "4K"} in / 128 out)`,
      spec: {
        kind: "longdoc",
        endpoint: "chat",
        input: { kind: "fixed", value: quick ? 1024 : 4096 },
        output: { kind: "fixed", value: quick ? 32 : 128 },
      },
      slo: quick ? { ttftMs: 8000, tpotMs: 200 } : { ttftMs: 45_000, tpotMs: 150 },
      // 10 requests per point, so one miss is allowed; a point at these rates takes 5-20 minutes,
      // so the sweep starts near the queueing bound (a quarter of the unloaded prefill rate) and
      // stops at a x1.4 bracket.
      perPoint: quick ? 3 : 10,
      startFactor: quick ? 0.7 : 0.25,
      factor: 1.4,
      relTol: quick ? 0.3 : 0.45,
      maxPoints: quick ? 2 : 4,
      budgetS: quick ? 90 : 2400,
      minRateDiv: 4,
      refRequests: 1,
    },
  ];
}

/** Other work using more than this many cores during a point marks it disturbed (repeated once). */
const DISTURBED_CORES = 0.5;

/** Every request is greedy: outputs run to max_tokens far more often (ctxbank has no ignore_eos). */
const REQUEST_FIELDS = { temperature: 0 };

interface PointRecord {
  rate: number;
  /** 0 = first run at this rate; a repeat follows a run disturbed by other load. */
  attempt: number;
  /** Other processes used more than DISTURBED_CORES during the run (it was repeated if time allowed). */
  disturbed: boolean;
  attainment: number;
  pass: boolean;
  stats: RunStats;
  cpu: CpuUse;
  qa?: { checked: number; correct: number };
  /** Per request (no text, no ITL gaps), kept for every point. */
  requests: Array<Record<string, unknown>>;
  /** Client-side TTFT minus the server's own (ctxbank extension), ms: network + client overhead. */
  clientMinusServerTtftMs?: number;
}

export interface ConfigRecord {
  workload: string;
  deployment: DeploymentKind;
  policy: string;
  slo: Slo;
  /** The wait for other work to calm down before this configuration. */
  quiet: QuietWaitResult;
  unloaded: { ttftMs?: number; tpotMs?: number; e2eMs?: number; outputTokens: number; promptTokens?: number };
  startRate: number;
  drainS: number;
  maxRate?: number;
  failRate?: number;
  stoppedBy: SweepStop;
  wallS: number;
  points: PointRecord[];
}

function parse(argv: string[]) {
  const bench = benchCli(
    {
      name: "loadgen",
      script: "npm run bench:loadgen -- --suite",
      options: {
        workloads: { type: "string" },
        deployments: { type: "string" },
        policies: { type: "string" },
        nice: { type: "string" },
        "serve-threads": { type: "string" },
        "prefill-threads": { type: "string" },
        "budget-scale": { type: "string" },
      },
      help: HELP,
      quick: "a smoke run: small points and budgets, long document at 1K",
      replot: true,
    },
    argv,
  );
  const { values, quick } = bench;
  const list = (v: string | undefined, def: string[], allowed?: string[]) => {
    const xs = (v ?? def.join(","))
      .split(",")
      .map((s) => s.trim())
      .filter(Boolean);
    for (const x of xs)
      if (allowed && !allowed.includes(x)) throw new Error(`unknown value ${JSON.stringify(x)} (allowed: ${allowed.join(", ")})`);
    return xs;
  };
  const nice = Number(values.nice ?? -10);
  if (!Number.isInteger(nice) || nice < -20 || nice > 19) throw new Error("--nice must be an integer in [-20, 19]");
  const threads = (flag: string, v: string | undefined, def: number) => {
    const n = Number(v ?? def);
    if (!Number.isInteger(n) || n < 1 || n > 64) throw new Error(`--${flag} must be an integer in [1, 64]`);
    return n;
  };
  const options = {
    quick,
    nice,
    workloads: list(values.workloads, ["short", "long"], ["short", "long"]),
    deployments: list(values.deployments, ["colocated", "disaggregated"], ["colocated", "disaggregated"]) as DeploymentKind[],
    policies: list(values.policies, ["full", "omnikv"]),
    serveThreads: threads("serve-threads", values["serve-threads"], 2),
    prefillThreads: threads("prefill-threads", values["prefill-threads"], 1),
    budgetScale: (() => {
      const f = Number(values["budget-scale"] ?? 1);
      if (!(f > 0 && f <= 100)) throw new Error("--budget-scale must be a number in (0, 100]");
      return f;
    })(),
  };
  return { bench, options };
}

const median = (xs: number[]) => {
  const s = [...xs].sort((a, b) => a - b);
  return s.length === 0 ? undefined : s.length % 2 ? s[(s.length - 1) / 2]! : (s[s.length / 2 - 1]! + s[s.length / 2]!) / 2;
};

export async function suiteMain(argv: string[]): Promise<void> {
  const { bench, options: o } = parse(argv);
  const { results } = bench;
  if (bench.replot) {
    await writeOutputs(results, await results.readJson<SuiteResult>("suite"), false);
    return;
  }
  const record = bench.record(["tools/loadgen", "services", "shared", "native/src"]);
  const niceError = setProcessNice(o.nice);
  if (niceError) log(`could not set nice ${o.nice}: ${niceError} (running at the default priority)`);
  const defs = workloads(o.quick)
    .filter((w) => o.workloads.includes(w.id))
    .map((w) => ({ ...w, budgetS: w.budgetS * o.budgetScale }));
  const modelPath = await resolveModel();
  log("corpus and tokenizer");
  const corpus = loadCorpus(join(REPO_ROOT, "node_modules"));
  const prompts = PromptSource.fromGguf(modelPath, corpus.text);
  const t0 = performance.now();
  const configs: ConfigRecord[] = [];
  const result: SuiteResult = {
    benchmark: "loadgen-suite",
    command: record.command,
    started: record.date,
    finished: "",
    wallS: 0,
    options: o,
    requestFields: REQUEST_FIELDS,
    workloads: defs.map((d) => ({
      id: d.id,
      name: d.name,
      description: describeWorkload(d.spec),
      slo: d.slo,
      perPoint: d.perPoint,
      startFactor: d.startFactor,
      factor: d.factor,
      relTol: d.relTol,
      maxPoints: d.maxPoints,
      budgetS: d.budgetS,
      refRequests: d.refRequests,
    })),
    machine: record.machine,
    loadAvgBefore: os.loadavg(),
    loadAvgAfter: [],
    git: record.git,
    model: modelPath,
    deployments: [],
    configs,
  };

  // Ctrl-C / SIGTERM: stop the services of the deployment under test before exiting.
  let current: { stop(): Promise<void> } | undefined;
  for (const sig of ["SIGINT", "SIGTERM"] as const) {
    process.once(sig, () => {
      log(`${sig}: stopping the services`);
      void (current?.stop() ?? Promise.resolve()).finally(() => process.exit(130));
    });
  }
  for (const kind of o.deployments) {
    log(`starting ${kind}`);
    const dep = await startDeployment(kind, {
      serveThreads: o.serveThreads,
      prefillThreads: o.prefillThreads,
      decodeThreads: 1,
      nice: o.nice,
    });
    current = dep;
    log(
      `${kind}: ${dep.baseUrl} (${dep.processes.map((p) => `${p.role} pid ${p.pid}, ${p.threads} threads${p.reniced ? `, nice ${o.nice}` : ""}`).join("; ")})`,
    );
    result.deployments.push({ kind, processes: dep.processes });
    try {
      // Warm-up, not recorded: one request of each workload pays JIT, connection set-up and the
      // engine's first-use allocations at both prompt sizes.
      const warmClient = new StreamingClient({ baseUrl: dep.baseUrl, model: "default", timeoutMs: 30 * 60_000, extraBody: REQUEST_FIELDS });
      for (const w of defs) {
        const r = await runLoad(warmClient, new WorkloadFactory(w.spec, prompts), {
          arrivals: { kind: "concurrency", concurrency: 1 },
          maxRequests: 1,
          durationS: 1e6,
          drainS: 0,
          warmup: 0,
          seed: 98,
          progress: false,
        });
        if (!r.results[0]?.ok) throw new Error(`${kind}: warm-up request failed: ${r.results[0]?.error}`);
      }
      await warmClient.close();
      for (const w of defs) {
        for (const policy of o.policies) {
          const path = new URL(dep.baseUrl).pathname + "/chat/completions";
          if (policy !== "full") {
            const allowed = await policyValues(dep.baseUrl, path);
            if (!allowed?.includes(policy) && !allowed?.includes("*"))
              throw new Error(`the server does not take policy ${policy} (allowed: ${allowed?.join(", ") ?? "no /openapi.json"})`);
          }
          const client = new StreamingClient({
            baseUrl: dep.baseUrl,
            model: "default",
            timeoutMs: 30 * 60_000,
            extraBody: { ...REQUEST_FIELDS, policy },
          });
          try {
            configs.push(
              await runConfig(
                client,
                new WorkloadFactory(w.spec, prompts),
                w,
                kind,
                policy,
                dep.processes.map((p) => p.pid),
              ),
            );
            await results.json("suite.partial", result);
          } finally {
            await client.close();
          }
        }
      }
    } finally {
      await dep.stop();
      current = undefined;
    }
  }
  result.finished = new Date().toISOString();
  result.wallS = (performance.now() - t0) / 1000;
  result.loadAvgAfter = os.loadavg();
  await writeOutputs(results, result, true);
  await rm(join(results.dir, "suite.partial.json"), { force: true });
}

async function runConfig(
  client: StreamingClient,
  factory: WorkloadFactory,
  w: WorkloadDef,
  deployment: DeploymentKind,
  policy: string,
  pids: number[],
): Promise<ConfigRecord> {
  const label = `${w.id}/${deployment}/${policy}`;
  // Other agents share the box: wait up to a minute for them to use < 0.7 cores (the idle services
  // under test count as "other" too, and use ~0); the wait and the load are recorded.
  const quiet = await waitForQuiet(0.7, 60_000);
  if (!quiet.quiet) log(`${label}: other processes use ${fmtNum(quiet.otherCores, 2)} cores; starting anyway`);
  const t0 = performance.now();
  // The unloaded reference: requests one at a time on the warmed-up deployment.
  const warm = await runLoad(client, factory, {
    arrivals: { kind: "concurrency", concurrency: 1 },
    maxRequests: w.refRequests,
    durationS: 1e6,
    drainS: 0,
    warmup: 0,
    seed: 99,
    progress: false,
  });
  const ref = warm.results.filter((r) => r.ok);
  if (ref.length === 0) throw new Error(`${label}: unloaded requests failed: ${warm.results.map((r) => r.error).join("; ")}`);
  const unloaded = {
    ttftMs: median(ref.map((r) => r.ttftMs!)),
    tpotMs: median(ref.filter((r) => r.tpotMs !== undefined).map((r) => r.tpotMs!)),
    e2eMs: median(ref.map((r) => r.e2eMs!)),
    outputTokens: median(ref.map((r) => r.outputTokens)) ?? 0,
    promptTokens: median(ref.map((r) => r.promptTokens ?? r.promptTokensSent)),
  };
  const startRate = w.startFactor / (unloaded.ttftMs! / 1000);
  log(
    `${label}: unloaded TTFT ${fmtNum(unloaded.ttftMs)} ms, TPOT ${fmtNum(unloaded.tpotMs)} ms, ${unloaded.outputTokens} tokens; sweep from ${startRate.toPrecision(3)} req/s`,
  );
  const points: PointRecord[] = [];
  let snap = cpuSnapshot(pids);
  let lastUse: CpuUse | undefined;
  const sw = await runSweep(client, factory, {
    slo: w.slo,
    startRate,
    target: 0.9,
    relTol: w.relTol,
    factor: w.factor,
    perPoint: w.perPoint,
    maxPoints: w.maxPoints,
    budgetS: w.budgetS,
    maxOutputTokens: w.spec.output.kind === "fixed" ? w.spec.output.value : w.spec.output.max,
    seed: 1,
    minRate: startRate / w.minRateDiv,
    label,
    progress: true,
    retries: 1,
    beforePoint: async () => {
      const q = await waitForQuiet(DISTURBED_CORES, 45_000);
      if (!q.quiet) log(`${label}: other processes use ${fmtNum(q.otherCores, 2)} cores; running the point anyway`);
      snap = cpuSnapshot(pids);
    },
    disturbed: () => {
      lastUse = cpuUse(snap, cpuSnapshot(pids));
      return (lastUse.foreignCores ?? 0) > DISTURBED_CORES;
    },
    onPoint: (rate, run, attempt) => {
      const ok = run.results.filter((r) => r.ok && r.server && r.ttftMs !== undefined);
      const attainment = run.stats.slo?.attainment ?? 0;
      const cpu = lastUse!;
      points.push({
        rate,
        attempt,
        disturbed: (cpu.foreignCores ?? 0) > DISTURBED_CORES,
        attainment,
        pass: attainment >= 0.9,
        stats: run.stats,
        cpu,
        qa: run.qa,
        requests: run.results.map((r) => compactResult(r, false)),
        clientMinusServerTtftMs: median(ok.map((r) => r.ttftMs! - r.server!.ttftMs)),
      });
      log(
        `${label} @ ${rate.toPrecision(3)} req/s: attainment ${(100 * attainment).toFixed(0)}%, TTFT p90 ${fmtNum(run.stats.ttftMs.p90)} ms, TPOT p90 ${fmtNum(run.stats.tpotMs.p90)} ms, foreign load ${fmtNum(points.at(-1)!.cpu.foreignCores)} cores`,
      );
    },
  });
  const rec: ConfigRecord = {
    workload: w.id,
    deployment,
    policy,
    slo: w.slo,
    quiet,
    unloaded,
    startRate,
    drainS: sw.drainS,
    stoppedBy: sw.result.stoppedBy,
    wallS: (performance.now() - t0) / 1000,
    points,
  };
  if (sw.result.maxRate !== undefined) rec.maxRate = sw.result.maxRate;
  if (sw.result.failRate !== undefined) rec.failRate = sw.result.failRate;
  log(
    `${label}: max rate at >= 90% attainment ${rec.maxRate?.toPrecision(3) ?? "none"} req/s (lowest failing ${rec.failRate?.toPrecision(3) ?? "none"}; ${rec.stoppedBy}; ${fmtNum(rec.wallS)} s)`,
  );
  return rec;
}

export interface SuiteResult {
  benchmark: "loadgen-suite";
  command: string;
  started: string;
  finished: string;
  wallS: number;
  options: ReturnType<typeof parse>["options"];
  requestFields: Record<string, unknown>;
  workloads: Array<{
    id: string;
    name: string;
    description: string;
    slo: Slo;
    perPoint: number;
    startFactor: number;
    factor: number;
    relTol: number;
    maxPoints: number;
    budgetS: number;
    refRequests: number;
  }>;
  machine: RunRecord["machine"];
  loadAvgBefore: number[];
  loadAvgAfter: number[];
  git: RunRecord["git"];
  model: string;
  deployments: Array<{ kind: DeploymentKind; processes: Array<{ role: string; pid: number; threads: number; reniced: boolean }> }>;
  configs: ConfigRecord[];
}

const configLabel = (c: ConfigRecord) => `${c.deployment}, ${c.policy}`;
const rateText = (r: number | undefined) => (r === undefined ? "—" : r.toPrecision(3));

/** The run at each rate the search used: the last attempt (a repeat replaces a disturbed run). */
export function finalPoints(c: ConfigRecord): PointRecord[] {
  return c.points.filter((p) => !c.points.some((q) => q.rate === p.rate && q.attempt > p.attempt));
}

/** The highest passing point (or the lowest-rate point when none passed): its requests for the CDFs. */
function refPoint(c: ConfigRecord): PointRecord | undefined {
  const pts = finalPoints(c);
  const passing = pts.filter((p) => p.pass).sort((a, b) => b.rate - a.rate);
  return passing[0] ?? [...pts].sort((a, b) => a.rate - b.rate)[0];
}

export function suiteMarkdown(r: SuiteResult): string {
  const rows = r.configs.map((c) => {
    const p = refPoint(c);
    const foreign = c.points.map((x) => x.cpu.foreignCores ?? 0);
    return [
      r.workloads.find((w) => w.id === c.workload)?.name ?? c.workload,
      c.deployment,
      c.policy,
      `${fmtNum(c.slo.ttftMs / 1000)} s / ${c.slo.tpotMs} ms`,
      `${fmtNum(c.unloaded.ttftMs)} / ${fmtNum(c.unloaded.tpotMs)}`,
      `**${rateText(c.maxRate)}**`,
      rateText(c.failRate),
      c.points
        .map(
          (x) =>
            `${x.rate.toPrecision(2)}:${Math.round(100 * x.attainment)}%${x.disturbed ? "*" : ""}${c.points.some((q) => q.rate === x.rate && q.attempt > x.attempt) ? "(repeated)" : ""}`,
        )
        .join(" "),
      p ? `${fmtNum(p.stats.ttftMs.p90)} / ${fmtNum(p.stats.tpotMs.p90)}` : "—",
      p ? fmtNum(p.stats.outputTokens.mean) : "—",
      `${fmtNum(Math.min(...foreign), 2)}–${fmtNum(Math.max(...foreign), 2)}`,
      `${c.stoppedBy}, ${fmtNum(c.wallS, 0)} s`,
    ];
  });
  return markdownTable({
    headers: [
      "workload",
      "deployment",
      "policy",
      "SLO TTFT / TPOT",
      "unloaded TTFT / TPOT ms",
      "max rate ≥90% (req/s)",
      "lowest failing",
      "points (rate:attainment)",
      "at max rate: TTFT p90 / TPOT p90 ms",
      "out tokens",
      "foreign load (cores)",
      "sweep",
    ],
    rows,
  });
}

async function writeOutputs(results: Results, r: SuiteResult, writeData: boolean): Promise<void> {
  if (writeData) await results.json("suite", r);
  const md = [
    `Run ${r.started} → ${r.finished} (${fmtNum(r.wallS / 60, 1)} min), load average before ${r.loadAvgBefore.map((x) => x.toFixed(2)).join(" ")}, after ${r.loadAvgAfter.map((x) => x.toFixed(2)).join(" ")}.`,
    "",
    suiteMarkdown(r),
    "",
    `Points: rate (req/s):attainment; * = other processes used more than ${DISTURBED_CORES} cores during the point; (repeated) = a disturbed run that was run again, the repeat is what the search used.`,
    "",
  ].join("\n");
  await results.markdown("suite", md);
  const sub = `${r.machine.cpuModel}, ${r.machine.cpus} vCPUs shared with other work; Poisson arrivals; >= 90% of requests meeting both SLOs`;
  const panels = r.workloads.map((w) => {
    const cs = r.configs.filter((c) => c.workload === w.id);
    return attainmentPanel(
      w.name,
      cs.map((c) => ({ label: configLabel(c), points: finalPoints(c) })),
      0.9,
      `SLO TTFT ${fmtNum(w.slo.ttftMs / 1000)} s, TPOT ${w.slo.tpotMs} ms; ${w.perPoint} requests per point`,
    );
  });
  await results.chart("attainment", chart(panels, "ctxbank SLO attainment vs Poisson rate", sub));
  const cdfs = r.workloads.flatMap((w) => {
    const cs = r.configs.filter((c) => c.workload === w.id);
    const vals = (key: "ttftMs" | "tpotMs") =>
      cs.map((c) => {
        const p = refPoint(c);
        const reqs = (p?.requests ?? []) as unknown as RequestResult[];
        return {
          label: `${configLabel(c)} @ ${p?.rate.toPrecision(2) ?? "?"} req/s`,
          values: reqs.filter((x) => x.ok && x[key] !== undefined).map((x) => x[key]!),
        };
      });
    return [
      cdfPanel(
        `${w.name}: TTFT`,
        vals("ttftMs"),
        "TTFT (s)",
        true,
        "at each configuration's highest passing rate (or its lowest rate)",
        w.slo.ttftMs,
      ),
      cdfPanel(`${w.name}: TPOT`, vals("tpotMs"), "TPOT (ms)", false, undefined, w.slo.tpotMs),
    ];
  });
  await results.chart("cdf", chart(cdfs, "ctxbank latency CDFs at the highest passing rate", sub));
  process.stdout.write(md);
  log(`wrote ${results}/suite.json, suite.md, attainment.svg, cdf.svg`);
}

if (process.argv[1]?.endsWith("run-suite.ts")) {
  suiteMain(process.argv.slice(2)).catch((e: unknown) => {
    process.stderr.write(`[suite] failed: ${(e as Error).stack ?? e}\n`);
    process.exit(1);
  });
}
