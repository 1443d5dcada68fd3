// npm run bench:sessions [-- options]   (tsx bench/sessions/run.ts)
//
// Issue 27's benchmark: what keeping a conversation's KV between turns, routing a turn to the
// decode that holds it, and computing short prompts on the decode (conditional disaggregation) buy
// on this machine. Three parts; each compares its configurations under the same load (the same
// seeded workload and arrival process), one configuration after the other, each on a fresh
// deployment of processes (bench/sessions/deploy.ts):
//   A. sessions: `ctxbank serve` with sessions against `serve --session-bytes 0` (every turn
//      recomputes its history), the load generator's multi-turn workload (8 turns of ~1K tokens,
//      short answers, session ids sent): TTFT p50/p90 per turn, the last turn's ratio (target ≥ 5×);
//   B. router: PostgreSQL + 2 prefill + 2 decode + `ctxbank router`, `--router-policy kv` against
//      `round_robin`, the same multi-turn workload, a conversation starting every T seconds (a rate
//      that loads the box): goodput at the SLO, TTFT p50/p90 per turn, route reasons, reused tokens
//      and prefill placements (target ≥ 1.5× round robin's goodput);
//   C. short chat (128-token prompts, 64-token answers, no sessions) at a fixed Poisson rate:
//      `serve` colocated against a prefill + decode pair with `--local-prefill-tokens 512`
//      (conditional: these prompts are computed on the decode) and `--local-prefill-tokens 0`
//      (always remote), clients talking to the decode directly: goodput at the SLO, TTFT and TPOT
//      (target: conditional ≥ colocated).
// Goodput in B and C is taken at the offered load, which every configuration of a part gets the
// same (the same seeded arrivals and requests): offered requests/s × the share of all requests
// that met both SLOs (failures count as misses). So the ratio of two configurations is the ratio
// of their requests that met the SLOs. The load generator's own goodput (met / first send to last
// completion) is in the tables too; at a load both keep up with it differs only by when the run's
// last answer ended.
// Writes results/sessions/sessions.json, sessions.md and one SVG chart per part (no README).
import { join } from "node:path";
import { resolveModel } from "../../shared/inference/model/resolve.ts";
import { benchCli, REPO_ROOT, type RunRecord } from "../../tools/lib/bench-runner.ts";
import { writeFileAtomic } from "../../tools/lib/json.ts";
import type { Panel, Series } from "../../tools/lib/svg-chart.ts";
import { fmtNum, markdownTable } from "../../shared/platform/table.ts";
import { waitForQuiet, type QuietWaitResult } from "../../tools/lib/timing.ts";
import { describeArrivals, type ArrivalSpec } from "../../tools/loadgen/arrivals.ts";
import { StreamingClient } from "../../tools/loadgen/client.ts";
import { loadCorpus } from "../../tools/loadgen/corpus.ts";
import { cpuSnapshot, cpuUse, type CpuUse } from "../../tools/loadgen/machine-load.ts";
import { PromptSource } from "../../tools/loadgen/prompts.ts";
import { cdfPanel, chart, compactResult, roundsTable, serverCountsLine, statsTable } from "../../tools/loadgen/report.ts";
import { runLoad } from "../../tools/loadgen/runner.ts";
import type { RoundStats, RunStats, ServerCounts } from "../../tools/loadgen/stats.ts";
import { firstModel } from "../../tools/loadgen/target.ts";
import type { RequestResult, Slo } from "../../tools/loadgen/types.ts";
import { describeWorkload, WorkloadFactory, type WorkloadSpec } from "../../tools/loadgen/workloads.ts";
import { startDisaggregated, startServe, type Deployment } from "./deploy.ts";

const PARTS = ["a", "b", "c"] as const;
type Part = (typeof PARTS)[number];

const bench = benchCli({
  name: "sessions",
  script: "npm run bench:sessions --",
  options: {
    parts: { type: "string" },
    "quiet-cores": { type: "string" },
    "quiet-wait": { type: "string" },
    "b-every": { type: "string" },
  },
  help: [
    "  --parts LIST       which parts to run, comma-separated: a (sessions), b (router), c (short chat); default all",
    "  --quiet-cores C    before each configuration, wait until other processes use < C cores (default 0.5)",
    "  --quiet-wait S     ... but at most S seconds, then measure anyway (recorded; default 60)",
    "  --b-every S        part B: a new conversation every S seconds (default 60; a sweep of runs finds each router's goodput)",
  ].join("\n"),
  quick: "2-3 short conversations of 3 turns, 12 short chats per configuration: a smoke run of every part (2 minutes)",
  replot: true,
});

