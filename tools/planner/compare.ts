// `npm run plan -- --measure`: probe the hardware, predict the four costs (and a decode step at
// batch 8) for the load suite's two workloads, measure the same quantities with the engine and
// the services, and write the comparison with relative errors (results/planner/plan.json, plan.md).
// When the load suite's results exist, the predicted rate of one prefill + one decode instance
// is set against the measured disaggregated maximum rate too.
import { existsSync, readFileSync } from "node:fs";
import os from "node:os";
import { join } from "node:path";
import { REPO_ROOT, Results, runRecord } from "../lib/bench-runner.ts";
import { fmtNum, markdownTable } from "../../shared/platform/table.ts";
import { CpuMeter, waitForQuiet, type QuietWaitResult } from "../lib/timing.ts";
import { workloads } from "../loadgen/run-suite.ts";
import type { SuiteResult } from "../loadgen/run-suite.ts";
import {
  contextSwitchSeconds,
  decodeComputeSeconds,
  decodeMemorySeconds,
  decodeStepSeconds,
  kvBytes,
  maxConcurrency,
  prefillSeconds,
  replicaPlan,
  type Hardware,
} from "./costs.ts";
import { hardwareFrom } from "./hardware.ts";
import { EngineBench, measureHandoff, measureMemory, promptIds } from "./measure.ts";
import type { ModelFacts } from "./model.ts";
import { probeAll } from "./probe.ts";

const log = (m: string) => process.stderr.write(`[plan] ${m}\n`);

export interface Row {
  workload: string;
  quantity: string;
  unit: string;
  predicted: number;
  measured: number;
  /** predicted / measured − 1 */
  relError: number;
  note?: string;
}

const row = (workload: string, quantity: string, unit: string, predicted: number, measured: number, note?: string): Row => ({
  workload,
  quantity,
  unit,
  predicted,
  measured,
  relError: predicted / measured - 1,
  ...(note ? { note } : {}),
});

