// The dashboard's charts (uPlot): which series each chart draws, and keeping them in step with
// the data. A chart whose set of series changes (a transport used for the first time, a tier a
// process reports) is rebuilt; otherwise only its data is replaced.
import uPlot from "./uplot.esm.js";
import { byteRate, bytes, duration, num, percent, perSecond } from "./format.js";
import { QUANTILE_MS, RATE_MS, SLOS, TIERS } from "./stats.js";

const PALETTE = ["#2563eb", "#16a34a", "#dc2626", "#9333ea", "#ea580c", "#0891b2", "#ca8a04", "#db2777"];
const QUANTILE_COLORS = { p50: "#16a34a", p90: "#ea580c", p99: "#dc2626" };
const TARGET = { color: "#475569", dash: [6, 4] };
// A wide pale line drawn first, so that lines equal to it (goodput = requests, every SLO at 100%) stay visible on top.
const UNDER = { color: "#93c5fd", width: 6 };
const suffixed = (keys, prefix) =>
  [...keys]
    .filter((k) => k.startsWith(prefix))
    .map((k) => k.slice(prefix.length))
    .sort();
const rateNote = `${RATE_MS / 1000} s rate`;
const quantileNote = `over ${QUANTILE_MS / 1000} s`;

function latency(kind) {
  return (keys) => [
    ...["p50", "p90", "p99"].map((p) => ({ key: `${kind}.${p}`, label: p, color: QUANTILE_COLORS[p] })),
    ...(keys.has(`target.${kind}`) ? [{ key: `target.${kind}`, label: "SLO target", reference: true, ...TARGET }] : []),
  ];
}

/**
 * Chart definitions: id, title, value formatter, fixed y range (else 0..max), and the lines to draw
 * given the series keys present ({key, label, color?, group? (shares a colour), dash?, reference?
 * (a target or capacity, not data)}).
 */
export const CHARTS = [
  {
    id: "throughput",
    title: `Requests/s (${rateNote})`,
    fmt: perSecond,
    lines: () => [
      { key: "requestRate", label: "requests", ...UNDER },
      { key: "goodput", label: "goodput (all SLOs met)" },
      { key: "failureRate", label: "failures" },
    ],
  },
  {
    id: "attainment",
    title: `SLO attainment (${quantileNote})`,
    fmt: percent,
    range: [0, 1.05],
    lines: (keys) =>
      SLOS.filter((slo) => keys.has(`attainment.${slo}`)).map((slo) => ({
        key: `attainment.${slo}`,
        label: slo,
        ...(slo === "all" ? UNDER : {}),
      })),
  },
  { id: "ttft", title: `Time to first token (${quantileNote})`, fmt: duration, lines: latency("ttft") },
  { id: "tpot", title: `Time per output token (${quantileNote})`, fmt: duration, lines: latency("tpot") },
  {
    id: "queues",
    title: "Requests running / waiting",
    fmt: num,
    lines: (keys) =>
      suffixed(keys, "running.").flatMap((service, i) => [
        { key: `running.${service}`, label: `${service} running`, group: i },
        { key: `waiting.${service}`, label: `${service} waiting`, group: i, dash: [4, 3] },
      ]),
  },
  {
    id: "kv",
    title: "KV memory by tier (dashed: capacity)",
    fmt: bytes,
    lines: (keys) =>
      TIERS.filter((tier) => keys.has(`kv.${tier}`)).flatMap((tier, i) => [
        { key: `kv.${tier}`, label: tier, group: i },
        ...(keys.has(`kvcap.${tier}`)
          ? [{ key: `kvcap.${tier}`, label: `${tier} capacity`, group: i, dash: [6, 4], reference: true }]
          : []),
      ]),
  },
  {
    id: "transfer",
    title: `KV transfer by transport (${rateNote})`,
    fmt: byteRate,
    lines: (keys) => suffixed(keys, "transfer.").map((transport) => ({ key: `transfer.${transport}`, label: transport })),
  },
  {
    id: "tokens",
    title: `Tokens/s (${rateNote})`,
    fmt: perSecond,
    lines: () => [
      { key: "promptTokenRate", label: "prompt" },
      { key: "generationTokenRate", label: "generated" },
    ],
  },
];

/** Seconds since the epoch as a local wall-clock time, 13:36:05. */
const clock = (v) =>
  Number.isFinite(v)
    ? new Date(v * 1000).toLocaleTimeString([], { hour: "2-digit", minute: "2-digit", second: "2-digit", hour12: false })
    : "—";

function options(def, lines, width) {
  return {
    width,
    height: 220,
    legend: { live: true },
    cursor: { drag: { x: false, y: false } },
    scales: {
      x: { time: true },
      y: { range: def.range ? () => def.range : (_u, _min, max) => [0, max > 0 ? max * 1.15 : 1] },
    },
    axes: [
      { space: 70, values: (_u, splits) => splits.map((v) => clock(v)) },
      { size: 72, values: (_u, splits) => splits.map((v) => def.fmt(v)) },
    ],
    series: [
      { value: (_u, v) => clock(v) },
      ...lines.map((l, i) => ({
        label: l.label,
        stroke: l.color ?? PALETTE[(l.group ?? i) % PALETTE.length],
        width: l.width ?? 2,
        dash: l.dash,
        points: { show: false },
        value: (_u, v) => def.fmt(v),
      })),
    ],
  };
}

/** One chart: a card with a title, an empty-state note and the plot, kept in step with the data. */
export class Chart {
  constructor(def, parent) {
    this.def = def;
    this.card = document.createElement("section");
    this.card.className = "chart";
    this.card.dataset.chart = def.id;
    this.card.innerHTML = `<h2></h2><p class="empty">No data yet</p><div class="plot"></div>`;
    this.card.querySelector("h2").textContent = def.title;
    this.plotEl = this.card.querySelector(".plot");
    parent.append(this.card);
    this.plot = null;
    this.signature = "";
    new ResizeObserver(() => this.plot?.setSize({ width: this.width(), height: 220 })).observe(this.card);
  }

  width() {
    return Math.max(200, this.card.clientWidth - 24);
  }

  /** `t` in seconds, `series` key → values (null = no value). */
  update(t, series) {
    const lines = this.def.lines(new Set(series.keys()));
    const data = [t, ...lines.map((l) => series.get(l.key) ?? t.map(() => null))];
    // Reference lines (SLO targets, capacities) alone are not data.
    const points = lines.reduce((n, l, i) => n + (l.reference ? 0 : data[i + 1].filter((v) => v !== null).length), 0);
    this.card.classList.toggle("no-data", points === 0);
    this.card.dataset.points = String(points);
    const signature = lines.map((l) => l.key).join("|");
    if (signature !== this.signature || !this.plot) {
      this.plot?.destroy();
      this.signature = signature;
      this.plot = new uPlot(options(this.def, lines, this.width()), data, this.plotEl);
    } else {
      this.plot.setData(data);
    }
    // Without a cursor on the plot, the legend shows the latest values rather than dashes.
    if (this.plot.cursor.idx == null && t.length > 0) this.plot.setLegend({ idx: t.length - 1 });
  }
}