const log = (m: string) => process.stderr.write(`[sessions] ${new Date().toISOString().slice(11, 19)} ${m}\n`);

// ---------------------------------------------------------------------------------------------
// What each part runs. Session memory: 8 turns of ~1K tokens are ~8K tokens of KV (~185 MB with
// this model's ~23 KB a token); the budget (and one key's share: requests here carry no API key,
// so they all are one tenant's) holds every conversation of a run with room to spare.

const GiB = 1 << 30;
const SESSION_ARGS = ["--session-bytes", String(4 * GiB), "--session-bytes-per-key", String(4 * GiB)];

interface MultiturnPlan {
  conversations: number;
  turns: number;
  /** New user tokens per turn, and the answer's max_tokens. */
  turnTokens: number;
  answerTokens: number;
  thinkS: number;
}

interface Plan {
  a: MultiturnPlan & { concurrency: number; serveThreads: number };
  /** Conversations start one every `everyS` seconds (regular: with a handful of conversations a Poisson draw's load is mostly the seed's). */
  b: MultiturnPlan & { everyS: number; slo: Slo };
  c: {
    requests: number;
    rate: number;
    input: number;
    output: number;
    slo: Slo;
    serveThreads: number;
    prefillThreads: number;
    decodeThreads: number;
  };
}

// The full plan fits the run in ~30 minutes of this 2-core box. What a turn costs here, unloaded
// (prompt recomputed from scratch, measured before the run on this commit's engine): 1K tokens
// 1.3 s / 3.4 s, 4K 11 s / 26 s, 7.9K 40-80 s / 79 s with 2 / 1 threads. So one conversation of
// 8 turns recomputed costs ~140 s of the whole box, and one with its KV kept ~40 s:
//   A runs 2 conversations side by side (all the box's time allows; TTFT p50/p90 of 2 last turns);
//   B: with kv routing a conversation costs ~95 core-seconds (turns 1-3 computed by a prefill:
//      their new part is > 30% of the prompt; turns 4-8 by the holder's own steps), with round
//      robin ~190 (half of turns 4-8 land away from their KV and recompute the whole history). One
//      conversation every 60 s is ~80% of the two cores for kv's estimate (and ~160% for round
//      robin's): the box loaded, not past what the policy under test should sustain. The TTFT SLO
//      is ~2× the slowest turn kv routing computes unloaded (the 8th: ~1K new tokens after ~7K
//      kept, ~17 s on one thread), the TPOT SLO ~6× a one-thread decode step at 8K context;
//   C: 1.5 requests/s of 128/64-token chats: for 256/128 chats that rate lies between the maximum
//      rates the load suite measured disaggregated (1.25) and colocated (1.79) (results/loadgen/
//      suite.md); these chats are half that size, so the box is busy but no deployment should be
//      past its limit. SLOs: the suite's short-chat TTFT (2 s), TPOT 100 ms.
// 8 turns of 940 new tokens + 32-token answers: the last prompt is ~7.9K of the model's 8,192.
const FULL: Plan = {
  a: { conversations: 2, turns: 8, turnTokens: 940, answerTokens: 32, thinkS: 1, concurrency: 2, serveThreads: 2 },
  b: { conversations: 4, turns: 8, turnTokens: 940, answerTokens: 32, thinkS: 2, everyS: 60, slo: { ttftMs: 40_000, tpotMs: 250 } },
  c: {
    requests: 60,
    rate: 1.5,
    input: 128,
    output: 64,
    slo: { ttftMs: 2000, tpotMs: 100 },
    serveThreads: 2,
    prefillThreads: 1,
    decodeThreads: 1,
  },
};

const QUICK: Plan = {
  a: { conversations: 2, turns: 3, turnTokens: 300, answerTokens: 16, thinkS: 0.2, concurrency: 2, serveThreads: 2 },
  b: { conversations: 3, turns: 3, turnTokens: 300, answerTokens: 16, thinkS: 0.5, everyS: 3, slo: { ttftMs: 10_000, tpotMs: 250 } },
  c: {
    requests: 12,
    rate: 1.5,
    input: 128,
    output: 32,
    slo: { ttftMs: 2000, tpotMs: 100 },
    serveThreads: 2,
    prefillThreads: 1,
    decodeThreads: 1,
  },
};

