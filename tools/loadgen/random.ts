// Seeded random draws for the load generator: one stream per run, so a given --seed reproduces
// the same arrival times, lengths and documents. The generator is the fidelity bench's mulberry32.
import { seededRng } from "../../bench/fidelity/tasks.ts";

export type Rng = () => number;

export function makeRng(seed: number): Rng {
  return seededRng(seed);
}

/** Exponential draw with the given rate (mean 1/rate), by inversion; never 0 or Infinity. */
export function exponential(rng: Rng, rate: number): number {
  const u = rng(); // [0, 1): 1 - u is in (0, 1]
  return -Math.log(1 - u) / rate;
}

/** Standard normal draw (Box-Muller; the second value is dropped to keep the stream simple). */
export function standardNormal(rng: Rng): number {
  const u1 = 1 - rng(); // (0, 1]
  const u2 = rng();
  return Math.sqrt(-2 * Math.log(u1)) * Math.cos(2 * Math.PI * u2);
}

/** Integer uniform in [lo, hi]. */
export function uniformInt(rng: Rng, lo: number, hi: number): number {
  return lo + Math.floor(rng() * (hi - lo + 1));
}
