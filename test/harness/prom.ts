// /metrics for tests, read with the dashboard's own parser (services/decode/dashboard/prom-parse.js)
// but strictly: a line it cannot read fails the test. Adds what assertions want: every sample in
// one list, and sums or single values over samples whose labels match.
import { parsePrometheus, type Family, type Sample } from "../../services/decode/dashboard/prom-parse.js";

export interface Scrape {
  /** Families by name, with their TYPE and HELP (as the parser groups them). */
  families: Map<string, Family>;
  /** Every sample, in the order of the text. */
  samples: Sample[];
  /** Sum of the samples named `name` whose labels include every pair in `match` (0 when none). */
  sum(name: string, match?: Record<string, string>): number;
  /** The one sample named `name` matching `match`; throws unless there is exactly one. */
  get(name: string, match?: Record<string, string>): number;
  /** How many samples named `name` match. */
  count(name: string, match?: Record<string, string>): number;
}

export function parseProm(text: string): Scrape {
  const { families, errors } = parsePrometheus(text);
  if (errors.length > 0) throw new Error(`unreadable /metrics text:\n${errors.join("\n")}`);
  const samples = [...families.values()].flatMap((f) => f.samples);
  const matching = (name: string, match: Record<string, string> = {}) =>
    samples.filter((s) => s.name === name && Object.entries(match).every(([k, v]) => s.labels[k] === v));
  return {
    families,
    samples,
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