const TARGETS = { a: 5, b: 1.5, c: 1 };

// ---------------------------------------------------------------------------------------------
// One configuration under load.

interface ConfigResult {
  label: string;
  /** The deployment: each process's role, id and command-line arguments. */
  processes: Deployment["processes"];
  baseUrl: string;
  arrivals: ArrivalSpec;
  workload: string;
  quiet: QuietWaitResult;
  cpu: CpuUse;
  wallS: number;
  stats: RunStats;
  /** Goodput at the offered load: offered requests/s × SLO attainment (open loop with an SLO only). */
  goodputOffered?: number;
  rounds?: RoundStats[];
  server?: ServerCounts;
  sessions?: { started: number; completed: number; sessionIds: boolean };
  /** Every request, compact (no text, no ITL gaps). */
  requests: Array<Record<string, unknown>>;
}

interface PartResult {
  part: Part;
  title: string;
  /** What the configurations share. */
  setup: Record<string, unknown>;
  configs: ConfigResult[];
  /** The part's headline ratio and its target. */
  ratio: { what: string; value: number; target: number; met: boolean; p90?: number };
}

let prompts: PromptSource | undefined;
async function promptSource(): Promise<PromptSource> {
  if (!prompts) {
    const corpus = loadCorpus(join(REPO_ROOT, "node_modules"));
    prompts = PromptSource.fromGguf(await resolveModel(), corpus.text);
  }
  return prompts;
}

const quietCores = Number(bench.values["quiet-cores"] ?? 0.5);
if (!(quietCores > 0)) throw new Error("--quiet-cores must be > 0");
const quietWaitS = Number(bench.values["quiet-wait"] ?? 60);
if (!(quietWaitS >= 0)) throw new Error("--quiet-wait must be >= 0");

/** How a part's arrivals read: conversations or requests. */
function describeLoad(arrivals: ArrivalSpec, conversations: boolean): string {
  if (arrivals.kind === "burst" && arrivals.size === 1)
    return `one ${conversations ? "conversation" : "request"} every ${arrivals.periodS} s`;
  if (arrivals.kind === "poisson" && conversations) return `Poisson, ${arrivals.rate} conversations/s`;
  return describeArrivals(arrivals);
}

// An interrupted run stops the deployment it was measuring (its processes, PostgreSQL, the
// shard folder of 1 GiB files on tmpfs) before it exits.
let running: Deployment | undefined;
for (const signal of ["SIGINT", "SIGTERM"] as const) {
  process.once(signal, () => {
    log(`${signal}: stopping the services`);
    void (running?.stop() ?? Promise.resolve()).finally(() => process.exit(130));
  });
}

