// The engine against an independent oracle: llama.cpp (node-llama-cpp) on the same GGUF, with
// flash attention off and an f32 KV cache. Our cache is f16, so logits cannot match bit for bit;
// the tolerances below are set from the noise floor measured the same way between llama.cpp's
// own f32 and f16 caches (docs/engine.md, "Correctness"). Logit differences are taken between
// centred rows: softmax ignores a shift of the whole row.
import { readFileSync } from "node:fs";
import type { LlamaModel } from "node-llama-cpp";
import { afterAll, beforeAll, describe, expect, it } from "vitest";

import { Engine, loadModel, type LoadedModel } from "../../shared/inference/engine/engine.ts";
import { resolveModel } from "../../shared/inference/model/resolve.ts";
import { argmax, centred, klDivergence, maxAbsDiff, meanAbsDiff, top2Margin } from "../../tools/lib/logits.ts";
import { loadOracle } from "../../tools/lib/llama-oracle.ts";
import { type OracleRun as SharedOracleRun, runOracle as runOracleIds } from "../../tools/lib/oracle-compare.ts";

const STEPS = 64;
// Below this top-1/top-2 gap a greedy choice is a tie within the noise floor: llama.cpp's own
// f32 and f16 caches disagree on such steps.
const TIE_MARGIN = 0.5;
const MAX_ABS_LOGIT_DIFF = 2.0;
const MAX_MEAN_ABS_LOGIT_DIFF = 0.5;
const MAX_KL = 0.02;

const chat = (user: string) =>
  `<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n` +
  `<|im_start|>user\n${user}<|im_end|>\n<|im_start|>assistant\n`;
const license = readFileSync(new URL("../../LICENSE", import.meta.url), "utf8");

const PROMPTS: Record<string, string> = {
  "short chat": chat("Hello!"),
  question: chat("What is the capital of France? Tell me about it."),
  code: chat(
    "Explain what this function does:\n\nfunction fib(n) {\n  if (n < 2) return n;\n  return fib(n - 1) + fib(n - 2);\n}\n\nThen write an iterative version.",
  ),
  "document ~1K": chat(`${license.slice(0, 4500)}\n\nWhat does this text say about trademarks?`),
  "document >2K": chat(`${license}\n\nSummarize the license above in three sentences.`),
};

let modelPath: string;
let ours: LoadedModel;
let engine: Engine;
let oracle: LlamaModel;

beforeAll(async () => {
  modelPath = await resolveModel();
  ours = await loadModel(modelPath);
  engine = new Engine(ours, { threads: 2 });
  oracle = await loadOracle(modelPath);
});

afterAll(async () => {
  await oracle?.dispose();
});

interface OracleRun extends SharedOracleRun {
  ids: number[];
}

async function runOracle(text: string, kvType: "F32" | "F16" = "F32"): Promise<OracleRun> {
  const ids = Array.from(oracle.tokenize(text, true)) as number[];
  return { ids, ...(await runOracleIds(oracle, ids, STEPS, ours.config.nVocab, kvType)) };
}

