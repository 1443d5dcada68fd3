// Plain-text and Markdown tables: the CLI's listings (ctxbank models) and the benchmarks' reports.

export type Align = "left" | "right";

export interface Table {
  headers: string[];
  rows: string[][];
  /** Per column; numbers read best right-aligned (the default for every column but the first). */
  align?: Align[];
}

function alignOf(t: Table, i: number): Align {
  return t.align?.[i] ?? (i === 0 ? "left" : "right");
}

export function textTable(t: Table): string {
  const widths = t.headers.map((h, i) => Math.max(h.length, ...t.rows.map((r) => (r[i] ?? "").length)));
  const fmt = (cells: string[]) =>
    cells
      .map((c, i) => (alignOf(t, i) === "right" ? c.padStart(widths[i]!) : c.padEnd(widths[i]!)))
      .join("  ")
      .trimEnd();
  return [fmt(t.headers), widths.map((w) => "-".repeat(w)).join("  "), ...t.rows.map(fmt)].join("\n");
}

export function markdownTable(t: Table): string {
  const sep = t.headers.map((_, i) => (alignOf(t, i) === "right" ? "---:" : ":---"));
  const line = (cells: string[]) => `| ${cells.map((c) => c.replace(/\|/g, "\\|")).join(" | ")} |`;
  return [line(t.headers), line(sep), ...t.rows.map(line)].join("\n");
}

/** Fixed decimals chosen by magnitude: 1234 → "1234", 98.76 → "98.8", 1.234 → "1.23". */
export function fmtNum(x: number | undefined, digits?: number): string {
  if (x === undefined || !Number.isFinite(x)) return "—";
  if (digits !== undefined) return x.toFixed(digits);
  const a = Math.abs(x);
  return x.toFixed(a >= 1000 ? 0 : a >= 100 ? 1 : a >= 10 ? 1 : 2);
}
