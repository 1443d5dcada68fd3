// The maximum rate a configuration serves with at least `target` SLO attainment (DistServe's
// definition of goodput): evaluate Poisson rates, first bracketing (multiply or divide the rate
// by `factor` until one point passes and one fails), then bisecting geometrically between the
// highest passing and the lowest failing rate until they are within `relTol` of each other.
// Attainment is assumed to fall with the rate; a noisy non-monotonic point only narrows the
// bracket on the wrong side, which the recorded points make visible. Bounded by `maxPoints` and
// a deadline (checked before each point against the point's expected duration).

export interface SweepPoint {
  rate: number;
  attainment: number;
  pass: boolean;
}

export interface SweepOptions {
  startRate: number;
  /** Attainment a rate must reach to pass (default 0.9). */
  target?: number;
  /** Bracketing step (default 2). */
  factor?: number;
  /** Stop bisecting when hi/lo <= 1 + relTol (default 0.1). */
  relTol?: number;
  minRate?: number;
  maxRate?: number;
  maxPoints?: number;
  /** Absolute deadline (ms, on `now`'s clock). */
  deadlineMs?: number;
  /** Expected wall time of a point at this rate, ms: a point that would end past the deadline is not started. */
  expectedPointMs?: (rate: number) => number;
  now?: () => number;
}

export type SweepStop = "converged" | "max-points" | "deadline" | "min-rate" | "max-rate";

export interface SweepResult {
  /** Highest passing rate found (undefined when none passed). */
  maxRate?: number;
  /** Lowest failing rate found (undefined when none failed). */
  failRate?: number;
  points: SweepPoint[];
  stoppedBy: SweepStop;
}

export async function sweepMaxRate(evaluate: (rate: number) => Promise<number>, opts: SweepOptions): Promise<SweepResult> {
  const target = opts.target ?? 0.9;
  const factor = opts.factor ?? 2;
  const relTol = opts.relTol ?? 0.1;
  const minRate = opts.minRate ?? opts.startRate / 64;
  const maxRate = opts.maxRate ?? opts.startRate * 64;
  const maxPoints = opts.maxPoints ?? 12;
  const now = opts.now ?? (() => Date.now());
  if (!(opts.startRate > 0) || !(factor > 1) || !(relTol > 0) || !(minRate > 0) || !(maxRate >= minRate)) {
    throw new RangeError("sweep: need startRate > 0, factor > 1, relTol > 0, 0 < minRate <= maxRate");
  }
  const points: SweepPoint[] = [];
  let lo: number | undefined; // highest passing
  let hi: number | undefined; // lowest failing
  const result = (stoppedBy: SweepStop): SweepResult => ({ maxRate: lo, failRate: hi, points, stoppedBy });

  const run = async (rate: number): Promise<SweepStop | undefined> => {
    if (points.length >= maxPoints) return "max-points";
    if (opts.deadlineMs !== undefined && now() + (opts.expectedPointMs?.(rate) ?? 0) > opts.deadlineMs) return "deadline";
    const attainment = await evaluate(rate);
    const pass = attainment >= target;
    points.push({ rate, attainment, pass });
    if (pass) lo = lo === undefined ? rate : Math.max(lo, rate);
    else hi = hi === undefined ? rate : Math.min(hi, rate);
    return undefined;
  };

  let rate = Math.min(maxRate, Math.max(minRate, opts.startRate));
  let stop = await run(rate);
  if (stop) return result(stop);
  // Bracket.
  while (lo === undefined || hi === undefined) {
    if (lo === undefined) {
      if (rate <= minRate) return result("min-rate");
      rate = Math.max(minRate, rate / factor);
    } else {
      if (rate >= maxRate) return result("max-rate");
      rate = Math.min(maxRate, rate * factor);
    }
    stop = await run(rate);
    if (stop) return result(stop);
  }
  // Bisect (geometric mean: rates span orders of magnitude).
  while (hi / lo > 1 + relTol) {
    // A noisy point can leave hi below lo; then the bracket is as narrow as it will get.
    if (hi <= lo) return result("converged");
    stop = await run(Math.sqrt(lo * hi));
    if (stop) return result(stop);
  }
  return result("converged");
}