export async function runMeasurement(o: {
  modelPath: string;
  facts: ModelFacts;
  threads: number;
  nice: number;
  budgetBytes: number;
  out: string;
  maxBatch: number;
  attainment: number;
  argv: string[];
}): Promise<void> {
  const record = runRecord(`npm run plan -- ${o.argv.join(" ")}`.trim(), ["tools/planner", "native/src", "services"]);
  const m = o.facts;
  const defs = workloads(false);
  // Other work shares this box: before each step wait (up to 2 min) for it to use < 0.5 cores.
  const quiet: Record<string, QuietWaitResult> = {};
  const settle = async (step: string) => {
    quiet[step] = await waitForQuiet(0.5, 120_000);
    if (!quiet[step]!.quiet) log(`${step}: other processes still use ${fmtNum(quiet[step]!.otherCores, 2)} cores; measuring anyway`);
  };
  await settle("probe");
  log("probing the hardware");
  const probe = await probeAll(o.modelPath, m, o.threads);
  const hw: Hardware = hardwareFrom(probe, { mem: o.budgetBytes }, "shm");
  const hwTcp: Hardware = { ...hw, linkBw: probe.tcpBw };
  log(
    `FLOP/s ${fmtNum(probe.flops / 1e9)} G (${o.threads} threads), ${fmtNum(probe.flops1 / 1e9)} G (1 thread); read ${fmtNum(probe.memReadBw / 1e9)} GB/s, copy ${fmtNum(probe.memCopyBw / 1e9)} GB/s; shm ${fmtNum(probe.shmBw / 1e9)} GB/s, tcp ${fmtNum(probe.tcpBw / 1e9)} GB/s`,
  );

  await settle("memory");
  const lengthsOf = (w: (typeof defs)[number]) => ({
    n: w.spec.input.kind === "fixed" ? w.spec.input.value : 0,
    out: w.spec.output.kind === "fixed" ? w.spec.output.value : 0,
  });
  log(
    `memory: the model, then sequences of ${defs.map((w) => lengthsOf(w).n + lengthsOf(w).out).join(" and ")} tokens until ${fmtNum(o.budgetBytes / 2 ** 30)} GiB (fresh process)`,
  );
  const memory = await measureMemory(
    o.modelPath,
    o.threads,
    o.budgetBytes,
    defs.map((w) => lengthsOf(w).n + lengthsOf(w).out),
  );
  const modelBytes = memory.modelBytes;
  const bench = await EngineBench.open(o.modelPath, o.threads);
  const rows: Row[] = [];
  const engine: Record<string, unknown> = {};
  const lengths: Record<string, { n: number; out: number }> = {};
  for (const w of defs) {
    const { n, out } = lengthsOf(w);
    lengths[w.id] = { n, out };
    await settle(w.id);
    log(`${w.id}: engine prefill ${n}, decode at ${n} (batch 1 and 8)`);
    // Other load during the measurement (cores used by other processes) is recorded; a run
    // disturbed by more than half a core is repeated once after waiting for quiet.
    const attempt = async () => {
      const meter = new CpuMeter().start();
      const r = await bench.measure(promptIds(o.modelPath, n), out, n <= 1024 ? 3 : 1);
      return { ...r, otherCores: meter.stop().otherCores ?? 0 };
    };
    let e = await attempt();
    if (e.otherCores > 0.5) {
      log(`${w.id}: other processes used ${fmtNum(e.otherCores, 2)} cores during the measurement; repeating it once`);
      await settle(`${w.id}-repeat`);
      const again = await attempt();
      engine[`${w.id}-disturbed`] = e;
      if (again.otherCores < e.otherCores) e = again;
    }
    const fit = memory.fits.find((f) => f.tokens === n + out)!;
    engine[w.id] = e;
    const ctx = n + 12; // the decode steps ran at contexts n .. n + 24 (batch 1) and beyond (batch 8)
    rows.push(
      row(
        w.id,
        `concurrency in ${fmtNum(o.budgetBytes / 2 ** 30)} GiB (sequences of ${n + out} tokens)`,
        "seqs",
        maxConcurrency(m, hw, n + out),
        fit.fit,
      ),
      row(w.id, `memory per sequence of ${n + out} tokens`, "MiB", kvBytes(m, n + out) / 2 ** 20, fit.bytesPerSequence / 2 ** 20),
      row(
        w.id,
        `prefill of ${n} tokens (${o.threads} threads)`,
        "ms",
        prefillSeconds(m, hw, n) * 1000,
        Math.min(...e.prefillS) * 1000,
        `${e.prefillS.length > 1 ? `best of ${e.prefillS.length}` : "one run"}; other load ${fmtNum(e.otherCores, 2)} cores`,
      ),
      row(
        w.id,
        `decode step at ${n}, batch 1`,
        "ms",
        decodeStepSeconds(m, hw, ctx, 1) * 1000,
        e.decodeStepMs.batch1,
        `median of 24 steps; predicted = max(bytes/bandwidth ${fmtNum(decodeMemorySeconds(m, hw, ctx, 1) * 1000, 2)}, FLOPs at 1 thread ${fmtNum(decodeComputeSeconds(m, hw, ctx, 1) * 1000, 2)})`,
      ),
      row(
        w.id,
        `decode step at ${n}, batch 8`,
        "ms",
        decodeStepSeconds(m, hw, ctx + 24, 8) * 1000,
        e.decodeStepMs.batch8,
        `median of 12 steps; max(bytes/bandwidth ${fmtNum(decodeMemorySeconds(m, hw, ctx + 24, 8) * 1000, 2)}, FLOPs at ${o.threads} threads ${fmtNum(decodeComputeSeconds(m, hw, ctx + 24, 8) * 1000, 2)})`,
      ),
    );
  }
  rows.unshift(
    row(
      "both",
      "model in memory (weights + runtime)",
      "MiB",
      m.weightBytes / 2 ** 20,
      modelBytes / 2 ** 20,
      "RSS growth from loading the model and one forward",
    ),
  );

  await settle("handoff");
  log("KV handoff through the services (PostgreSQL 15, prefill + decode over shm and over http)");
  const handoff = await measureHandoff(
    o.modelPath,
    Object.values(lengths).map((l) => l.n),
    { nice: o.nice, prefillThreads: o.threads },
  );
  for (const w of defs) {
    const n = lengths[w.id]!.n;
    for (const t of ["shm", "http"] as const) {
      const h = handoff.find((x) => x.tokens === n && x.transport === t);
      if (!h) continue;
      const link = t === "shm" ? hw : hwTcp;
      rows.push(
        row(
          w.id,
          `KV handoff of ${n} tokens over ${t} (context switch)`,
          "ms",
          contextSwitchSeconds(m, link, n) * 1000,
          h.ms,
          `${fmtNum(h.bytes / 2 ** 20)} MiB moved in ${h.chunks} chunks; predicted ${fmtNum(kvBytes(m, n) / 2 ** 20)} MiB at ${t === "shm" ? "shm" : "tcp"} ${fmtNum(link.linkBw / 1e9)} GB/s`,
        ),
      );
    }
  }

  // Replica plans at the suite's SLOs, and one pair's predicted rate against the measured one:
  // from the suite's main run and from its long-document disaggregated run, if they exist.
  const suites = ["results/loadgen/suite.json", "results/loadgen/long-disaggregated/suite.json"]
    .map((f) => join(REPO_ROOT, f))
    .filter((f) => existsSync(f))
    .map((f) => JSON.parse(readFileSync(f, "utf8")) as SuiteResult);
  // A measured disaggregated configuration and the prefill threads its run gave the pair.
  const pairs = suites.flatMap((suite) =>
    suite.configs.filter((c) => c.deployment === "disaggregated").map((c) => ({ c, prefillThreads: suite.options.prefillThreads })),
  );
  const plans = defs.map((w) => {
    const { n, out } = lengths[w.id]!;
    const measured = pairs.filter(({ c }) => c.workload === w.id);
    const rate = measured.find(({ c }) => c.policy === "full")?.c.maxRate ?? 1;
    const workload = { promptTokens: n, outputTokens: out, rate, sloTtftMs: w.slo.ttftMs, sloTpotMs: w.slo.tpotMs };
    // The handoff delays the second token; the shm handoff measured above is what the deployment uses.
    const handoffS = (handoff.find((x) => x.tokens === n && x.transport === "shm")?.ms ?? 0) / 1000;
    // As the suite deploys the pair on this 2-core box: the prefill on its run's threads (the
    // probe's 1- or 2-thread FLOP/s), the decode on one, the decode's KV budget
    // (--kv-budget-bytes, 2 GiB) as its memory.
    const pairPlan = (prefillThreads: number) =>
      replicaPlan(m, { ...hw, flops: prefillThreads === 1 ? probe.flops1 : probe.flops, memBytes: 2 * 2 ** 30 + m.weightBytes }, workload, {
        maxBatch: o.maxBatch,
        handoffS,
        attainment: o.attainment,
      });
    for (const { c, prefillThreads } of measured) {
      if (c.maxRate === undefined) continue;
      const quantity = `max rate, 1 prefill (${prefillThreads} thread${prefillThreads === 1 ? "" : "s"}) + 1 decode, ${c.policy} (load suite, >= 90% SLO attainment)`;
      rows.push(
        row(
          w.id,
          quantity,
          "req/s",
          pairPlan(prefillThreads).onePairMaxRate,
          c.maxRate,
          `measured: passes at ${c.maxRate.toPrecision(3)}, fails at ${c.failRate?.toPrecision(3) ?? "—"}; predicted with the prefill's ${prefillThreads}-thread FLOP/s`,
        ),
      );
    }
    return { workload: w.id, ...workload, handoffS, plan: pairPlan(measured[0]?.prefillThreads ?? 1) };
  });

  const result = {
    benchmark: "planner",
    command: record.command,
    started: record.date,
    finished: new Date().toISOString(),
    machine: { ...record.machine, loadAvgAfter: os.loadavg() },
    git: record.git,
    model: { path: o.modelPath, facts: m },
    probe,
    hardware: hw,
    budgetBytes: o.budgetBytes,
    quiet,
    engine,
    memory,
    handoff,
    plans,
    rows,
  };
  const results = new Results(o.out);
  await results.json("plan", result);
  const md = planMarkdown(rows, plans, probe, record.machine.loadAvg, result.machine.loadAvgAfter);
  await results.markdown("plan", md);
  process.stdout.write(md);
  log(`wrote ${results}/plan.json and plan.md`);
}

