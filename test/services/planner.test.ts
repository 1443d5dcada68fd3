// tools/planner's formulas: model facts from GGUF metadata, Fu's four costs (docs/algorithms.md), the M/D/1
// prefill queue, the continuous-batching decode instance and the replica plan.
import { describe, expect, it } from "vitest";
import {
  contextSwitchSeconds,
  decodeMaxRate,
  decodeMemorySeconds,
  decodeStepSeconds,
  fourCosts,
  kvBytes,
  maxConcurrency,
  md1Quantile,
  prefillFlops,
  prefillMaxRate,
  prefillSeconds,
  replicaPlan,
  type Hardware,
} from "../../tools/planner/costs.ts";
import { parseQuantity } from "../../tools/planner/cli.ts";
import { factsFromGguf, type ModelFacts } from "../../tools/planner/model.ts";

const t = (name: string, shape: number[], bytesPerEl = 1) => ({
  name,
  type: "Q8_0",
  shape,
  offset: 0,
  nBytes: shape.reduce((p, x) => p * x, 1) * bytesPerEl,
});

// SmolLM2-135M's shapes (L=30, H=9, Hkv=3, d=64, 576 wide, 1536 FFN, 49152 vocab, tied output).
const smolTensors = [
  t("token_embd.weight", [576, 49152]),
  ...Array.from({ length: 30 }, (_, i) => [
    t(`blk.${i}.attn_norm.weight`, [576], 4),
    t(`blk.${i}.attn_q.weight`, [576, 576]),
    t(`blk.${i}.attn_k.weight`, [576, 192]),
    t(`blk.${i}.attn_v.weight`, [576, 192]),
    t(`blk.${i}.attn_output.weight`, [576, 576]),
    t(`blk.${i}.ffn_gate.weight`, [576, 1536]),
    t(`blk.${i}.ffn_up.weight`, [576, 1536]),
    t(`blk.${i}.ffn_down.weight`, [1536, 576]),
  ]).flat(),
];
const smolMeta = {
  "general.architecture": "llama",
  "general.name": "smol",
  "llama.block_count": 30,
  "llama.attention.head_count": 9,
  "llama.attention.head_count_kv": 3,
  "llama.embedding_length": 576,
  "llama.vocab_size": 49152,
};

describe("model facts", () => {
  it("KV bytes per token, block and output parameters from the GGUF", () => {
    const m = factsFromGguf(smolMeta, smolTensors);
    expect(m.kvBytesPerToken).toBe(23_040); // 2 · 30 · 3 · 64 · 2 (docs/algorithms.md)
    expect(m.headDim).toBe(64);
    expect(m.blockParams).toBe(30 * (2 * 576 * 576 + 2 * 576 * 192 + 3 * 576 * 1536));
    expect(m.outputParams).toBe(576 * 49152); // tied: the embedding is the output head
    expect(m.nVocab).toBe(49152);
    expect(m.weightBytes).toBe(smolTensors.reduce((s, x) => s + x.nBytes, 0));
    const untied = factsFromGguf(smolMeta, [...smolTensors, t("output.weight", [576, 1000])]);
    expect(untied.outputParams).toBe(576_000);
    expect(() => factsFromGguf({ "general.architecture": "llama" }, smolTensors)).toThrow(/block_count/);
  });
});

// A toy model with round numbers.
const toy: ModelFacts = {
  name: "toy",
  nLayer: 2,
  nHead: 4,
  nHeadKv: 2,
  headDim: 8,
  nEmbd: 32,
  nVocab: 100,
  weightBytes: 100e6,
  blockParams: 1e6,
  outputParams: 1e4,
  kvBytesPerToken: 1000,
};
const hw: Hardware = { flops: 1e10, memBw: 1e10, memBytes: 1.1e9, linkBw: 1e9 };

