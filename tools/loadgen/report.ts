// Load-run output: compact per-request records for JSON, a Markdown summary, and charts (via
// tools/lib): SLO attainment against the Poisson rate, and latency CDFs.
import { niceTicks, renderChart, type Panel, type Series } from "../lib/svg-chart.ts";
import { fmtNum, markdownTable } from "../../shared/platform/table.ts";
import { cdfPoints, type LatencySummary, type RoundStats, type RunStats, type ServerCounts } from "./stats.ts";
import type { RequestResult } from "./types.ts";

const COLORS = ["#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e", "#8c564b", "#e377c2", "#17becf"];
const DASHES = [undefined, "6,3", "2,3", "8,3,2,3"];

/** A request as written to JSON: no text; ITL gaps only when asked (they dominate the size). */
export function compactResult(r: RequestResult, withItl: boolean): Record<string, unknown> {
  const { text: _text, itlMs, ...rest } = r;
  return withItl ? { ...rest, itlMs } : rest;
}

const ms = (s: LatencySummary) => `${fmtNum(s.p50)} / ${fmtNum(s.p90)} / ${fmtNum(s.p99)} / ${fmtNum(s.mean)}`;

export function statsTable(rows: Array<{ label: string; stats: RunStats }>): string {
  return markdownTable({
    headers: [
      "run",
      "req",
      "ok",
      "429",
      "other err",
      "rate offered",
      "thr. req/s",
      "out tok/s",
      "TTFT ms p50/p90/p99/mean",
      "TPOT ms p50/p90/p99/mean",
      "ITL ms p50/p90/p99/mean",
      "E2E ms p50/p90/p99/mean",
      "out tokens mean",
      "attain.",
      "goodput req/s",
    ],
    rows: rows.map(({ label, stats: s }) => [
      label,
      String(s.requests),
      String(s.ok),
      String(s.errors.rate_limited),
      String(s.requests - s.ok - s.errors.rate_limited),
      s.offeredRps === undefined ? "—" : fmtNum(s.offeredRps, 3),
      fmtNum(s.throughputRps, 3),
      fmtNum(s.outputTokPerS),
      ms(s.ttftMs),
      ms(s.tpotMs),
      ms(s.itlMs),
      ms(s.e2eMs),
      fmtNum(s.outputTokens.mean),
      s.slo ? `${(100 * s.slo.attainment).toFixed(0)}%` : "—",
      s.slo ? fmtNum(s.slo.goodputRps, 3) : "—",
    ]),
  });
}

export interface AttainmentCurve {
  label: string;
  points: Array<{ rate: number; attainment: number }>;
}

/** SLO attainment (%) against the Poisson rate, one series per configuration, target line dashed. */
export function attainmentPanel(title: string, curves: AttainmentCurve[], target: number, note?: string): Panel {
  const all = curves.flatMap((c) => c.points.map((p) => p.rate));
  const series: Series[] = curves.map((c, i) => ({
    name: c.label,
    color: COLORS[i % COLORS.length]!,
    dash: DASHES[Math.floor(i / 2) % DASHES.length],
    points: [...c.points].sort((a, b) => a.rate - b.rate).map((p) => [p.rate, 100 * p.attainment] as [number, number]),
  }));
  if (all.length > 0) {
    series.push({
      name: `target ${Math.round(100 * target)}%`,
      color: "#999999",
      dash: "4,4",
      points: [
        [Math.min(...all), 100 * target],
        [Math.max(...all), 100 * target],
      ],
    });
  }
  return {
    title,
    xLabel: "Poisson rate (req/s)",
    yLabel: "SLO attainment (%)",
    xTicks: all.length ? niceTicks(0, Math.max(...all)) : undefined,
    yTickFormat: (y) => y.toFixed(0),
    series,
    note,
  };
}

/** Latency CDF panel (values in ms, or s when `seconds`); `slo` (ms) is drawn as a dashed vertical line. */
export function cdfPanel(
  title: string,
  runs: Array<{ label: string; values: number[] }>,
  xLabel: string,
  seconds = false,
  note?: string,
  slo?: number,
): Panel {
  const series: Series[] = runs
    .filter((r) => r.values.length > 0)
    .map((r, i) => ({
      name: r.label,
      color: COLORS[i % COLORS.length]!,
      dash: DASHES[Math.floor(i / 2) % DASHES.length],
      points: cdfPoints(seconds ? r.values.map((v) => v / 1000) : r.values, 80).map(([x, y]) => [x, 100 * y] as [number, number]),
    }));
  if (slo !== undefined) {
    const x = seconds ? slo / 1000 : slo;
    series.push({
      name: "SLO",
      color: "#999999",
      dash: "4,4",
      points: [
        [x, 0],
        [x, 100],
      ],
    });
  }
  // Rendered x ticks: a few nice values, not every distinct sample.
  const xs = series.flatMap((s) => s.points.map(([x]) => x));
  const hi = xs.length ? Math.max(...xs) : 1;
  const ticks = niceTicks(0, hi);
  return { title, xLabel, yLabel: "share of requests (%)", xTicks: ticks, yTickFormat: (y) => y.toFixed(0), series, note };
}

export function chart(panels: Panel[], title: string, subtitle?: string, columns = 2): string {
  return renderChart(panels, { title, subtitle, columns, panelWidth: 520, panelHeight: 360 });
}

/** Multi-turn runs: TTFT and prompt sizes per round index, one block of rows per run. */
export function roundsTable(rows: Array<{ label: string; rounds: RoundStats[] }>): string {
  return markdownTable({
    headers: [
      "run",
      "round",
      "req",
      "ok",
      "prompt tokens mean",
      "reused tokens mean",
      "TTFT ms p50",
      "TTFT ms p90",
      "TPOT ms p50",
      "attain.",
    ],
    rows: rows.flatMap(({ label, rounds }) =>
      rounds.map((r) => [
        label,
        String(r.round + 1),
        String(r.requests),
        String(r.ok),
        fmtNum(r.promptTokens.mean),
        r.reusedTokens ? fmtNum(r.reusedTokens.mean) : "—",
        fmtNum(r.ttftMs.p50),
        fmtNum(r.ttftMs.p90),
        fmtNum(r.tpotMs.p50),
        r.slo ? `${(100 * r.slo.attainment).toFixed(0)}%` : "—",
      ]),
    ),
  });
}

const counts = (m: Record<string, number>) =>
  Object.entries(m)
    .sort(([a], [b]) => a.localeCompare(b))
    .map(([k, n]) => `${k} ${n}`)
    .join(", ") || "—";

/** One line of what ctxbank reported: router reasons, prefill placements, session reuse. */
export function serverCountsLine(c: ServerCounts | undefined): string {
  if (!c) return "server reports: none (no x-ctxbank-route, ctxbank.prefill or ctxbank.session in the answers)";
  const s = c.sessions;
  const reuse =
    s.reported > 0
      ? `${s.reused}/${s.reported} turns reused KV, ${s.reusedTokens} of their ${s.promptTokens} prompt tokens (${fmtNum((100 * s.reusedTokens) / Math.max(1, s.promptTokens))}%)`
      : "—";
  return `route reasons: ${counts(c.routeReason)}; decodes: ${counts(c.routeDecode)}; prefill: ${counts(c.prefillCause)}; sessions: ${reuse}`;
}
