// One request's latency figures (docs/algorithms.md, serving figures): TTFT from arrival to the first token emitted, every
// inter-token gap, TPOT = (e2e - ttft) / (n - 1), e2e from arrival to the end, and the time it
// waited for a place. The clock is performance.now() milliseconds.

export interface RequestTimings {
  /** Arrival to the first token emitted. */
  ttftMs: number;
  /** Mean time per output token after the first; null with fewer than 2 tokens. */
  tpotMs: number | null;
  /** Arrival to the end of the generation. */
  e2eMs: number;
  /** Time spent waiting for a place (prefill queue + decode batch queue). */
  queueMs: number;
  /** Each gap between consecutive tokens, in order (n - 1 of them). */
  itlMs: number[];
  outputTokens: number;
}

/** Timestamps of one request's tokens as they are emitted. */
export class RequestClock {
  private readonly stamps: number[] = [];

  constructor(readonly arrivedAt: number) {}

  /** Records one emitted token at `at` (default now). */
  token(at: number = performance.now()): void {
    this.stamps.push(at);
  }

  get tokens(): number {
    return this.stamps.length;
  }

  /** The figures once the generation ended at `endedAt`. Needs at least one token. */
  finish(endedAt: number, queueMs: number): RequestTimings {
    const first = this.stamps[0];
    if (first === undefined) throw new Error("a finished request has at least one token");
    const n = this.stamps.length;
    const ttftMs = first - this.arrivedAt;
    const e2eMs = Math.max(endedAt, this.stamps[n - 1]!) - this.arrivedAt;
    const itlMs = this.stamps.slice(1).map((t, i) => t - this.stamps[i]!);
    return { ttftMs, tpotMs: n > 1 ? (e2eMs - ttftMs) / (n - 1) : null, e2eMs, queueMs: Math.max(0, queueMs), itlMs, outputTokens: n };
  }
}

/** The q-quantile (0..1) of `values` by the nearest-rank method; null when empty. */
export function quantile(values: readonly number[], q: number): number | null {
  if (values.length === 0) return null;
  const sorted = [...values].sort((a, b) => a - b);
  const rank = Math.min(sorted.length, Math.max(1, Math.ceil(q * sorted.length)));
  return sorted[rank - 1]!;
}
