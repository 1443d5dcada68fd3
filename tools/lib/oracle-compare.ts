// Our engine against llama.cpp (node-llama-cpp, flash attention off, f32 KV cache) on one prompt:
// the prompt's last logits, then teacher-forced and free-running greedy decode. The measurement
// behind test/engine/arch-oracle.test.ts (which asserts on it) and bench/oracle (which records it
// at 1K, 8K and 30K tokens on the real Gemma 3 270M).
// Our cache is f16, llama.cpp's f32, so the logits cannot agree bit for bit. The yardstick is
// llama.cpp's own noise floor on the same model and inputs: its f16 cache against its f32 cache,
// teacher-forced with the same tokens.
import type { ControlledEvaluateInputItem, LlamaModel, Token } from "node-llama-cpp";

import { Engine, loadModel } from "../../shared/inference/engine/engine.ts";
import { loadOracle, logitsArray, oracleContext } from "./llama-oracle.ts";
import { argmax, klDivergence, maxAbsDiff, meanAbsDiff, top2Margin } from "./logits.ts";

export interface OracleRun {
  prefillLogits: Float32Array;
  greedy: number[]; // `steps` tokens: greedy from this run, or the ones it was forced to take
  stepLogits: Float32Array[]; // the logits before each of them
}

/** llama.cpp on `ids`, then `steps` greedy tokens (or the `forced` ones), with the logits before each. */
export async function runOracle(
  oracle: LlamaModel,
  ids: number[],
  steps: number,
  nVocab: number,
  kvType: "F32" | "F16",
  { threads = 1, forced }: { threads?: number; forced?: number[] } = {},
): Promise<OracleRun> {
  const ctx = await oracleContext(oracle, { contextSize: ids.length + steps + 16, kvType, threads });
  try {
    const seq = ctx.getSequence();
    const input = ids.map(
      (id, i): ControlledEvaluateInputItem => (i === ids.length - 1 ? [id as Token, { generateNext: { logits: true } }] : (id as Token)),
    );
    const first = await seq.controlledEvaluate(input);
    const prefillLogits = logitsArray(first[ids.length - 1]!.next!.logits!, nVocab);
    const greedy: number[] = [];
    const stepLogits: Float32Array[] = [prefillLogits];
    let tok = forced?.[0] ?? argmax(prefillLogits);
    for (let s = 0; s < steps; s++) {
      greedy.push(tok);
      if (s === steps - 1) break;
      const out = await seq.controlledEvaluate([[tok as Token, { generateNext: { logits: true } }]]);
      const logits = logitsArray(out[0]!.next!.logits!, nVocab);
      stepLogits.push(logits);
      tok = forced?.[s + 1] ?? argmax(logits);
    }
    return { prefillLogits, greedy, stepLogits };
  } finally {
    await ctx.dispose();
  }
}

// How far another run's logits are from llama.cpp's f32 run's, over the steps compared. The mean
// |Δlogit| and KL are averaged over the steps: on a quantized model one step's values jump with
// each 8-bit activation that a rounding difference flips (one kernel table of ours against
// another doubles the worst step's KL on Gemma 3), their averages do not.
export interface Distance {
  maxAbs: number; // largest |Δlogit| at any step
  meanAbs: number; // mean |Δlogit|, averaged over the steps
  kl: number; // KL(llama.cpp f32 || other), averaged over the steps
  worstKl: number; // the largest KL of a step (reported)
}

function distance(ref: Float32Array[], other: Float32Array[]): Distance {
  const d = { maxAbs: 0, meanAbs: 0, kl: 0, worstKl: 0 };
  ref.forEach((r, s) => {
    const kl = klDivergence(r, other[s]!);
    d.maxAbs = Math.max(d.maxAbs, maxAbsDiff(r, other[s]!));
    d.meanAbs += meanAbsDiff(r, other[s]!) / ref.length;
    d.kl += kl / ref.length;
    d.worstKl = Math.max(d.worstKl, kl);
  });
  return d;
}

export const formatDistance = (d: Distance) =>
  `max|dlogit| ${d.maxAbs.toExponential(2)}, mean ${d.meanAbs.toExponential(2)}, KL ${d.kl.toExponential(2)} ` +
  `(worst step ${d.worstKl.toExponential(2)})`;

