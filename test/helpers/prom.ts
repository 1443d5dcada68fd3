// A small reader of the Prometheus text exposition format for tests: samples with their labels,
// the TYPE and HELP of each family, and sums over samples whose labels match.

export interface Sample {
  name: string;
  labels: Record<string, string>;
  value: number;
}

export interface Scrape {
  samples: Sample[];
  types: Map<string, string>;
  help: Map<string, string>;
  /** Sum of the samples named `name` whose labels include every pair in `match` (0 when none). */
  sum(name: string, match?: Record<string, string>): number;
  /** The one sample named `name` matching `match`; throws unless there is exactly one. */
  get(name: string, match?: Record<string, string>): number;
  /** How many samples named `name` match. */
  count(name: string, match?: Record<string, string>): number;
}

const SAMPLE = /^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{(.*)\})?\s+(\S+)(\s+-?\d+)?$/;

function parseLabels(text: string, line: string): Record<string, string> {
  const labels: Record<string, string> = {};
  let i = 0;
  while (i < text.length) {
    const m = /^\s*([a-zA-Z_][a-zA-Z0-9_]*)\s*=\s*"/.exec(text.slice(i));
    if (!m) {
      if (/^\s*,?\s*$/.test(text.slice(i))) break;
      throw new Error(`bad labels in: ${line}`);
    }
    i += m[0].length;
    let value = "";
    for (;;) {
      const ch = text[i++];
      if (ch === undefined) throw new Error(`unterminated label value in: ${line}`);
      if (ch === '"') break;
      if (ch === "\\") {
        const next = text[i++];
        value += next === "n" ? "\n" : next;
      } else value += ch;
    }
    labels[m[1]!] = value;
    const comma = /^\s*,?/.exec(text.slice(i))!;
    i += comma[0].length;
  }
  return labels;
}

function parseValue(v: string): number {
  if (v === "+Inf") return Infinity;
  if (v === "-Inf") return -Infinity;
  if (v.toLowerCase() === "nan") return NaN; // prom-client writes "Nan"; Prometheus parses it case-insensitively
  const n = Number(v);
  if (Number.isNaN(n)) throw new Error(`bad sample value ${v}`);
  return n;
}

export function parseProm(text: string): Scrape {
  const samples: Sample[] = [];
  const types = new Map<string, string>();
  const help = new Map<string, string>();
  for (const line of text.split("\n")) {
    if (line.trim() === "") continue;
    const meta = /^#\s+(TYPE|HELP)\s+(\S+)\s*(.*)$/.exec(line);
    if (meta) {
      (meta[1] === "TYPE" ? types : help).set(meta[2]!, meta[3]!);
      continue;
    }
    if (line.startsWith("#")) continue;
    const m = SAMPLE.exec(line);
    if (!m) throw new Error(`not a sample line: ${line}`);
    samples.push({ name: m[1]!, labels: m[3] ? parseLabels(m[3], line) : {}, value: parseValue(m[4]!) });
  }
  const matching = (name: string, match: Record<string, string> = {}) =>
    samples.filter((s) => s.name === name && Object.entries(match).every(([k, v]) => s.labels[k] === v));
  return {
    samples,
    types,
    help,
    sum: (name, match) => matching(name, match).reduce((a, s) => a + s.value, 0),
    count: (name, match) => matching(name, match).length,
    get(name, match) {
      const found = matching(name, match);
      if (found.length !== 1) throw new Error(`${found.length} samples of ${name} match ${JSON.stringify(match ?? {})}`);
      return found[0]!.value;
    },
  };
}

export async function scrape(baseUrl: string): Promise<Scrape> {
  const res = await fetch(`${baseUrl}/metrics`);
  if (res.status !== 200) throw new Error(`GET /metrics answered ${res.status}`);
  return parseProm(await res.text());
}
