// Decode policies through the engine: the sparse paths reduce exactly to full attention when
// their budgets cover everything, keep the budgets they are given, and refuse bad settings.
import { beforeAll, describe, expect, it } from "vitest";

import { Engine, loadModel } from "../../shared/inference/engine/engine.ts";
import type { NativeSequence } from "../../shared/inference/engine/native.ts";
import { resolveModel } from "../../shared/inference/model/resolve.ts";
import { argmax } from "../../tools/lib/logits.ts";

let engine: Engine;
const PROMPT = Array.from({ length: 300 }, (_, i) => 100 + ((i * 7919) % 30000));
const STEPS = 12;
const FILTERS = [2, 8, 18];

beforeAll(async () => {
  engine = new Engine(await loadModel(await resolveModel()), { threads: 1 });
});

async function greedy(policy: Parameters<NativeSequence["setPolicy"]>[0], steps = STEPS) {
  const seq = engine.createSequence(PROMPT.length + steps + 1);
  seq.setPolicy(policy);
  let logits = await engine.prefill(seq, PROMPT);
  const all: Float32Array[] = [];
  for (let s = 0; s < steps; s++) {
    all.push(logits);
    logits = (await engine.decode([seq], [argmax(logits)]))[0]!;
  }
  return { all, stats: seq.policyStats };
}

describe("decode policies", () => {
  it("equal full attention bit for bit when the budget covers everything", async () => {
    const full = await greedy({ kind: "full" });
    const omnikv = await greedy({ kind: "omnikv", omnikv: { filterLayers: FILTERS, budget: 100_000 } });
    const scope = await greedy({ kind: "scope", scope: { beta1: 1000, beta2: 1000, maxOutput: STEPS } });
    const both = await greedy({
      kind: "omnikv+scope",
      omnikv: { filterLayers: FILTERS, budget: PROMPT.length },
      scope: { mode: "adaptive", beta1: 64, beta2: 64, maxOutput: 256 },
    });
    const streaming = await greedy({ kind: "streaming", streaming: { sinks: 4, window: 1000 } });
    const h2o = await greedy({ kind: "h2o", h2o: { budget: 1000, recent: 8 } });
    for (const run of [omnikv, scope, both, streaming, h2o]) expect(run.all).toEqual(full.all);
  });

  it("omnikv keeps `budget` prompt tokens per filter layer and selects every step", async () => {
    const { stats } = await greedy({ kind: "omnikv", omnikv: { filterLayers: FILTERS, budget: 64, lazyIou: 0 } });
    expect(stats.selectedSizes).toEqual([64, 64, 64]);
    expect(stats.selections).toBe(FILTERS.length * STEPS); // one decode step per loop turn
    expect(stats.promptLength).toBe(PROMPT.length);
  });

  it("scope holds each layer and head to beta1 + beta2 generated tokens", async () => {
    const { stats } = await greedy({ kind: "scope", scope: { mode: "slide", beta1: 3, beta2: 2, maxOutput: STEPS } });
    const { nLayer, nHeadKv } = engine.model.config;
    expect(stats.decodeTokens).toBe(STEPS);
    expect(stats.decodePoolTokens).toBe(nLayer * nHeadKv * 5);
  });

  it("h2o holds each layer and head to its budget", async () => {
    const { stats } = await greedy({ kind: "h2o", h2o: { budget: 40, recent: 8 } });
    const { nLayer, nHeadKv } = engine.model.config;
    expect(stats.decodePoolTokens).toBe(nLayer * nHeadKv * 40);
  });

  it("refuses bad settings with clear errors", () => {
    const seq = engine.createSequence(16);
    expect(() => seq.setPolicy({ kind: "omnikv", omnikv: { filterLayers: [30], budget: 8 } })).toThrow(/out of range/);
    expect(() => seq.setPolicy({ kind: "omnikv", omnikv: { filterLayers: [2], budget: 0 } })).toThrow(/budget/);
    expect(() => seq.setPolicy({ kind: "omnikv", omnikv: { filterLayers: [2], budget: 8, selector: "best" as never } })).toThrow(
      /selector/,
    );
    expect(() => seq.setPolicy({ kind: "scope", scope: { beta1: -4, beta2: 8, maxOutput: STEPS } })).toThrow(/policy\.scope\.beta1: .*>=1/);
    expect(() => seq.setPolicy({ kind: "scope", scope: { beta1: 8, beta2: 8, maxOutput: STEPS, mode: "sideways" as never } })).toThrow(
      /mode/,
    );
    expect(() => seq.setPolicy({ kind: "h2o", h2o: { budget: 8, recent: 8 } })).toThrow(/budget larger than recent/);
    expect(() => seq.setPolicy({ kind: "streaming", streaming: { sinks: 4, window: 0 } })).toThrow(/window/);
    expect(() => seq.setPolicy({ kind: "snapkv" } as never)).toThrow(/kind/);
  });
});
