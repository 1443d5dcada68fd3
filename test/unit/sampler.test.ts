import { describe, expect, it } from "vitest";

import { MAX_TOP_K, Rng, Sampler, SamplingError, topIndices } from "../../shared/inference/engine/sampler.ts";

const logits = Float32Array.from([Math.log(0.5), Math.log(0.3), Math.log(0.2), -Infinity]);

function frequencies(s: Sampler, n: number): number[] {
  const counts = [0, 0, 0, 0];
  for (let i = 0; i < n; i++) counts[s.sample(logits)]!++;
  return counts.map((c) => c / n);
}

describe("Sampler", () => {
  it("is greedy at temperature 0", () => {
    expect(new Sampler({ temperature: 0 }).sample(Float32Array.from([1, 5, 3]))).toBe(1);
  });

  it("samples in proportion to softmax(logits / T)", () => {
    const f = frequencies(new Sampler({ temperature: 1, topK: 0, seed: 1 }), 40_000);
    expect(f[0]).toBeCloseTo(0.5, 1);
    expect(f[1]).toBeCloseTo(0.3, 1);
    expect(f[2]).toBeCloseTo(0.2, 1);
    expect(f[3]).toBe(0);
  });

  it("top-k and top-p cut the tail", () => {
    const k2 = frequencies(new Sampler({ temperature: 1, topK: 2, seed: 2 }), 20_000);
    expect(k2[2]).toBe(0);
    expect(k2[0]! / k2[1]!).toBeCloseTo(0.5 / 0.3, 0);
    // p = 0.75 keeps {0.5, 0.3}: the shortest prefix reaching 0.75.
    const p = frequencies(new Sampler({ temperature: 1, topK: 0, topP: 0.75, seed: 3 }), 20_000);
    expect(p[2]).toBe(0);
    expect(new Sampler({ temperature: 1, topP: 0.01, seed: 4 }).sample(logits)).toBe(0);
  });

  it("is reproducible for a seed and differs across seeds", () => {
    const big = Float32Array.from({ length: 1000 }, (_, i) => Math.sin(i) * 3);
    const run = (seed: number) => {
      const s = new Sampler({ temperature: 1.2, topK: 100, seed });
      return Array.from({ length: 50 }, () => s.sample(big));
    };
    expect(run(7)).toEqual(run(7));
    expect(run(7)).not.toEqual(run(8));
  });

  it("selects the k best tokens as a full sort would, ties to the lower id", () => {
    const r = new Rng(9);
    for (const [n, k] of [
      [1, 1],
      [5, 5],
      [100, 7],
      [1000, 1000],
      [49_152, 40],
      [49_152, 1000],
      [3000, 2999],
    ] as const) {
      // Few distinct values: many ties, the case a selection gets wrong first.
      const logits = Float32Array.from({ length: n }, () => Math.floor(r.next() * 50) / 7);
      const want = Array.from({ length: n }, (_, i) => i)
        .sort((a, b) => logits[b]! - logits[a]! || a - b)
        .slice(0, k);
      expect(Array.from(topIndices(logits, k)), `n ${n} k ${k}`).toEqual(want);
    }
  });

  it("keeps the nucleus without top-k over a large vocabulary", () => {
    // 49,152 tokens: 3 carry 0.5 / 0.3 / 0.15, the rest share 0.05.
    const n = 49_152;
    const logits = new Float32Array(n).fill(Math.log(0.05 / (n - 3)));
    logits[7] = Math.log(0.5);
    logits[40_000] = Math.log(0.3);
    logits[123] = Math.log(0.15);
    const s = new Sampler({ temperature: 1, topK: 0, topP: 0.9, seed: 5 });
    const seen = new Set(Array.from({ length: 300 }, () => s.sample(logits)));
    expect(seen).toEqual(new Set([7, 40_000, 123]));
    // The whole distribution (no top-k, no nucleus) reaches the tail.
    const all = new Sampler({ temperature: 1, topK: 0, topP: 1, seed: 6 });
    const tail = Array.from({ length: 1500 }, () => all.sample(logits)).filter((id) => id !== 7 && id !== 40_000 && id !== 123);
    expect(tail.length / 1500).toBeGreaterThan(0.025);
    expect(tail.length / 1500).toBeLessThan(0.08);
  });

  it("rejects bad options with clear errors", () => {
    expect(() => new Sampler({ topK: MAX_TOP_K + 1 })).toThrow(/top_k must be an integer in \[0, 1000\]/);
    expect(new Sampler({ topK: MAX_TOP_K }).options.topK).toBe(MAX_TOP_K);
    expect(() => new Sampler({ temperature: -1 })).toThrow(SamplingError);
    expect(() => new Sampler({ temperature: Number.NaN })).toThrow(/temperature/);
    expect(() => new Sampler({ topK: 1.5 })).toThrow(/top_k/);
    expect(() => new Sampler({ topP: 0 })).toThrow(/top_p/);
    expect(() => new Sampler({ seed: -3 })).toThrow(/seed/);
  });
});

describe("Rng", () => {
  it("is uniform in [0, 1)", () => {
    const r = new Rng(42);
    let sum = 0,
      min = 1,
      max = 0;
    for (let i = 0; i < 100_000; i++) {
      const x = r.next();
      sum += x;
      min = Math.min(min, x);
      max = Math.max(max, x);
    }
    expect(min).toBeGreaterThanOrEqual(0);
    expect(max).toBeLessThan(1);
    expect(sum / 100_000).toBeCloseTo(0.5, 2);
  });
});
