// A small dependency-free SVG line chart: one or more panels side by side, each with its own
// axes, series (colour, dash, markers) and legend. Enough for benchmark plots that are committed
// next to their JSON and read on GitHub; no fonts are measured, so labels are kept short.

export interface Series {
  name: string;
  color: string;
  dash?: string;
  /** [x, y] points; drawn in the given order. */
  points: Array<[number, number]>;
  /** Print the y value next to each marker. */
  labels?: boolean;
}

export interface Panel {
  title: string;
  xLabel: string;
  yLabel: string;
  /** Log-2 x axis (prompt lengths 512..8192 read best that way). */
  xLog2?: boolean;
  /** Explicit x ticks (values); default: the distinct x values of the series. */
  xTicks?: number[];
  xTickFormat?: (x: number) => string;
  yTickFormat?: (y: number) => string;
  /** Lower bound of the y axis (default 0). */
  yMin?: number;
  series: Series[];
  /** A line of small print under the panel. */
  note?: string;
}

export interface ChartOptions {
  title: string;
  subtitle?: string;
  panelWidth?: number;
  panelHeight?: number;
  /** Panels per row (default: all in one row). */
  columns?: number;
}

const esc = (s: string) => s.replace(/&/g, "&amp;").replace(/</g, "&lt;").replace(/>/g, "&gt;").replace(/"/g, "&quot;");

/** 1-2-5 "nice" ticks covering [lo, hi]. */
export function niceTicks(lo: number, hi: number, target = 5): number[] {
  if (!(hi > lo)) return [lo];
  const raw = (hi - lo) / target;
  const mag = 10 ** Math.floor(Math.log10(raw));
  const step = [1, 2, 2.5, 5, 10].map((m) => m * mag).find((s) => s >= raw) ?? 10 * mag;
  const out: number[] = [];
  for (let v = Math.ceil(lo / step) * step; v <= hi + step * 1e-9; v += step) out.push(Number(v.toPrecision(12)));
  return out;
}

function defaultFormat(v: number): string {
  const a = Math.abs(v);
  if (a >= 1000 && v % 1024 === 0) return `${v / 1024}K`;
  if (a >= 10000) return `${Math.round(v / 1000)}k`;
  if (Number.isInteger(v) || a >= 100) return String(Math.round(v));
  // Three significant digits; trailing zeros go only after a decimal point (120.2 is "120", not "12").
  return v
    .toPrecision(3)
    .replace(/(\.\d*?)0+$/, "$1")
    .replace(/\.$/, "");
}

function renderPanel(p: Panel, x0: number, y0: number, w: number, h: number): string {
  // Legend below the x-axis label (one line per series), then the note: nothing covers the data.
  const legendH = p.series.length * 15 + 6;
  const m = { left: 58, right: 14, top: 30, bottom: 46 + legendH + (p.note ? 14 : 0) };
  const pw = w - m.left - m.right;
  const ph = h - m.top - m.bottom;
  const xs = p.series.flatMap((s) => s.points.map(([x]) => x));
  const ys = p.series.flatMap((s) => s.points.map(([, y]) => y)).filter(Number.isFinite);
  const tx = (v: number) => (p.xLog2 ? Math.log2(v) : v);
  const xTicks = p.xTicks ?? [...new Set(xs)].sort((a, b) => a - b);
  let xlo = Math.min(...xTicks.map(tx), ...xs.map(tx));
  let xhi = Math.max(...xTicks.map(tx), ...xs.map(tx));
  if (!(xhi > xlo)) {
    xlo -= 1;
    xhi += 1;
  }
  const xpad = (xhi - xlo) * 0.05;
  xlo -= xpad;
  xhi += xpad;
  const yMin = p.yMin ?? 0;
  const yTicks = niceTicks(yMin, Math.max(yMin + 1e-9, ...ys) * 1.08);
  const yhi = Math.max(yTicks[yTicks.length - 1]!, ...ys);
  const px = (v: number) => x0 + m.left + ((tx(v) - xlo) / (xhi - xlo)) * pw;
  const py = (v: number) => y0 + m.top + ph - ((v - yMin) / (yhi - yMin)) * ph;
  const fx = p.xTickFormat ?? defaultFormat;
  const fy = p.yTickFormat ?? defaultFormat;
  const out: string[] = [];
  out.push(`<g class="panel">`);
  out.push(`<text x="${x0 + m.left}" y="${y0 + 18}" class="ptitle">${esc(p.title)}</text>`);
  out.push(`<rect x="${x0 + m.left}" y="${y0 + m.top}" width="${pw}" height="${ph}" class="frame"/>`);
  for (const t of yTicks) {
    const y = py(t).toFixed(1);
    out.push(`<line x1="${x0 + m.left}" x2="${x0 + m.left + pw}" y1="${y}" y2="${y}" class="grid"/>`);
    out.push(`<text x="${x0 + m.left - 6}" y="${y}" class="ytick">${esc(fy(t))}</text>`);
  }
  for (const t of xTicks) {
    const x = px(t).toFixed(1);
    out.push(`<line x1="${x}" x2="${x}" y1="${y0 + m.top}" y2="${y0 + m.top + ph}" class="grid"/>`);
    out.push(`<text x="${x}" y="${y0 + m.top + ph + 15}" class="xtick">${esc(fx(t))}</text>`);
  }
  out.push(`<text x="${x0 + m.left + pw / 2}" y="${y0 + m.top + ph + 33}" class="xlabel">${esc(p.xLabel)}</text>`);
  const ly = y0 + m.top + ph / 2;
  out.push(`<text x="${x0 + 14}" y="${ly}" class="ylabel" transform="rotate(-90 ${x0 + 14} ${ly})">${esc(p.yLabel)}</text>`);
  if (p.note) out.push(`<text x="${x0 + m.left}" y="${y0 + h - 6}" class="note">${esc(p.note)}</text>`);

  for (const s of p.series) {
    const pts = s.points.filter(([, y]) => Number.isFinite(y));
    if (pts.length === 0) continue;
    const d = pts.map(([x, y], i) => `${i === 0 ? "M" : "L"}${px(x).toFixed(1)},${py(y).toFixed(1)}`).join(" ");
    out.push(`<path d="${d}" fill="none" stroke="${s.color}" stroke-width="2"${s.dash ? ` stroke-dasharray="${s.dash}"` : ""}/>`);
    for (const [x, y] of pts) {
      out.push(`<circle cx="${px(x).toFixed(1)}" cy="${py(y).toFixed(1)}" r="3.2" fill="${s.color}"/>`);
      if (s.labels) {
        out.push(`<text x="${(px(x) + 5).toFixed(1)}" y="${(py(y) - 6).toFixed(1)}" class="vlabel" fill="${s.color}">${esc(fy(y))}</text>`);
      }
    }
  }
  // Legend, under the x-axis label.
  let lyy = y0 + m.top + ph + 56;
  const lx = x0 + m.left + 4;
  for (const s of p.series) {
    out.push(
      `<line x1="${lx}" x2="${lx + 22}" y1="${lyy - 4}" y2="${lyy - 4}" stroke="${s.color}" stroke-width="2"${s.dash ? ` stroke-dasharray="${s.dash}"` : ""}/>`,
    );
    out.push(`<circle cx="${lx + 11}" cy="${lyy - 4}" r="3" fill="${s.color}"/>`);
    out.push(`<text x="${lx + 28}" y="${lyy}" class="ltext">${esc(s.name)}</text>`);
    lyy += 15;
  }
  out.push(`</g>`);
  return out.join("\n");
}

export function renderChart(panels: Panel[], opts: ChartOptions): string {
  const pw = opts.panelWidth ?? 460;
  const ph = opts.panelHeight ?? 340;
  const cols = Math.max(1, Math.min(opts.columns ?? panels.length, panels.length));
  const rows = Math.ceil(panels.length / cols);
  const head = opts.subtitle ? 46 : 30;
  const W = pw * cols;
  const H = head + ph * rows;
  const body = panels.map((p, i) => renderPanel(p, (i % cols) * pw, head + Math.floor(i / cols) * ph, pw, ph));
  return [
    `<svg xmlns="http://www.w3.org/2000/svg" width="${W}" height="${H}" viewBox="0 0 ${W} ${H}" font-family="Helvetica, Arial, sans-serif">`,
    `<style>`,
    `.title{font-size:15px;font-weight:bold}.subtitle{font-size:11px;fill:#555}.ptitle{font-size:13px;font-weight:bold}`,
    `.frame{fill:none;stroke:#999}.grid{stroke:#e3e3e3}`,
    `.xtick{font-size:11px;text-anchor:middle}.ytick{font-size:11px;text-anchor:end;dominant-baseline:middle}`,
    `.xlabel,.ylabel{font-size:12px;text-anchor:middle}.ltext{font-size:11px}.vlabel{font-size:10px}.note{font-size:10px;fill:#666}`,
    `</style>`,
    `<rect width="100%" height="100%" fill="#fff"/>`,
    `<text x="10" y="20" class="title">${esc(opts.title)}</text>`,
    opts.subtitle ? `<text x="10" y="37" class="subtitle">${esc(opts.subtitle)}</text>` : "",
    ...body,
    `</svg>`,
    "",
  ].join("\n");
}