async function measure(
  label: string,
  start: () => Promise<Deployment>,
  workload: WorkloadSpec,
  arrivals: ArrivalSpec,
  o: { maxRequests: number; slo?: Slo; seed: number; warmup: number },
): Promise<ConfigResult> {
  log(`${label}: starting the deployment`);
  const dep = await start();
  running = dep;
  try {
    const model = await firstModel(dep.baseUrl);
    // Greedy answers: a conversation's history is the same text in every configuration.
    const client = new StreamingClient({ baseUrl: dep.baseUrl, model, timeoutMs: 1_800_000, extraBody: { temperature: 0 } });
    const factory = new WorkloadFactory(workload, await promptSource());
    const quiet = await waitForQuiet(quietCores, quietWaitS * 1000, 1000);
    if (!quiet.quiet)
      log(
        `${label}: other processes still use ${fmtNum(quiet.otherCores ?? NaN)} cores after ${Math.round(quiet.waitedMs / 1000)} s; measuring anyway`,
      );
    log(`${label}: ${describeWorkload(workload)}; ${describeLoad(arrivals, workload.kind === "multiturn")}; ${o.maxRequests} requests`);
    const pids = dep.processes.map((p) => p.pid);
    const before = cpuSnapshot(pids);
    let run;
    try {
      run = await runLoad(client, factory, {
        arrivals,
        maxRequests: o.maxRequests,
        durationS: 1e6,
        drainS: 1800,
        warmup: o.warmup,
        seed: o.seed,
        slo: o.slo,
        label,
        progress: process.stderr.isTTY,
      });
    } finally {
      await client.close();
    }
    const cpu = cpuUse(before, cpuSnapshot(pids));
    const failed = run.results.filter((r) => !r.ok);
    if (failed.length > 0) {
      log(`${label}: ${failed.length} requests failed, e.g. ${failed[0]!.error}; the services' logs are in ${bench.results}/errors-*.log`);
      // The services' own account of the failures: the client saw only the answer.
      for (const [id, text] of Object.entries(dep.logs()))
        await writeFileAtomic(join(bench.results.dir, `errors-${id}.log`), text).catch(() => undefined);
    }
    const goodputOffered =
      run.stats.slo && run.stats.offeredRps !== undefined ? run.stats.offeredRps * run.stats.slo.attainment : undefined;
    log(
      `${label}: done in ${fmtNum(run.wallS)} s; TTFT p50 ${fmtNum(run.stats.ttftMs.p50)} ms${run.stats.slo ? `, SLO attainment ${fmtNum(100 * run.stats.slo.attainment)}%` : ""}; ${serverCountsLine(run.server)}`,
    );
    const out: ConfigResult = {
      label,
      processes: dep.processes,
      baseUrl: dep.baseUrl,
      arrivals,
      workload: describeWorkload(workload),
      quiet,
      cpu,
      wallS: run.wallS,
      stats: run.stats,
      requests: run.results.map((r) => compactResult(r, false)),
    };
    if (goodputOffered !== undefined) out.goodputOffered = goodputOffered;
    if (run.rounds) out.rounds = run.rounds;
    if (run.server) out.server = run.server;
    if (run.sessions)
      out.sessions = { started: run.sessions.started, completed: run.sessions.completed, sessionIds: run.sessions.sessionIds };
    return out;
  } catch (e) {
    // What the services said is the evidence of a failed run.
    for (const [id, text] of Object.entries(dep.logs()))
      await writeFileAtomic(join(bench.results.dir, `failed-${id}.log`), text).catch(() => undefined);
    log(`${label} failed: the services' logs are in ${bench.results}/failed-*.log`);
    throw e;
  } finally {
    await dep.stop();
    running = undefined;
  }
}

const multiturn = (p: MultiturnPlan): WorkloadSpec => ({
  kind: "multiturn",
  rounds: p.turns,
  thinkS: p.thinkS,
  input: { kind: "fixed", value: p.turnTokens },
  output: { kind: "fixed", value: p.answerTokens },
  sessionIds: true,
});

const lastRound = (c: ConfigResult) => c.rounds?.at(-1);

// ---------------------------------------------------------------------------------------------
// The parts.

async function partA(plan: Plan["a"], seed: number): Promise<PartResult> {
  const workload = multiturn(plan);
  const arrivals: ArrivalSpec = { kind: "concurrency", concurrency: plan.concurrency };
  const maxRequests = plan.conversations * plan.turns;
  const threads = ["--threads", String(plan.serveThreads)];
  const on = await measure("serve, sessions on", () => startServe("sessions-on", [...threads, ...SESSION_ARGS]), workload, arrivals, {
    maxRequests,
    seed,
    warmup: 1,
  });
  const off = await measure(
    "serve --session-bytes 0",
    () => startServe("sessions-off", [...threads, "--session-bytes", "0"]),
    workload,
    arrivals,
    { maxRequests, seed, warmup: 1 },
  );
  const [l1, l0] = [lastRound(on), lastRound(off)];
  const ratio = (l0?.ttftMs.p50 ?? NaN) / (l1?.ttftMs.p50 ?? NaN);
  return {
    part: "a",
    title: "Sessions: the last turn's TTFT with the conversation's KV kept vs recomputed",
    setup: { ...plan, workload: describeWorkload(workload), arrivals: describeLoad(arrivals, true), sessionArgs: SESSION_ARGS },
    configs: [on, off],
    ratio: {
      what: "last turn's TTFT p50, sessions off / on",
      value: ratio,
      p90: (l0?.ttftMs.p90 ?? NaN) / (l1?.ttftMs.p90 ?? NaN),
      target: TARGETS.a,
      met: ratio >= TARGETS.a,
    },
  };
}