export function planMarkdown(
  rows: Row[],
  plans: Array<{
    workload: string;
    promptTokens: number;
    outputTokens: number;
    rate: number;
    sloTtftMs: number;
    sloTpotMs: number;
    plan: ReturnType<typeof replicaPlan>;
  }>,
  probe: Awaited<ReturnType<typeof probeAll>>,
  before: number[],
  after: number[],
): string {
  const g = (x: number) => fmtNum(x / 1e9);
  const hwLine = `Probed: prefill ${g(probe.flops)} GFLOP/s (${probe.flopsProbe.threads} threads; ${probe.flopsProbe.tokens}-token prefill in ${fmtNum(probe.flopsProbe.seconds * 1000)} ms), decode steps ${g(probe.flops1)} GFLOP/s (1 thread), memory read ${g(probe.memReadBw)} GB/s (copy ${g(probe.memCopyBw)}), shm ${g(probe.shmBw)} GB/s, loopback TCP ${g(probe.tcpBw)} GB/s. Load average before ${before.map((x) => x.toFixed(2)).join(" ")}, after ${after.map((x) => x.toFixed(2)).join(" ")}.`;
  const table = markdownTable({
    headers: ["workload", "quantity", "predicted", "measured", "rel. error", "note"],
    rows: rows.map((r) => [
      r.workload,
      r.quantity,
      `${fmtNum(r.predicted)} ${r.unit}`,
      `${fmtNum(r.measured)} ${r.unit}`,
      `${r.relError >= 0 ? "+" : ""}${(100 * r.relError).toFixed(0)}%`,
      r.note ?? "",
    ]),
  });
  const planTable = markdownTable({
    headers: ["workload", "rate", "SLO TTFT / TPOT", "prefill instance max rate", "decode instance: batch, TPOT, max rate", "replicas P:D"],
    rows: plans.map((p) => [
      `${p.workload} (${p.promptTokens}/${p.outputTokens})`,
      `${p.rate.toPrecision(3)} req/s`,
      `${fmtNum(p.sloTtftMs / 1000)} s / ${p.sloTpotMs} ms`,
      `${p.plan.prefillMaxRate.toPrecision(3)} req/s`,
      `${p.plan.decode.batch} (${p.plan.decode.limitedBy}), ${fmtNum(p.plan.decode.tpotS * 1000)} ms, ${p.plan.decode.maxRate.toPrecision(3)} req/s`,
      p.plan.ratio,
    ]),
  });
  return [
    hwLine,
    "",
    table,
    "",
    "Replica plan at the load suite's SLOs (rate: the measured disaggregated `full` maximum, when the suite has run):",
    "",
    planTable,
    "",
  ].join("\n");
}
