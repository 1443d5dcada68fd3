// Calibration of the sparse policies from measured attention (full attention, decode steps).
// A probe is one decode step's attention per layer, averaged over heads: probe[l][j] is the share
// of layer l's attention on key j (each row sums to 1).
//
// - OmniKV's filter capability (antgroup/OmniKV tiny_runs/ana_motivation2.py): sim(l1, l2) =
//   the share of layer l2's attention mass on layer l1's top-n tokens; capability(l1) = the mean
//   of sim(l1, l2) over the next `span` layers. The recommendation goes one step further than
//   "pick the peaks": it picks the filter layers whose own serving ranges are covered best.
// - Round Attention's watershed: each layer's attention summed per conversation round gives a
//   distribution over rounds; after the watershed layer L_w it hardly changes from layer to layer
//   (KL divergence between consecutive layers stays small).
import { POLICY_DEFAULTS } from "../defaults.ts";

export type Probe = Float32Array[]; // [layer] -> attention over keys

/** Indices of the n largest entries of a row. */
export function topN(row: ArrayLike<number>, n: number): number[] {
  return Array.from({ length: row.length }, (_, i) => i)
    .sort((a, b) => row[b]! - row[a]! || a - b)
    .slice(0, Math.min(n, row.length));
}

/** sim[l1][l2], averaged over probes; n = top-n tokens of layer l1 (per probe). */
export function similarityMatrix(probes: Probe[], topTokens: (nKeys: number) => number): number[][] {
  const L = probes[0]!.length;
  const sim = Array.from({ length: L }, () => new Array<number>(L).fill(0));
  for (const probe of probes) {
    const n = topTokens(probe[0]!.length);
    for (let l1 = 0; l1 < L; l1++) {
      const top = topN(probe[l1]!, n);
      for (let l2 = 0; l2 < L; l2++) {
        const row = probe[l2]!;
        let mass = 0;
        for (const j of top) mass += row[j]!;
        sim[l1]![l2]! += mass / probes.length;
      }
    }
  }
  return sim;
}

/** capability[l] = mean of sim[l][l2] for l2 in (l, l + span]; NaN for the last layer. */
export function filterCapability(sim: number[][], span: number): number[] {
  const L = sim.length;
  return sim.map((row, l) => {
    const later = row.slice(l + 1, Math.min(L, l + 1 + span));
    return later.length === 0 ? Number.NaN : later.reduce((a, b) => a + b, 0) / later.length;
  });
}

/**
 * Mean coverage of a filter-layer choice: for every sparse layer (after a filter layer, past its
 * guard layer, before the next filter layer) the share of its attention that falls on the top
 * tokens of the filter layer that serves it. This is what OmniKV relies on at decode.
 */
export function coverage(sim: number[][], filters: number[], guard: boolean = POLICY_DEFAULTS.omnikv.guard): number {
  let total = 0,
    n = 0;
  filters.forEach((f, i) => {
    const next = filters[i + 1] ?? sim.length;
    for (let l = f + (guard ? 2 : 1); l < next; l++) {
      total += sim[f]![l]!;
      n++;
    }
  });
  return n === 0 ? 0 : total / n;
}

/**
 * The m filter layers with the best coverage, the first at or before `maxFirst` (that bounds
 * the dense layers before it: OmniKV's Llama-3-8B setting keeps 2 of 32 before its first filter
 * layer) and at or after `minFirst`; coverage counted with or without the guard layer (`guard`).
 * Exhaustive over ascending choices; ties go to the earlier layers.
 */
export function recommendFilterLayers(
  sim: number[][],
  m: number,
  maxFirst: number,
  minFirst = 1,
  guard: boolean = POLICY_DEFAULTS.omnikv.guard,
): number[] {
  const L = sim.length;
  let best: number[] = [],
    bestScore = -Infinity;
  const pick = (chosen: number[]): void => {
    if (chosen.length === m) {
      const c = coverage(sim, chosen, guard);
      if (c > bestScore) [best, bestScore] = [chosen.slice(), c];
      return;
    }
    const from = chosen.length === 0 ? minFirst : chosen[chosen.length - 1]! + 2; // room for the guard layer
    const to = chosen.length === 0 ? Math.min(maxFirst, L - 1) : L - 1;
    for (let l = from; l <= to; l++) pick([...chosen, l]);
  };
  pick([]);
  return best;
}

/**
 * The same choice on a model with sliding-window layers, whose policies act on the global layers
 * only (a sliding layer attends its window): made over the similarity among the global layers,
 * where the guard is the next global layer and a filter layer may be the first global one (the
 * sliding layers before it are dense already). Returns model layer indices and their coverage.
 */
export function recommendGlobalFilterLayers(
  sim: number[][],
  globals: readonly number[],
  m: number,
  guard: boolean = POLICY_DEFAULTS.omnikv.guard,
): { filterLayers: number[]; coverage: number } {
  const sub = globals.map((i) => globals.map((j) => sim[i]![j]!));
  const pick = recommendFilterLayers(sub, Math.min(m, globals.length), globals.length - 1, 0, guard);
  return { filterLayers: pick.map((i) => globals[i]!), coverage: coverage(sub, pick, guard) };
}

/** Each layer's attention summed over the token ranges [start, end) of the rounds, normalised. */
export function roundDistributions(probe: Probe, rounds: Array<[number, number]>): number[][] {
  return probe.map((row) => {
    const mass = rounds.map(([a, b]) => {
      let s = 0;
      for (let j = a; j < b; j++) s += row[j]!;
      return s;
    });
    const total = mass.reduce((x, y) => x + y, 0) || 1;
    return mass.map((x) => x / total);
  });
}

/** KL(p || q) in nats, with q floored so an empty round does not make it infinite. */
export function kl(p: number[], q: number[], floor = 1e-9): number {
  let d = 0;
  for (let i = 0; i < p.length; i++) if (p[i]! > 0) d += p[i]! * Math.log(p[i]! / Math.max(q[i]!, floor));
  return d;
}

/** KL between consecutive layers' round distributions (entry l: layer l vs l + 1), averaged over probes. */
export function layerToLayerRoundKl(probes: Probe[], rounds: Array<[number, number]>): number[] {
  const L = probes[0]!.length;
  const out = new Array<number>(L - 1).fill(0);
  for (const probe of probes) {
    const dist = roundDistributions(probe, rounds);
    for (let l = 0; l < L - 1; l++) out[l]! += kl(dist[l]!, dist[l + 1]!) / probes.length;
  }
  return out;
}

/** The first layer after which every consecutive-layer KL stays below `threshold`; null if none. */
export function watershedLayer(klByLayer: number[], threshold: number): number | null {
  let lw: number | null = null;
  for (let l = klByLayer.length - 1; l >= 0 && klByLayer[l]! < threshold; l--) lw = l;
  return lw;
}