async function partB(plan: Plan["b"], seed: number): Promise<PartResult> {
  const workload = multiturn(plan);
  const arrivals: ArrivalSpec = { kind: "burst", size: 1, periodS: plan.everyS };
  const maxRequests = plan.conversations * plan.turns;
  const slo = ["--slo-ttft-ms", String(plan.slo.ttftMs), "--slo-tpot-ms", String(plan.slo.tpotMs)];
  // A recomputed 8K prompt on a loaded box takes minutes: no prefill call may time out first.
  const deploy = (name: string, policy: "kv" | "round_robin") => () =>
    startDisaggregated(name, {
      prefills: 2,
      decodes: 2,
      prefillArgs: ["--threads", "1", ...slo],
      decodeArgs: ["--threads", "1", ...SESSION_ARGS, "--prefill-timeout-ms", "1800000", ...slo],
      routerArgs: ["--router-policy", policy, "--router-poll-ms", "500"],
      heartbeat: { ms: 1000, timeoutMs: 10_000 },
    });
  const kv = await measure("router kv", deploy("kv", "kv"), workload, arrivals, { maxRequests, seed, slo: plan.slo, warmup: 2 });
  const rr = await measure("router round_robin", deploy("rr", "round_robin"), workload, arrivals, {
    maxRequests,
    seed,
    slo: plan.slo,
    warmup: 2,
  });
  const ratio = (kv.goodputOffered ?? NaN) / (rr.goodputOffered ?? NaN);
  return {
    part: "b",
    title: "Router: by where the KV is (kv) vs round robin, 2 prefill + 2 decode",
    setup: {
      ...plan,
      workload: describeWorkload(workload),
      arrivals: describeLoad(arrivals, true),
      decodes: 2,
      prefills: 2,
      threadsEach: 1,
      sessionArgs: SESSION_ARGS,
    },
    configs: [kv, rr],
    ratio: { what: "goodput at the SLO (offered load), kv / round_robin", value: ratio, target: TARGETS.b, met: ratio >= TARGETS.b },
  };
}

async function partC(plan: Plan["c"], seed: number): Promise<PartResult> {
  const workload: WorkloadSpec = {
    kind: "synthetic",
    endpoint: "chat",
    input: { kind: "fixed", value: plan.input },
    output: { kind: "fixed", value: plan.output },
    promptFormat: "text",
  };
  const arrivals: ArrivalSpec = { kind: "poisson", rate: plan.rate };
  const slo = ["--slo-ttft-ms", String(plan.slo.ttftMs), "--slo-tpot-ms", String(plan.slo.tpotMs)];
  const o = { maxRequests: plan.requests, seed, slo: plan.slo, warmup: 2 };
  const disagg = (name: string, localTokens: number) => () =>
    startDisaggregated(name, {
      prefills: 1,
      decodes: 1,
      prefillArgs: ["--threads", String(plan.prefillThreads), ...slo],
      decodeArgs: ["--threads", String(plan.decodeThreads), "--session-bytes", "0", "--local-prefill-tokens", String(localTokens), ...slo],
    });
  const colocated = await measure(
    "serve (colocated)",
    () => startServe("short-serve", ["--threads", String(plan.serveThreads), "--session-bytes", "0", ...slo]),
    workload,
    arrivals,
    o,
  );
  const conditional = await measure("decode, --local-prefill-tokens 512", disagg("conditional", 512), workload, arrivals, o);
  const remote = await measure("decode, --local-prefill-tokens 0", disagg("remote", 0), workload, arrivals, o);
  const ratio = (conditional.goodputOffered ?? NaN) / (colocated.goodputOffered ?? NaN);
  // The seeded Poisson draw's own rate: n arrivals over the time of the last one.
  const sent = colocated.requests.map((r) => r.scheduledMs as number);
  const drawn = sent.length / (Math.max(...sent) / 1000);
  return {
    part: "c",
    title: "Short chat: conditional disaggregation vs always remote vs colocated",
    setup: {
      ...plan,
      workload: describeWorkload(workload),
      arrivals: describeArrivals(arrivals),
      drawnRate: `${fmtNum(drawn, 3)} req/s (${sent.length} arrivals over ${fmtNum(Math.max(...sent) / 1000)} s)`,
      clientsTalkTo: "the decode directly (no router)",
    },
    configs: [colocated, conditional, remote],
    ratio: { what: "goodput at the SLO (offered load), conditional / colocated", value: ratio, target: TARGETS.c, met: ratio >= TARGETS.c },
  };
}

// ---------------------------------------------------------------------------------------------
// Report: markdown and charts (also redrawn from the JSON by --replot).

interface Output extends RunRecord {
  benchmark: "sessions";
  quick: boolean;
  finished: string;
  plan: Plan;
  seed: number;
  parts: PartResult[];
}

