// Seeded random draws for the benches and the load generator: one stream per seed, so a given
// seed reproduces the same arrival times, lengths, documents and task prompts.

export type Rng = () => number;

/** mulberry32: a tiny seeded generator, uniform in [0, 1). */
export function seededRng(seed: number): Rng {
  let a = seed >>> 0;
  return () => {
    a = (a + 0x6d2b79f5) >>> 0;
    let t = a;
    t = Math.imul(t ^ (t >>> 15), t | 1);
    t ^= t + Math.imul(t ^ (t >>> 7), t | 61);
    return ((t ^ (t >>> 14)) >>> 0) / 2 ** 32;
  };
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
