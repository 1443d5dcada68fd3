// A rate sweep against a live server: each point is a Poisson run of `perPoint` requests; the
// search itself is sweep.ts. A point's requests all get sent (its duration cap is generous), and
// requests still running `drainS` after the last send are aborted: with drainS at least
// SLO_TTFT + max_tokens·SLO_TPOT such a request has missed its SLOs already, so the cut saves
// time at overloaded rates without changing any pass/fail.
import { setTimeout as sleep } from "node:timers/promises";
import type { StreamingClient } from "./client.ts";
import { runLoad, type RunResult } from "./runner.ts";
import { sweepMaxRate, type SweepResult } from "./sweep.ts";
import type { Slo } from "./types.ts";
import type { WorkloadFactory } from "./workloads.ts";

export interface SweepRunOptions {
  slo: Slo;
  startRate: number;
  target: number;
  relTol: number;
  factor?: number;
  perPoint: number;
  maxPoints: number;
  /** Wall-clock budget for the whole sweep, s. */
  budgetS: number;
  /** Largest max_tokens of the workload (for the drain bound). */
  maxOutputTokens: number;
  seed: number;
  minRate?: number;
  maxRate?: number;
  label?: string;
  progress?: boolean;
  /** Pause between points so the server finishes cleaning up, ms (default 2000). */
  pauseMs?: number;
  /** Runs before every attempt at a point (e.g. wait for other work on the machine to calm down). */
  beforePoint?: () => Promise<void>;
  /** A run that returns true was disturbed (e.g. by other load) and is repeated, up to `retries` times. */
  disturbed?: (run: RunResult) => boolean;
  retries?: number;
  onPoint?: (rate: number, run: RunResult, attempt: number) => void;
}

export interface SweepRun {
  result: SweepResult;
  /** Every attempt; the search used the last attempt at each rate. */
  runs: Array<{ rate: number; run: RunResult; attempt: number; disturbed: boolean }>;
  drainS: number;
}

export function sweepDrainS(slo: Slo, maxOutputTokens: number): number {
  return (1.1 * (slo.ttftMs + maxOutputTokens * slo.tpotMs)) / 1000 + 5;
}

export async function runSweep(client: StreamingClient, factory: WorkloadFactory, o: SweepRunOptions): Promise<SweepRun> {
  const drainS = sweepDrainS(o.slo, o.maxOutputTokens);
  const runs: SweepRun["runs"] = [];
  const deadlineMs = Date.now() + o.budgetS * 1000;
  const attemptAt = async (rate: number, attempt: number): Promise<{ run: RunResult; disturbed: boolean }> => {
    if (runs.length > 0) await sleep(o.pauseMs ?? 2000);
    await o.beforePoint?.();
    const run = await runLoad(client, factory, {
      arrivals: { kind: "poisson", rate },
      maxRequests: o.perPoint,
      // Poisson: the perPoint-th arrival is almost surely before 3x its mean time.
      durationS: Math.max(10, (3 * o.perPoint) / rate),
      drainS,
      warmup: 0,
      // Same seed at every point: the same prompts, arrival gaps scaled by 1/rate.
      seed: o.seed,
      slo: o.slo,
      label: `${o.label ?? "sweep"} @ ${rate.toPrecision(3)} req/s${attempt > 0 ? ` (repeat ${attempt})` : ""}`,
      progress: o.progress ?? true,
    });
    const disturbed = o.disturbed?.(run) ?? false;
    runs.push({ rate, run, attempt, disturbed });
    o.onPoint?.(rate, run, attempt);
    return { run, disturbed };
  };
  const evaluate = async (rate: number): Promise<number> => {
    let r = await attemptAt(rate, 0);
    for (let a = 1; r.disturbed && a <= (o.retries ?? 0) && Date.now() < deadlineMs; a++) r = await attemptAt(rate, a);
    return r.run.stats.slo?.attainment ?? 0;
  };
  const result = await sweepMaxRate(evaluate, {
    startRate: o.startRate,
    target: o.target,
    relTol: o.relTol,
    factor: o.factor ?? 2,
    maxPoints: o.maxPoints,
    minRate: o.minRate,
    maxRate: o.maxRate,
    deadlineMs,
    // The expected point: all arrivals (perPoint / rate) plus one unloaded request's worth of tail.
    expectedPointMs: (rate) =>
      (o.perPoint / rate) * 1000 + Math.min(drainS, (o.slo.ttftMs + o.maxOutputTokens * o.slo.tpotMs) / 2000) * 1000,
  });
  return { result, runs, drainS };
}
