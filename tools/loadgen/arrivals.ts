// Arrival processes: when the load generator starts each job (a request, or a multi-turn
// session). Open loop (Poisson, bursts) gives the send times up front, independent of how fast
// the server answers; closed loop (fixed concurrency) starts a job whenever one finishes.
import { exponential, type Rng } from "../lib/random.ts";

export type ArrivalSpec =
  | { kind: "poisson"; rate: number }
  | { kind: "burst"; size: number; periodS: number }
  | { kind: "concurrency"; concurrency: number };

/**
 * Send times (ms from the start) of an open-loop process: at most `maxJobs` of them, all before
 * `durationMs`. Poisson: exponential gaps with mean 1000/rate ms, the first one included (so the
 * first job is not always at 0). Burst: `size` jobs at 0, periodS, 2·periodS, ...
 */
export function openLoopSchedule(
  spec: Exclude<ArrivalSpec, { kind: "concurrency" }>,
  maxJobs: number,
  durationMs: number,
  rng: Rng,
): number[] {
  const out: number[] = [];
  if (spec.kind === "poisson") {
    if (!(spec.rate > 0)) throw new Error(`poisson rate must be > 0 (got ${spec.rate})`);
    let t = 0;
    while (out.length < maxJobs) {
      t += exponential(rng, spec.rate) * 1000;
      if (t >= durationMs) break;
      out.push(t);
    }
    return out;
  }
  if (!(spec.size >= 1) || !(spec.periodS > 0)) throw new Error(`burst needs size >= 1 and period > 0 (got ${spec.size}, ${spec.periodS})`);
  for (let k = 0; out.length < maxJobs; k++) {
    const t = k * spec.periodS * 1000;
    if (t >= durationMs) break;
    for (let i = 0; i < spec.size && out.length < maxJobs; i++) out.push(t);
  }
  return out;
}

/** The offered rate in jobs/s of an open-loop process (undefined for closed loop). */
export function offeredRate(spec: ArrivalSpec): number | undefined {
  if (spec.kind === "poisson") return spec.rate;
  if (spec.kind === "burst") return spec.size / spec.periodS;
  return undefined;
}

export function describeArrivals(spec: ArrivalSpec): string {
  if (spec.kind === "poisson") return `Poisson ${spec.rate} req/s`;
  if (spec.kind === "burst") return `bursts of ${spec.size} every ${spec.periodS} s`;
  return `closed loop, concurrency ${spec.concurrency}`;
}
