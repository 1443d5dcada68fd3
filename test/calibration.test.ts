import { describe, expect, it } from "vitest";

import {
  filterCapability,
  kl,
  layerToLayerRoundKl,
  recommendFilterLayers,
  roundDistributions,
  similarityMatrix,
  topN,
  watershedLayer,
} from "../shared/policy/calibration.ts";

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

  it("recommends separated peaks, skipping layer 0 and the last two", () => {
    const cap = [0.99, 0.5, 0.9, 0.85, 0.2, 0.7, 0.6, 0.95, 0.99, Number.NaN];
    expect(recommendFilterLayers(cap, 3, 2)).toEqual([2, 5, 7]);
    expect(recommendFilterLayers(cap, 3, 3)).toEqual([2, 7]); // only two peaks are 3 apart
    expect(recommendFilterLayers(cap, 2, 1)).toEqual([2, 7]);
  });

  it("round distributions, KL and the watershed", () => {
    const probe = [row([1, 1, 1, 1]), row([4, 0, 0, 4]), row([4, 0, 0, 4])];
    const d = roundDistributions(probe, [[0, 2], [2, 4]]);
    expect(d[0]).toEqual([0.5, 0.5]);
    expect(kl([0.5, 0.5], [0.5, 0.5])).toBe(0);
    expect(kl([1, 0], [0.5, 0.5])).toBeCloseTo(Math.log(2));
    const perLayer = layerToLayerRoundKl([probe], [[0, 1], [1, 4]]);
    expect(perLayer[0]).toBeGreaterThan(0.01);
    expect(perLayer[1]).toBeCloseTo(0);
    expect(watershedLayer(perLayer, 0.01)).toBe(1);
    expect(watershedLayer([0.5, 0.5], 0.01)).toBeNull();
  });
});