describe("engine vs llama.cpp (same GGUF, f32-KV oracle)", () => {
  for (const [name, text] of Object.entries(PROMPTS)) {
    it(`${name}: prefill logits, teacher-forced and free-running greedy decode`, async () => {
      const ref = await runOracle(text);
      if (name === "document >2K") expect(ref.ids.length).toBeGreaterThan(2000);

      // 1. Last-token logits after prefill.
      const seq = engine.createSequence(ref.ids.length + STEPS + 16);
      const logits = await engine.prefill(seq, ref.ids);
      // Centred rows (tools/lib/logits.ts): a uniform shift of every logit changes no probability.
      const maxDiff = maxAbsDiff(centred(logits), centred(ref.prefillLogits));
      const meanDiff = meanAbsDiff(centred(logits), centred(ref.prefillLogits));
      const kl = klDivergence(ref.prefillLogits, logits);
      expect(argmax(logits)).toBe(argmax(ref.prefillLogits));
      expect(maxDiff).toBeLessThan(MAX_ABS_LOGIT_DIFF);
      expect(meanDiff).toBeLessThan(MAX_MEAN_ABS_LOGIT_DIFF);
      expect(kl).toBeLessThan(MAX_KL);

      // 2. Teacher-forced: fed llama.cpp's greedy tokens, our top-1 matches at every step that
      //    is not a tie.
      let agree = 0,
        ties = 0,
        worstKl = kl;
      let stepLogits = logits;
      for (let s = 0; s < STEPS; s++) {
        const want = ref.greedy[s]!;
        if (top2Margin(ref.stepLogits[s]!) < TIE_MARGIN) ties++;
        else expect(argmax(stepLogits), `step ${s}`).toBe(want);
        if (argmax(stepLogits) === want) agree++;
        worstKl = Math.max(worstKl, klDivergence(ref.stepLogits[s]!, stepLogits));
        if (s < STEPS - 1) stepLogits = (await engine.decode([seq], [want]))[0]!;
      }
      expect(worstKl).toBeLessThan(MAX_KL * 5);

      // 3. Free-running greedy: identical tokens until the first divergence, which may only
      //    happen at a tie.
      const free = engine.createSequence(ref.ids.length + STEPS + 16);
      let next = argmax(await engine.prefill(free, ref.ids));
      let firstDivergence = STEPS;
      for (let s = 0; s < STEPS; s++) {
        if (next !== ref.greedy[s]) {
          firstDivergence = s;
          expect(top2Margin(ref.stepLogits[s]!), `divergence at step ${s} is not a tie`).toBeLessThan(TIE_MARGIN);
          break;
        }
        if (s < STEPS - 1) next = argmax((await engine.decode([free], [next]))[0]!);
      }
      console.log(
        `[oracle] ${name}: ${ref.ids.length} prompt tokens; prefill max|dlogit| ${maxDiff.toFixed(3)}, ` +
          `mean ${meanDiff.toFixed(4)}, KL ${kl.toExponential(2)}; teacher-forced top-1 ${agree}/${STEPS} ` +
          `(${ties} ties), worst KL ${worstKl.toExponential(2)}; free-running identical for ${firstDivergence}/${STEPS}`,
      );
    });
  }
});

// The tolerances above are not arbitrary: llama.cpp disagrees with itself by as much when only
// its KV cache precision changes. This checks its f16 cache against its f32 cache under the
// same rules, so the rules are no stricter for llama.cpp than for us.
describe("noise floor: llama.cpp f16 KV vs its own f32 KV", () => {
  for (const name of ["question", "document ~1K"]) {
    it(name, async () => {
      const ref = await runOracle(PROMPTS[name]!, "F32");
      const f16 = await runOracle(PROMPTS[name]!, "F16");
      const maxDiff = maxAbsDiff(centred(f16.prefillLogits), centred(ref.prefillLogits));
      expect(argmax(f16.prefillLogits)).toBe(argmax(ref.prefillLogits));
      expect(maxDiff).toBeLessThan(MAX_ABS_LOGIT_DIFF);
      const firstDivergence = f16.greedy.findIndex((t, s) => t !== ref.greedy[s]);
      if (firstDivergence >= 0) expect(top2Margin(ref.stepLogits[firstDivergence]!)).toBeLessThan(TIE_MARGIN);
      console.log(
        `[noise floor] ${name}: llama.cpp f16 vs f32 KV: prefill max|dlogit| ${maxDiff.toFixed(3)}, ` +
          `mean ${meanAbsDiff(centred(f16.prefillLogits), centred(ref.prefillLogits)).toFixed(4)}; free-running identical for ` +
          `${firstDivergence < 0 ? STEPS : firstDivergence}/${STEPS}`,
      );
    });
  }
});