const COLORS = ["#1f77b4", "#d62728", "#2ca02c", "#9467bd"];
const x = (v: number) => `${fmtNum(v)}×`;
const verdict = (r: PartResult["ratio"]) => `${x(r.value)} (target ≥ ${r.target}×: **${r.met ? "met" : "not met"}**)`;

function ttft(c: ConfigResult): number[] {
  return (c.requests as unknown as RequestResult[]).filter((r) => r.ok && r.ttftMs !== undefined).map((r) => r.ttftMs!);
}

function tpot(c: ConfigResult): number[] {
  return (c.requests as unknown as RequestResult[]).filter((r) => r.ok && r.tpotMs !== undefined).map((r) => r.tpotMs!);
}

/** TTFT p50 (solid) and p90 (dashed) per turn, one colour per configuration; seconds. */
function perTurnPanel(title: string, configs: ConfigResult[], note?: string, slo?: number): Panel {
  const series: Series[] = configs.flatMap((c, i) => [
    {
      name: `${c.label} p50`,
      color: COLORS[i % COLORS.length]!,
      points: (c.rounds ?? []).map((r) => [r.round + 1, r.ttftMs.p50 / 1000] as [number, number]),
    },
    {
      name: `p90`,
      color: COLORS[i % COLORS.length]!,
      dash: "5,3",
      points: (c.rounds ?? []).map((r) => [r.round + 1, r.ttftMs.p90 / 1000] as [number, number]),
    },
  ]);
  const turns = Math.max(1, ...configs.flatMap((c) => (c.rounds ?? []).map((r) => r.round + 1)));
  if (slo !== undefined)
    series.push({
      name: "TTFT SLO",
      color: "#999999",
      dash: "4,4",
      points: [
        [1, slo / 1000],
        [turns, slo / 1000],
      ],
    });
  return { title, xLabel: "turn", yLabel: "TTFT (s)", xTicks: Array.from({ length: turns }, (_, i) => i + 1), series, note };
}

/** The ratio of two configurations' TTFT p50 per turn, with the target. */
function ratioPanel(title: string, num: ConfigResult, den: ConfigResult, target: number, note?: string): Panel {
  const rounds = (den.rounds ?? []).map((r) => r.round);
  const at = (c: ConfigResult, round: number, k: "p50" | "p90") => c.rounds?.find((r) => r.round === round)?.ttftMs[k] ?? NaN;
  const p50 = rounds.map((r) => [r + 1, at(num, r, "p50") / at(den, r, "p50")] as [number, number]);
  const p90 = rounds.map((r) => [r + 1, at(num, r, "p90") / at(den, r, "p90")] as [number, number]);
  const last = rounds.length;
  return {
    title,
    xLabel: "turn",
    yLabel: `TTFT ${num.label} / ${den.label}`.slice(0, 60),
    xTicks: rounds.map((r) => r + 1),
    yTickFormat: (y) => `${fmtNum(y)}×`,
    series: [
      { name: "p50 ratio", color: COLORS[0]!, points: p50, labels: true },
      { name: "p90 ratio", color: COLORS[1]!, dash: "5,3", points: p90 },
      {
        name: `target ${target}×`,
        color: "#999999",
        dash: "4,4",
        points: [
          [1, target],
          [Math.max(1, last), target],
        ],
      },
    ],
    note,
  };
}

/** One marker per configuration: a bar chart drawn with the line chart (x = configuration). */
function goodputPanel(title: string, configs: ConfigResult[], note?: string): Panel {
  return {
    title,
    xLabel: configs.map((c, i) => `${i + 1}: ${c.label}`).join("   "),
    yLabel: "goodput at the offered load (req/s)",
    xTicks: configs.map((_, i) => i + 1),
    yTickFormat: (y) => fmtNum(y, 3),
    series: configs.map((c, i) => ({
      name: c.label,
      color: COLORS[i % COLORS.length]!,
      labels: true,
      points: [
        [i + 1, 0],
        [i + 1, c.goodputOffered ?? 0],
      ] as Array<[number, number]>,
    })),
    note,
  };
}