export interface OracleComparison {
  promptTokens: number;
  steps: number;
  /** A top-1/top-2 gap of llama.cpp's below it counts as a tie, where noise may flip the greedy choice. */
  tie: number;
  /** The prompt's last logits: ours vs llama.cpp f32, and whether the top-1 agrees. */
  prefill: Distance;
  prefillTop1: boolean;
  /** Teacher-forced with llama.cpp's greedy tokens, over the steps. */
  ours: Distance;
  /** llama.cpp's f16 cache against its f32 cache on the same tokens: the noise floor. */
  floor: Distance;
  top1Agree: number;
  ties: number;
  /** Teacher-forced steps whose top-1 differs where llama.cpp's gap is not a tie (should be none). */
  mismatches: Array<{ step: number; margin: number }>;
  /** Free-running greedy: tokens identical until this step (= steps when never), and llama.cpp's gap there. */
  firstDivergence: number;
  divergenceMargin?: number;
  ms: { ours: number; llamaF32: number; llamaF16: number };
}

/** Ours against llama.cpp on `ids`, our engine on `threads`, llama.cpp on `oracleThreads`. */
export async function compareWithLlama(
  path: string,
  ids: number[],
  steps: number,
  tie: number,
  { threads = 2, oracleThreads = 1 } = {},
): Promise<OracleComparison> {
  const model = await loadModel(path);
  const engine = new Engine(model, { threads });
  const oracle = await loadOracle(path);
  try {
    const nVocab = model.config.nVocab;
    let t0 = performance.now();
    const ref = await runOracle(oracle, ids, steps, nVocab, "F32", { threads: oracleThreads });
    const llamaF32 = performance.now() - t0;
    t0 = performance.now();
    const floor = distance(
      ref.stepLogits,
      (await runOracle(oracle, ids, steps, nVocab, "F16", { threads: oracleThreads, forced: ref.greedy })).stepLogits,
    );
    const llamaF16 = performance.now() - t0;

    t0 = performance.now();
    const seq = engine.createSequence(ids.length + steps + 16);
    const logits = await engine.prefill(seq, ids);
    const prefill = distance([ref.prefillLogits], [logits]);
    let top1Agree = 0,
      ties = 0;
    const mismatches: OracleComparison["mismatches"] = [];
    const got: Float32Array[] = [logits];
    for (let s = 0; s < steps; s++) {
      const want = ref.greedy[s]!;
      const margin = top2Margin(ref.stepLogits[s]!);
      if (margin < tie) ties++;
      if (argmax(got[s]!) === want) top1Agree++;
      else if (margin >= tie) mismatches.push({ step: s, margin });
      if (s < steps - 1) got.push((await engine.decode([seq], [want]))[0]!);
    }
    seq.release();
    const ours = distance(ref.stepLogits, got);

    const free = engine.createSequence(ids.length + steps + 16);
    let next = argmax(await engine.prefill(free, ids));
    let firstDivergence = steps;
    for (let s = 0; s < steps; s++) {
      if (next !== ref.greedy[s]) {
        firstDivergence = s;
        break;
      }
      if (s < steps - 1) next = argmax((await engine.decode([free], [next]))[0]!);
    }
    free.release();
    return {
      promptTokens: ids.length,
      steps,
      tie,
      prefill,
      prefillTop1: argmax(logits) === argmax(ref.prefillLogits),
      ours,
      floor,
      top1Agree,
      ties,
      mismatches,
      firstDivergence,
      divergenceMargin: firstDivergence < steps ? top2Margin(ref.stepLogits[firstDivergence]!) : undefined,
      ms: { ours: performance.now() - t0, llamaF32, llamaF16 },
    };
  } finally {
    await oracle.dispose();
  }
}

/** One log line for a comparison. */
export function describeComparison(name: string, c: OracleComparison): string {
  return (
    `${name}: ${c.promptTokens} prompt tokens; prefill ${formatDistance(c.prefill)}; over ${c.steps} steps ${formatDistance(c.ours)} ` +
    `(llama.cpp f16 vs f32 KV: ${formatDistance(c.floor)}; ratios ${(c.ours.maxAbs / c.floor.maxAbs).toFixed(2)}, ` +
    `${(c.ours.meanAbs / c.floor.meanAbs).toFixed(2)}, ${(c.ours.kl / c.floor.kl).toFixed(2)}); teacher-forced top-1 ` +
    `${c.top1Agree}/${c.steps} (${c.ties} ties below ${c.tie}); free-running identical for ${c.firstDivergence}/${c.steps}`
  );
}