describe("Fu's four costs", () => {
  it("concurrency bound by memory: floor((M − W) / KV(N))", () => {
    expect(kvBytes(toy, 4096)).toBe(4_096_000);
    expect(maxConcurrency(toy, hw, 4096)).toBe(Math.floor(1e9 / 4_096_000)); // 244
    expect(maxConcurrency(toy, { ...hw, memBytes: 50e6 }, 10)).toBe(0);
  });

  it("prefill FLOPs: 2·P·N + 2·L·N²·H·d + the output head once; time = FLOPs / FLOP/s", () => {
    expect(prefillFlops(toy, 100)).toBe(2 * 1e6 * 100 + 2 * 2 * 100 * 100 * 4 * 8 + 2 * 1e4);
    // Doubling N doubles the linear part and quadruples the attention part.
    const lin = (n: number) => 2 * 1e6 * n + 2e4;
    expect(prefillFlops(toy, 2000) - lin(2000)).toBeCloseTo(4 * (prefillFlops(toy, 1000) - lin(1000)), 6);
    expect(prefillSeconds(toy, hw, 100)).toBeCloseTo(prefillFlops(toy, 100) / 1e10, 15);
  });

  it("decode: (weights + KV) / bandwidth at batch 1; the roofline takes compute when that is slower", () => {
    expect(decodeMemorySeconds(toy, hw, 1000)).toBeCloseTo((100e6 + 1e6) / 1e10, 15);
    expect(decodeStepSeconds(toy, hw, 1000)).toBeCloseTo((100e6 + 1e6) / 1e10, 15); // compute ~2e6 FLOPs: negligible
    expect(decodeMemorySeconds(toy, hw, 1000, 8)).toBeCloseTo((100e6 + 8e6) / 1e10, 15);
    const slow: Hardware = { ...hw, decodeFlops: { rate: 1e8, upToBatch: 4 } };
    const flopsPerToken = 2 * 1e6 + 2 * 1e4 + 4 * 2 * 1000 * 4 * 8;
    expect(decodeStepSeconds(toy, slow, 1000, 1)).toBeCloseTo(flopsPerToken / 1e8, 12); // 1-thread compute bound
    expect(decodeStepSeconds(toy, slow, 1000, 8)).toBeCloseTo(Math.max(108e6 / 1e10, (8 * flopsPerToken) / 1e10), 12); // batch > 4: all threads
  });

  it("context switch: KV bytes over the link", () => {
    expect(contextSwitchSeconds(toy, hw, 4096)).toBeCloseTo(4.096e-3, 12);
    const c = fourCosts(toy, hw, 4096, 128);
    expect(c.concurrency).toBe(Math.floor(1e9 / (4224 * 1000)));
    expect(c.kvBytes).toBe(4_096_000);
  });
});

describe("M/D/1 prefill queue", () => {
  it("an idle-enough instance answers in the service time: P(no wait) = 1 − ρ", () => {
    expect(md1Quantile(0.5, 1, 0.4)).toBe(1); // ρ = 0.5: 50% never wait, so the 40th percentile is D
    expect(md1Quantile(0.5, 1, 0.6)).toBeGreaterThan(1);
    expect(md1Quantile(1, 1, 0.5)).toBe(Infinity);
  });

  it("matches Erlang's exact M/D/1 waiting-time distribution", () => {
    // P(W <= t) = (1 − ρ) Σ_{k=0}^{⌊t/D⌋} [λ(kD − t)]^k / k! · e^{−λ(kD − t)}
    const exactCdf = (lambda: number, D: number, tw: number) => {
      let s = 0;
      let fact = 1;
      for (let k = 0; k <= Math.floor(tw / D); k++) {
        if (k > 0) fact *= k;
        const x = lambda * (k * D - tw);
        s += (x ** k / fact) * Math.exp(-x);
      }
      return (1 - lambda * D) * s;
    };
    for (const [lambda, tw] of [
      [0.7, 1.5],
      [0.5, 0.75],
      [0.8, 3.2],
    ] as const) {
      const p = exactCdf(lambda, 1, tw);
      // The simulated time in system (wait + D) at that quantile ≈ tw + D.
      expect(md1Quantile(lambda, 1, p, 200_000)).toBeCloseTo(tw + 1, 1);
    }
  });

  it("the highest rate meeting a p90 TTFT SLO, and none when the prefill alone misses it", () => {
    const D = 2;
    const r = prefillMaxRate(D, 6);
    expect(r).toBeGreaterThan(0);
    expect(r).toBeLessThan(1 / D);
    expect(md1Quantile(r, D, 0.9)).toBeLessThanOrEqual(6);
    expect(md1Quantile(r * 1.02, D, 0.9)).toBeGreaterThan(6);
    expect(prefillMaxRate(D, 1.9)).toBe(0);
    expect(prefillMaxRate(D, 6, 0.99)).toBeLessThan(r);
  });
});