/** A deployment's processes, alike ones counted once, without the per-run values (database URL, shard folder, instance id). */
function processesCell(c: ConfigResult): string {
  const drop = new Set(["--database-url", "--shard-dir", "--instance-id"]);
  const shown = c.processes.map((q) =>
    `${q.role} ${q.args.filter((a, i) => !drop.has(a) && !drop.has(q.args[i - 1] ?? "")).join(" ")}`.trim(),
  );
  const counts = new Map<string, number>();
  for (const s of shown) counts.set(s, (counts.get(s) ?? 0) + 1);
  return [...counts].map(([s, n]) => `${n > 1 ? `${n}× ` : ""}\`${s}\``).join(", ");
}

function partMarkdown(p: PartResult): string {
  const lines = [`## ${p.part.toUpperCase()}. ${p.title}`, ""];
  lines.push(
    `Setup: ${Object.entries(p.setup)
      .map(([k, v]) => `${k} ${typeof v === "object" ? JSON.stringify(v) : String(v)}`)
      .join("; ")}.`,
    "",
  );
  lines.push(`**${p.ratio.what}: ${verdict(p.ratio)}**${p.ratio.p90 !== undefined ? ` (p90: ${x(p.ratio.p90)})` : ""}`, "");
  if (p.configs.some((c) => c.goodputOffered !== undefined)) {
    lines.push(
      markdownTable({
        headers: [
          "configuration",
          "offered req/s",
          "requests",
          "met both SLOs",
          "attainment",
          "goodput at the offered load, req/s",
          "TTFT p50 / p90 ms",
          "TPOT p50 / p90 ms",
        ],
        rows: p.configs.map((c) => [
          c.label,
          fmtNum(c.stats.offeredRps ?? NaN, 3),
          String(c.stats.requests),
          String(Math.round((c.stats.slo?.attainment ?? NaN) * c.stats.requests)),
          `${fmtNum(100 * (c.stats.slo?.attainment ?? NaN))}%`,
          fmtNum(c.goodputOffered ?? NaN, 3),
          `${fmtNum(c.stats.ttftMs.p50)} / ${fmtNum(c.stats.ttftMs.p90)}`,
          `${fmtNum(c.stats.tpotMs.p50)} / ${fmtNum(c.stats.tpotMs.p90)}`,
        ]),
      }),
      "",
    );
  }
  lines.push(statsTable(p.configs.map((c) => ({ label: c.label, stats: c.stats }))), "");
  if (p.configs.some((c) => c.rounds))
    lines.push("Per turn:", "", roundsTable(p.configs.filter((c) => c.rounds).map((c) => ({ label: c.label, rounds: c.rounds! }))), "");
  lines.push(
    markdownTable({
      headers: [
        "configuration",
        "processes",
        "wall s",
        "services cores",
        "foreign cores",
        "waited for quiet s",
        "what the server reported",
      ],
      rows: p.configs.map((c) => [
        c.label,
        processesCell(c),
        fmtNum(c.wallS),
        fmtNum(c.cpu.servicesCores),
        fmtNum(c.cpu.foreignCores),
        fmtNum(c.quiet.waitedMs / 1000),
        serverCountsLine(c.server),
      ]),
    }),
    "",
  );
  return lines.join("\n");
}

function partChart(p: PartResult): string {
  if (p.part === "a") {
    const [on, off] = p.configs as [ConfigResult, ConfigResult];
    return chart(
      [
        perTurnPanel("TTFT per turn", p.configs),
        ratioPanel(
          "TTFT without / with sessions, per turn",
          off,
          on,
          p.ratio.target,
          `last turn: p50 ${x(p.ratio.value)}, p90 ${x(p.ratio.p90 ?? NaN)}`,
        ),
      ],
      "A. Sessions: TTFT per turn, KV kept (serve) vs recomputed (serve --session-bytes 0)",
      `${p.setup.workload}; ${p.setup.arrivals}`,
    );
  }
  const slo = p.configs[0]!.stats.slo;
  const sloNote = slo ? `SLO: TTFT ≤ ${fmtNum(slo.ttftMs / 1000)} s, TPOT ≤ ${slo.tpotMs} ms` : "";
  // Both parts open with goodput and end with TPOT; B adds the per-turn view of a conversation.
  const goodput = goodputPanel("Goodput at the SLO", p.configs, `${p.ratio.what}: ${x(p.ratio.value)} (target ≥ ${p.ratio.target}×)`);
  const tpotCdf = cdfPanel(
    "TPOT",
    p.configs.map((c) => ({ label: c.label, values: tpot(c) })),
    "TPOT (ms)",
    false,
    undefined,
    slo?.tpotMs,
  );
  if (p.part === "b") {
    return chart(
      [
        goodput,
        perTurnPanel("TTFT per turn", p.configs, sloNote, slo?.ttftMs),
        cdfPanel(
          "TTFT, every turn",
          p.configs.map((c) => ({ label: c.label, values: ttft(c) })),
          "TTFT (s)",
          true,
          sloNote,
          slo?.ttftMs,
        ),
        tpotCdf,
      ],
      "B. Router: kv (to the session's holder) vs round robin, PostgreSQL + 2 prefill + 2 decode",
      `${p.setup.workload}; ${p.setup.arrivals}`,
    );
  }
  return chart(
    [
      goodput,
      cdfPanel(
        "TTFT",
        p.configs.map((c) => ({ label: c.label, values: ttft(c) })),
        "TTFT (ms)",
        false,
        sloNote,
        slo?.ttftMs,
      ),
      tpotCdf,
    ],
    "C. Short chat: colocated vs conditional vs always-remote prefill",
    `${p.setup.workload}; ${p.setup.arrivals}; clients talk to the decode directly`,
    3,
  );
}

