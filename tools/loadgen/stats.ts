// Latency statistics and SLO accounting (docs/algorithms.md, serving figures): percentiles, per-metric summaries, SLO
// attainment (share of requests meeting both the TTFT and the TPOT SLO, failures counted as
// misses) and goodput (requests meeting both SLOs per second).
import type { ErrorKind, RequestResult, Slo } from "./types.ts";

/**
 * The p-th percentile (0..100) with linear interpolation between closest ranks (numpy's default):
 * rank = p/100 · (n − 1). NaN for an empty list.
 */
export function percentile(values: readonly number[], p: number): number {
  if (!(p >= 0 && p <= 100)) throw new RangeError(`percentile must be in [0, 100] (got ${p})`);
  if (values.length === 0) return Number.NaN;
  const s = [...values].sort((a, b) => a - b);
  const rank = (p / 100) * (s.length - 1);
  const lo = Math.floor(rank);
  const hi = Math.ceil(rank);
  return s[lo]! + (s[hi]! - s[lo]!) * (rank - lo);
}

export interface LatencySummary {
  n: number;
  mean: number;
  p50: number;
  p90: number;
  p99: number;
  max: number;
}

export function latencySummary(values: readonly number[]): LatencySummary {
  const n = values.length;
  const mean = n === 0 ? Number.NaN : values.reduce((s, v) => s + v, 0) / n;
  return {
    n,
    mean,
    p50: percentile(values, 50),
    p90: percentile(values, 90),
    p99: percentile(values, 99),
    max: n === 0 ? Number.NaN : Math.max(...values),
  };
}

/** Does a request meet both SLOs? A failed request never does; one without a second token has no TPOT and meets that SLO. */
export function meetsSlo(r: RequestResult, slo: Slo): boolean {
  if (!r.ok || r.ttftMs === undefined) return false;
  return r.ttftMs <= slo.ttftMs && (r.tpotMs === undefined || r.tpotMs <= slo.tpotMs);
}

export interface RunStats {
  requests: number;
  ok: number;
  errors: Record<ErrorKind, number>;
  /** Wall time from the first send to the last completion, s. */
  elapsedS: number;
  /** Offered rate (the arrival process's), when it has one, req/s. */
  offeredRps?: number;
  /** Completed requests per second over elapsedS. */
  throughputRps: number;
  /** Generated tokens per second over elapsedS (successful requests). */
  outputTokPerS: number;
  ttftMs: LatencySummary;
  tpotMs: LatencySummary;
  itlMs: LatencySummary;
  e2eMs: LatencySummary;
  outputTokens: LatencySummary;
  promptTokens: LatencySummary;
  /** Send lag behind the schedule (a generator that falls behind under-reports load). */
  sendLagMs: LatencySummary;
  slo?: {
    ttftMs: number;
    tpotMs: number;
    /** Shares of all requests meeting each SLO and both. */
    ttftAttainment: number;
    tpotAttainment: number;
    attainment: number;
    /** Requests meeting both SLOs per second of elapsedS. */
    goodputRps: number;
  };
}

export const ERROR_KINDS: readonly ErrorKind[] = ["rate_limited", "http_4xx", "http_5xx", "network", "stream_error", "timeout"];

export function runStats(results: readonly RequestResult[], slo: Slo | undefined, offeredRps?: number): RunStats {
  const ok = results.filter((r) => r.ok);
  const errors = Object.fromEntries(ERROR_KINDS.map((k) => [k, 0])) as Record<ErrorKind, number>;
  for (const r of results) if (!r.ok && r.errorKind) errors[r.errorKind]++;
  const first = Math.min(...results.map((r) => r.sentMs));
  const last = Math.max(...results.map((r) => r.sentMs + (r.e2eMs ?? 0)));
  const elapsedS = results.length === 0 ? 0 : Math.max(1e-9, (last - first) / 1000);
  const defined = (xs: Array<number | undefined>) => xs.filter((x): x is number => x !== undefined && Number.isFinite(x));
  const stats: RunStats = {
    requests: results.length,
    ok: ok.length,
    errors,
    elapsedS,
    throughputRps: elapsedS > 0 ? ok.length / elapsedS : 0,
    outputTokPerS: elapsedS > 0 ? ok.reduce((s, r) => s + r.outputTokens, 0) / elapsedS : 0,
    ttftMs: latencySummary(defined(ok.map((r) => r.ttftMs))),
    tpotMs: latencySummary(defined(ok.map((r) => r.tpotMs))),
    itlMs: latencySummary(ok.flatMap((r) => r.itlMs)),
    e2eMs: latencySummary(defined(ok.map((r) => r.e2eMs))),
    outputTokens: latencySummary(ok.map((r) => r.outputTokens)),
    promptTokens: latencySummary(ok.map((r) => r.promptTokens ?? r.promptTokensSent)),
    sendLagMs: latencySummary(results.map((r) => r.sentMs - r.scheduledMs)),
  };
  if (offeredRps !== undefined) stats.offeredRps = offeredRps;
  if (slo && results.length > 0) {
    const n = results.length;
    const met = results.filter((r) => meetsSlo(r, slo)).length;
    stats.slo = {
      ttftMs: slo.ttftMs,
      tpotMs: slo.tpotMs,
      ttftAttainment: results.filter((r) => r.ok && r.ttftMs !== undefined && r.ttftMs <= slo.ttftMs).length / n,
      tpotAttainment: results.filter((r) => r.ok && (r.tpotMs === undefined || r.tpotMs <= slo.tpotMs)).length / n,
      attainment: met / n,
      goodputRps: elapsedS > 0 ? met / elapsedS : 0,
    };
  }
  return stats;
}

