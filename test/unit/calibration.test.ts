import { describe, expect, it } from "vitest";

import {
  coverage,
  filterCapability,
  kl,
  layerToLayerRoundKl,
  recommendFilterLayers,
  recommendGlobalFilterLayers,
  roundDistributions,
  similarityMatrix,
  topN,
  watershedLayer,
} from "../../shared/inference/policy/calibration.ts";

const row = (xs: number[]) => Float32Array.from(xs.map((x) => x / xs.reduce((a, b) => a + b, 0)));

describe("calibration", () => {
  it("topN picks the largest entries, ties to the lower index", () => {
    expect(topN([0.1, 0.5, 0.2, 0.5], 2)).toEqual([1, 3]);
    expect(topN([3, 1], 5)).toEqual([0, 1]);
  });

  it("similarity is the mass a later layer puts on an earlier layer's top tokens", () => {
    // layer 0 looks at key 0, layer 1 at key 3, layer 2 mostly at key 0.
    const probe = [row([8, 1, 1, 0]), row([0, 1, 1, 8]), row([6, 2, 2, 0])];
    const sim = similarityMatrix([probe], () => 1);
    expect(sim[0]![2]).toBeCloseTo(0.6);
    expect(sim[1]![2]).toBeCloseTo(0);
    expect(sim[2]![0]).toBeCloseTo(0.8);
    expect(sim[1]![1]).toBeCloseTo(0.8);
    const cap = filterCapability(sim, 8);
    expect(cap[0]).toBeCloseTo((0.0 + 0.6) / 2);
    expect(cap[1]).toBeCloseTo(0);
    expect(Number.isNaN(cap[2]!)).toBe(true);
  });

  it("recommends the filter layers that cover their own sparse layers best", () => {
    // 8 layers; layer 1's top tokens cover layers 3-4 well, layer 5's cover layer 7.
    const sim: number[][] = Array.from({ length: 8 }, (_, i) => Array.from({ length: 8 }, (_, j) => (i === j ? 1 : 0.2)));
    sim[1]![3] = sim[1]![4] = 0.9;
    sim[4]![6] = sim[4]![7] = 0.9;
    // Sparse layers: 3 (served by 1; 2 is its guard, 4 the next filter), 6 and 7 (served by 4).
    expect(coverage(sim, [1, 4])).toBeCloseTo(0.9);
    expect(coverage(sim, [1, 5])).toBeCloseTo((0.9 + 0.9 + 0.2) / 3);
    expect(recommendFilterLayers(sim, 2, 2)).toEqual([1, 4]);
    // The first filter layer may not come later than maxFirst.
    expect(recommendFilterLayers(sim, 1, 1)).toEqual([1]);
  });

  it("on a model with sliding-window layers, chooses among the global layers", () => {
    // 6 layers, global 1, 3 and 5. Layer 1's top tokens cover layer 5 well, layer 3's cover it badly.
    const sim: number[][] = Array.from({ length: 6 }, (_, i) => Array.from({ length: 6 }, (_, j) => (i === j ? 1 : 0.2)));
    sim[1]![5] = 0.9;
    sim[1]![3] = 0.1;
    sim[3]![5] = 0.6;
    // With the guard (the next global layer, 3), layer 1 serves 5 alone (0.9), and 3 serves none.
    expect(recommendGlobalFilterLayers(sim, [1, 3, 5], 1, true)).toEqual({ filterLayers: [1], coverage: 0.9 });
    // Without it, layer 1 serves 3 and 5 ((0.1 + 0.9) / 2 = 0.5) and layer 3 serves 5 (0.6).
    const unguarded = recommendGlobalFilterLayers(sim, [1, 3, 5], 1, false);
    expect(unguarded.filterLayers).toEqual([3]);
    expect(unguarded.coverage).toBeCloseTo(0.6);
  });

  it("round distributions, KL and the watershed", () => {
    const probe = [row([1, 1, 1, 1]), row([4, 0, 0, 4]), row([4, 0, 0, 4])];
    const d = roundDistributions(probe, [
      [0, 2],
      [2, 4],
    ]);
    expect(d[0]).toEqual([0.5, 0.5]);
    expect(kl([0.5, 0.5], [0.5, 0.5])).toBe(0);
    expect(kl([1, 0], [0.5, 0.5])).toBeCloseTo(Math.log(2));
    const perLayer = layerToLayerRoundKl(
      [probe],
      [
        [0, 1],
        [1, 4],
      ],
    );
    expect(perLayer[0]).toBeGreaterThan(0.01);
    expect(perLayer[1]).toBeCloseTo(0);
    expect(watershedLayer(perLayer, 0.01)).toBe(1);
    expect(watershedLayer([0.5, 0.5], 0.01)).toBeNull();
  });
});