describe("decode instance and replica plan", () => {
  // Step time at batch B: (100 MB + B · 1000 B/token · ctx) / 10 GB/s, ctx = 1000 + 100/2 = 1050 → 10 ms + B · 0.105 ms.
  const w = { promptTokens: 1000, outputTokens: 100, rate: 30, sloTtftMs: 5000, sloTpotMs: 10.5 };
  it("largest batch within the TPOT SLO, rate by Little's law", () => {
    const d = decodeMaxRate(toy, hw, w, { maxBatch: 64 });
    expect(d.batch).toBe(4); // 10 + 4·0.105 = 10.42 ms ≤ 10.5 < 10.525
    expect(d.limitedBy).toBe("tpot");
    expect(d.tpotS).toBeCloseTo(0.01042, 8);
    expect(d.maxRate).toBeCloseTo(4 / (100 * 0.01042), 8);
    const capped = decodeMaxRate(toy, hw, { ...w, sloTpotMs: 1000 }, { maxBatch: 8 });
    expect(capped).toMatchObject({ batch: 8, limitedBy: "max-batch" });
    const mem = decodeMaxRate(toy, { ...hw, memBytes: 100e6 + 3 * 1.1e6 }, { ...w, sloTpotMs: 1000 }, { maxBatch: 8 });
    expect(mem).toMatchObject({ batch: 3, limitedBy: "memory" });
    // The handoff (second token waits for the KV) counts against TPOT: 99 ms over 99 gaps = +1 ms.
    expect(decodeMaxRate(toy, hw, { ...w, sloTpotMs: 11.5 }, { maxBatch: 64, handoffS: 0.099 }).batch).toBe(4);
    expect(decodeMaxRate(toy, hw, { ...w, sloTpotMs: 9 }, { maxBatch: 64 }).maxRate).toBe(0);
  });

  it("replicas of each phase: ceil(rate / one instance's max rate)", () => {
    const p = replicaPlan(toy, hw, w, { maxBatch: 64 });
    const pRate = prefillMaxRate(prefillSeconds(toy, hw, 1000), 5);
    expect(p.prefillMaxRate).toBeCloseTo(pRate, 12);
    expect(p.prefillReplicas).toBe(Math.ceil(30 / pRate));
    expect(p.decodeReplicas).toBe(Math.ceil(30 / p.decode.maxRate));
    expect(p.ratio).toBe(`${p.prefillReplicas}:${p.decodeReplicas}`);
    expect(p.onePairMaxRate).toBe(Math.min(pRate, p.decode.maxRate));
  });

  it("quantities on the command line", () => {
    expect(parseQuantity("x", "24G")).toBe(24e9);
    expect(parseQuantity("x", "2.5e11")).toBe(2.5e11);
    expect(parseQuantity("x", "512M")).toBe(512e6);
    expect(parseQuantity("x", undefined)).toBeUndefined();
    expect(() => parseQuantity("x", "-1")).toThrow();
    expect(() => parseQuantity("x", "12 GB")).toThrow();
  });
});