/** Empirical CDF as at most `points` [value, fraction ≤ value] pairs (for charts). */
export function cdfPoints(values: readonly number[], points = 100): Array<[number, number]> {
  if (values.length === 0) return [];
  const s = [...values].sort((a, b) => a - b);
  const step = Math.max(1, Math.floor(s.length / points));
  const out: Array<[number, number]> = [];
  for (let i = step - 1; i < s.length; i += step) out.push([s[i]!, (i + 1) / s.length]);
  if (out.at(-1)![1] !== 1) out.push([s.at(-1)!, 1]);
  return out;
}

/** One round index of a multi-turn run: its requests' TTFT, prompt sizes and what a session reused. */
export interface RoundStats {
  /** 0-based round index. */
  round: number;
  requests: number;
  ok: number;
  ttftMs: LatencySummary;
  tpotMs: LatencySummary;
  /** Prompt tokens (the server's count when it reported one). */
  promptTokens: LatencySummary;
  /** ctxbank's `ctxbank.session.reused_tokens`, over the requests that reported it. */
  reusedTokens?: LatencySummary;
  slo?: { attainment: number; met: number };
}

/** Statistics per round index (requests without one are left out); the last entry is the last turn. */
export function roundStats(results: readonly RequestResult[], slo?: Slo): RoundStats[] {
  const by = new Map<number, RequestResult[]>();
  for (const r of results) if (r.round !== undefined) by.set(r.round, [...(by.get(r.round) ?? []), r]);
  return [...by.keys()]
    .sort((a, b) => a - b)
    .map((round) => {
      const rs = by.get(round)!;
      const ok = rs.filter((r) => r.ok);
      const num = (xs: Array<number | undefined>) => xs.filter((x): x is number => x !== undefined && Number.isFinite(x));
      const reused = num(ok.map((r) => r.reusedTokens));
      const out: RoundStats = {
        round,
        requests: rs.length,
        ok: ok.length,
        ttftMs: latencySummary(num(ok.map((r) => r.ttftMs))),
        tpotMs: latencySummary(num(ok.map((r) => r.tpotMs))),
        promptTokens: latencySummary(ok.map((r) => r.promptTokens ?? r.promptTokensSent)),
      };
      if (reused.length > 0) out.reusedTokens = latencySummary(reused);
      if (slo) {
        const met = rs.filter((r) => meetsSlo(r, slo)).length;
        out.slo = { met, attainment: met / rs.length };
      }
      return out;
    });
}

/** What ctxbank said about where each request ran: router reasons, prefill placements, session reuse. */
export interface ServerCounts {
  /** Requests by the router's reason (`x-ctxbank-route`), and by decode. */
  routeReason: Record<string, number>;
  routeDecode: Record<string, number>;
  /** Requests by `ctxbank.prefill.where`, and by `where/cause`. */
  prefillWhere: Record<string, number>;
  prefillCause: Record<string, number>;
  /** Requests that reported `ctxbank.session`, those that reused any tokens, and the tokens reused against the prompt tokens of those requests. */
  sessions: { reported: number; reused: number; reusedTokens: number; promptTokens: number };
}

/** Counts of ctxbank's per-request placement reports; undefined when no answer carried any (not ctxbank, or no sessions/router/placement). */
export function serverCounts(results: readonly RequestResult[]): ServerCounts | undefined {
  const c: ServerCounts = {
    routeReason: {},
    routeDecode: {},
    prefillWhere: {},
    prefillCause: {},
    sessions: { reported: 0, reused: 0, reusedTokens: 0, promptTokens: 0 },
  };
  const inc = (m: Record<string, number>, k: string) => (m[k] = (m[k] ?? 0) + 1);
  let any = false;
  for (const r of results) {
    if (r.route) {
      any = true;
      inc(c.routeReason, r.route.reason);
      inc(c.routeDecode, r.route.decode);
    }
    if (r.prefill) {
      any = true;
      inc(c.prefillWhere, r.prefill.where);
      inc(c.prefillCause, r.prefill.cause ? `${r.prefill.where}/${r.prefill.cause}` : r.prefill.where);
    }
    if (r.reusedTokens !== undefined) {
      any = true;
      c.sessions.reported++;
      if (r.reusedTokens > 0) c.sessions.reused++;
      c.sessions.reusedTokens += r.reusedTokens;
      c.sessions.promptTokens += r.promptTokens ?? r.promptTokensSent;
    }
  }
  return any ? c : undefined;
}
