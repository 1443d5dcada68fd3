// Every architecture against llama.cpp (node-llama-cpp, flash attention off, f32 KV cache), the
// method of test/engine/oracle.test.ts (tools/lib/oracle-compare.ts measures): the prompt's last
// logits, then teacher-forced and free-running greedy decode.
// - Random-weight GGUFs of each architecture's shape (test/harness/arch-models.ts): llama with
//   Llama 3's rope_freqs, qwen2, qwen3, gemma3 (sliding windows by its pattern, both ways of
//   giving it); prompts long enough to slide past every window, in prefill and in decode.
// - The real Gemma 3 270M (Q4_K_M; fetched into the user cache, skipped offline) on a prompt of
//   about 1K tokens (8K and 30K: bench/oracle).
// Our cache is f16, llama.cpp's f32, so the logits cannot agree bit for bit. The bounds come from
// llama.cpp's own noise floor on the same model and inputs, as in oracle.test.ts: its f16 cache
// against its f32 cache, teacher-forced with the same tokens. Ours may differ from llama.cpp's f32
// run by at most FLOOR_FACTOR times what that change of cache precision alone moves.
import { mkdtempSync, readFileSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { afterAll, describe, expect, it } from "vitest";

import { Engine, loadModel } from "../../shared/inference/engine/engine.ts";
import type { AttentionPolicy } from "../../shared/inference/engine/native.ts";
import { PolicyError } from "../../shared/inference/policy/errors.ts";
import { tinyArchModel, TINY_ARCH_VOCAB, type TinyArchOptions } from "../harness/arch-models.ts";
import { gemma3Model } from "../harness/gemma-model.ts";
import { loadOracle } from "../../tools/lib/llama-oracle.ts";
import { argmax, maxAbsDiff } from "../../tools/lib/logits.ts";
import { compareWithLlama, describeComparison } from "../../tools/lib/oracle-compare.ts";

// Measured (the log lines): 0.6-0.9 of the floor on the random models (F32 weights), up to 1.1 on
// Gemma 3's Q4_K_M file, where both engines also quantize activations to 8 bits, in blocks of
// their own sizes, so the cache's noise is not the only one. A wrong switch is off by orders of
// magnitude more (broken on purpose one at a time, each moved arch_test.cc's logits by 5% of
// their scale or more; a sliding window one key too wide fails here by 200x).
const FLOOR_FACTOR = 2;
// A KL summed in double over a vocabulary is itself only good to about 1e-13 (it even comes out
// negative): the random models' KLs are at that level, where ratios mean nothing.
const KL_ROUNDING = 1e-12;

/**
 * Ours against llama.cpp's f32-KV run: the prompt's top-1 equal; teacher-forced, top-1 equal at
 * every step that is not a tie and the largest |Δlogit| of any step, the mean |Δlogit| and KL
 * over the steps within FLOOR_FACTOR of the floor's; free-running, identical tokens until a
 * divergence that may only come at a tie.
 */
async function compare(name: string, path: string, ids: number[], steps: number, tie: number) {
  const c = await compareWithLlama(path, ids, steps, tie);
  expect(c.prefillTop1).toBe(true);
  expect(c.mismatches).toEqual([]);
  expect(c.ours.maxAbs).toBeLessThan(FLOOR_FACTOR * c.floor.maxAbs);
  expect(c.ours.meanAbs).toBeLessThan(FLOOR_FACTOR * c.floor.meanAbs);
  expect(c.ours.kl).toBeLessThan(FLOOR_FACTOR * c.floor.kl + KL_ROUNDING);
  if (c.firstDivergence < steps) expect(c.divergenceMargin!, `divergence at step ${c.firstDivergence} is not a tie`).toBeLessThan(tie);
  console.log(`[arch-oracle] ${describeComparison(name, c)}`);
}

// Pseudo-random prompt ids, past the vocabulary's control tokens.
function promptIds(n: number, seed: number): number[] {
  return Array.from({ length: n }, (_, i) => 6 + ((i * 7919 + seed * 104729 + 17) % (TINY_ARCH_VOCAB - 6)));
}

// Ties: a gap that the allowed error could close. On the random models every logit may move by
// at most 2 x a floor measured at 4.4e-3 or less, so a gap moves by less than 0.02; the real
// model's is oracle.test.ts's margin for SmolLM2, where llama.cpp's own f16 and f32 caches
// disagree on the greedy token (most of Gemma 3's floor lies in the tail of its 262K logits).
const RANDOM_TIE = 0.05;
const GEMMA_TIE = 0.5;

const dir = mkdtempSync(join(tmpdir(), "ctxbank-arch-oracle-"));
afterAll(() => rmSync(dir, { recursive: true, force: true }));

// A small RoPE base, so that every pair turns noticeably within the prompt.
const CASES: { name: string; model: TinyArchOptions }[] = [
  {
    name: "llama: Llama 3 rope_freqs, linear scaling, untied head",
    model: { arch: "llama", ropeBase: 500, ropeFreqs: true, ropeLinearFactor: 2, tiedOutput: false },
  },
  { name: "qwen2: Q/K/V biases, NEOX pairs", model: { arch: "qwen2", ropeBase: 500 } },
  { name: "qwen3: per-head Q/K norm, 128-wide queries on a 64-wide model", model: { arch: "qwen3", ropeBase: 500, headDim: 32 } },
  {
    name: "gemma3: sliding window 24 on layers 0-4 (default pattern), global layer 5, one KV head",
    model: { arch: "gemma3", ropeBase: 500, nHeadKv: 1, headDim: 32, nLayer: 6, slidingWindow: 24 },
  },
  {
    name: "gemma3: window 12 every other layer (pattern as a period), local base 50, soft-cap 3",
    model: {
      arch: "gemma3",
      ropeBase: 500,
      nHeadKv: 1,
      headDim: 32,
      nLayer: 4,
      slidingWindow: 12,
      swaPeriod: 2,
      ropeBaseSwa: 50,
      softcap: 3,
      tiedOutput: false,
    },
  },
];

describe("architectures vs llama.cpp: random-weight GGUFs of each shape", () => {
  CASES.forEach(({ name, model }, i) => {
    it(name, async () => {
      const path = join(dir, `${model.arch}-${i}.gguf`);
      writeFileSync(path, tinyArchModel({ ...model, seed: 100 + i }));
      await compare(name, path, promptIds(100, i), 32, RANDOM_TIE);
    });
  });
});

// On a model with sliding-window layers the sparse policies act on the global layers (a sliding
// layer attends its window whatever the policy): with budgets that hold every token they give full
// attention's greedy tokens; a filter layer that slides and Round Attention are refused as
// policies the model cannot run (the services answer 400 invalid_policy).
describe("decode policies on a model with sliding-window layers", () => {
  it("run on the global layers; a sliding filter layer and rounds are refused with PolicyError", async () => {
    const path = join(dir, "gemma3-policies.gguf");
    writeFileSync(path, tinyArchModel(CASES[3]!.model)); // layers 0-4 slide (window 24), 5 is global
    const engine = new Engine(await loadModel(path), { threads: 1 });
    const ids = promptIds(80, 3);
    const greedy = async (policy: AttentionPolicy) => {
      const seq = engine.createSequence(128);
      try {
        engine.applyPolicy(seq, policy);
        const tokens = [argmax(await engine.prefill(seq, ids))];
        for (let i = 0; i < 12; i++) tokens.push(argmax((await engine.decode([seq], [tokens.at(-1)!]))[0]!));
        return { tokens, stats: seq.policyStats };
      } finally {
        seq.release();
      }
    };
    const full = await greedy({ kind: "full" });
    const whole: AttentionPolicy[] = [
      { kind: "omnikv", omnikv: { filterLayers: [5], budget: 128 } },
      { kind: "scope", scope: { beta1: 64, beta2: 64, maxOutput: 16 } },
      { kind: "streaming", streaming: { sinks: 4, window: 128 } },
      { kind: "h2o", h2o: { budget: 128, recent: 16 } },
    ];
    for (const policy of whole) {
      const got = await greedy(policy);
      expect(got.tokens, policy.kind).toEqual(full.tokens);
      expect(got.stats.decodeKvBytesRead, policy.kind).toBe(full.stats.decodeKvBytesRead);
    }
    // A small window on the global layer: each of the 12 decode steps reads the 5 sliding layers'
    // 24 keys and the global layer's 4 sinks + 12 recent keys, K and V of one 32-wide head.
    const small = await greedy({ kind: "streaming", streaming: { sinks: 4, window: 12 } });
    const rowPair = 2 * 32 * 2;
    expect(small.stats.decodeKvBytesRead).toBe(12 * (5 * 24 + 16) * rowPair);

    const seq = engine.createSequence(64);
    const refused: Array<[AttentionPolicy, string]> = [
      [{ kind: "omnikv", omnikv: { filterLayers: [1], budget: 16 } }, "filter layer 1 is a sliding-window layer"],
      [{ kind: "rounds", rounds: { watershedLayer: 4, starts: [0, 8], topK: 1 } }, "sliding-window layers"],
    ];
    for (const [policy, needle] of refused) {
      let error: unknown;
      try {
        engine.applyPolicy(seq, policy);
      } catch (e) {
        error = e;
      }
      expect(error, policy.kind).toBeInstanceOf(PolicyError);
      expect((error as PolicyError).code).toBe("invalid_policy");
      expect((error as Error).message).toContain(needle);
    }
    seq.release();
  });
});

describe("the real Gemma 3 270M's sliding-window rings", () => {
  it("a 3K-token prompt and 16 greedy steps: rings of 1,024 rows give the logits of whole caches", async (ctx) => {
    const got = await gemma3Model();
    if ("skip" in got) return ctx.skip(got.skip);
    const model = await loadModel(got.path);
    const license = readFileSync(new URL("../../LICENSE", import.meta.url), "utf8");
    const ids = Array.from({ length: 3000 }, (_, i) => 2 + ((license.charCodeAt(i % license.length) * 131 + i) % 20000));
    // 512-token micro-batches: rings of 1,024 rows; 4,096: rings larger than the sequence, so none.
    const ringed = new Engine(model, { threads: 2, ubatch: 512 });
    const whole = new Engine(model, { threads: 2, ubatch: 4096 });
    const run = async (engine: Engine) => {
      const seq = engine.createSequence(ids.length + 16);
      const logits = [await engine.prefill(seq, ids)];
      for (let i = 0; i < 16; i++) logits.push((await engine.decode([seq], [argmax(logits.at(-1)!)]))[0]!);
      const ring = seq.deviceBytesUsed;
      seq.release();
      return { logits, ring };
    };
    const a = await run(ringed);
    const b = await run(whole);
    for (let i = 0; i < a.logits.length; i++) expect(maxAbsDiff(a.logits[i]!, b.logits[i]!), `step ${i}`).toBe(0);
    const rowPair = 2 * 256 * 2;
    expect(a.ring).toBe((3 * 3016 + 15 * 1024) * rowPair);
    expect(b.ring).toBe(18 * 3016 * rowPair);
  });
});

describe("the real Gemma 3 270M vs llama.cpp", () => {
  it("a ~1K-token prompt: prefill, teacher-forced and free-running greedy decode", async (ctx) => {
    const got = await gemma3Model();
    if ("skip" in got) return ctx.skip(got.skip);
    const oracle = await loadOracle(got.path);
    const license = readFileSync(new URL("../../LICENSE", import.meta.url), "utf8");
    // Gemma needs its BOS (tokenize() adds none): without it the model runs off its trained inputs.
    const ids = [oracle.tokens.bos!, ...oracle.tokenize(license.slice(0, 4400), true)] as number[];
    await oracle.dispose();
    expect(ids.length).toBeGreaterThan(900);
    await compare("Gemma 3 270M", got.path, ids, 64, GEMMA_TIE);
  });
});