const CHART_NAMES: Record<Part, string> = { a: "sessions", b: "router", c: "short-chat" };

async function report(out: Output): Promise<void> {
  const head = [
    `# bench:sessions${out.quick ? " (quick)" : ""}`,
    "",
    `\`${out.command}\` — ${out.date} → ${out.finished}, git ${out.git.commit?.slice(0, 12) ?? "?"}${out.git.dirty ? " (uncommitted changes)" : ""}, ${out.machine.cpuModel ?? ""} ×${out.machine.cpus ?? "?"}.`,
    "",
    markdownTable({
      headers: ["part", "figure", "value", "target", "met"],
      rows: out.parts.map((p) => [
        p.part.toUpperCase(),
        p.ratio.what,
        x(p.ratio.value) + (p.ratio.p90 !== undefined ? ` (p90 ${x(p.ratio.p90)})` : ""),
        `≥ ${p.ratio.target}×`,
        p.ratio.met ? "yes" : "no",
      ]),
    }),
    "",
  ];
  await bench.results.markdown("sessions", [...head, ...out.parts.map(partMarkdown)].join("\n"));
  for (const p of out.parts) await bench.results.chart(CHART_NAMES[p.part], partChart(p));
}

// ---------------------------------------------------------------------------------------------

async function main(): Promise<void> {
  if (bench.replot) {
    const out = await bench.results.readJson<Output>("sessions");
    await report(out);
    log(`redrew ${bench.results}/sessions.md and the charts`);
    return;
  }
  const parts = (bench.values.parts ?? PARTS.join(",")).split(",").map((s) => s.trim().toLowerCase());
  for (const p of parts) if (!PARTS.includes(p as Part)) throw new Error(`--parts: ${JSON.stringify(p)} is not one of ${PARTS.join(", ")}`);
  const base = bench.quick ? QUICK : FULL;
  const every = bench.values["b-every"] === undefined ? base.b.everyS : Number(bench.values["b-every"]);
  if (!(every > 0)) throw new Error(`--b-every: ${bench.values["b-every"]} is not a positive number of seconds`);
  const plan: Plan = { ...base, b: { ...base.b, everyS: every } };
  const seed = 27;
  const record = bench.record(["services", "shared", "native/src", "bench/sessions", "tools/loadgen"]);
  const out: Output = { benchmark: "sessions", ...record, quick: bench.quick, finished: "", plan, seed, parts: [] };
  const save = async () => {
    out.finished = new Date().toISOString();
    await bench.results.json("sessions", out, 5);
    await report(out);
  };
  const runners: Record<Part, () => Promise<PartResult>> = {
    a: () => partA(plan.a, seed),
    b: () => partB(plan.b, seed),
    c: () => partC(plan.c, seed),
  };
  for (const p of PARTS) {
    if (!parts.includes(p)) continue;
    out.parts.push(await runners[p]());
    await save(); // each part is kept as soon as it is measured
    const r = out.parts.at(-1)!.ratio;
    log(`part ${p.toUpperCase()}: ${r.what} = ${x(r.value)} (target ≥ ${r.target}×: ${r.met ? "met" : "not met"})`);
  }
  log(`wrote ${bench.results}/sessions.json, sessions.md and the charts`);
}

main().catch((e: unknown) => {
  process.stderr.write(`bench:sessions: ${(e as Error).stack ?? e}\n`);
  process.exit(1);
});
