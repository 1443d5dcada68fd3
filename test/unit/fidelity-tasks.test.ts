// Task generators and metrics of bench/fidelity (pure functions; a fake word-count tokenizer).
import { describe, expect, it } from "vitest";

import { firstDivergence, klDivergence, logSoftmax, tokenAgreement } from "../../bench/fidelity/metrics.ts";
import { fidelityPolicies } from "../../bench/fidelity/policies.ts";
import {
  COLOURS,
  PASSKEY_FILLER,
  firstColour,
  longGenTask,
  multikeyTask,
  numberedNeedle,
  passkeyNeedle,
  passkeyTask,
  scoreLongGen,
  scorePasskey,
  scoreTwoStage,
  twoStageDict,
  twoStageTask,
} from "../../bench/fidelity/tasks.ts";
import { seededRng } from "../../tools/lib/random.ts";

/** Fake tokenizer: one token per whitespace-separated word, plus 10 for the "template". */
const measure = (s: string) => 10 + s.split(/\s+/).filter(Boolean).length;

describe("seeded RNG", () => {
  it("is deterministic per seed and in [0, 1)", () => {
    const a = seededRng(42),
      b = seededRng(42),
      c = seededRng(43);
    const xs = Array.from({ length: 100 }, () => a());
    expect(Array.from({ length: 100 }, () => b())).toEqual(xs);
    expect(c()).not.toBe(xs[0]);
    for (const x of xs) expect(x >= 0 && x < 1).toBe(true);
  });
});

describe("passkey", () => {
  it("uses the InfiniteBench text, a 5-digit key, and fits the token target tightly", () => {
    const t = passkeyTask({ targetTokens: 600, depth: 0.5, seed: 7, measure });
    expect(t.answer).toMatch(/^\d{5}$/);
    expect(
      t.user.startsWith(
        "There is an important info hidden inside a lot of irrelevant text. Find it and memorize them. I will quiz you about the important information there.\n\n",
      ),
    ).toBe(true);
    expect(t.user.endsWith("\n\nWhat is the pass key?")).toBe(true);
    expect(t.user).toContain(`The pass key is ${t.answer}. Remember it. ${t.answer} is the pass key.\n`);
    expect(t.tokens).toBeLessThanOrEqual(600);
    // One more filler line would not fit.
    expect(t.tokens + measure(PASSKEY_FILLER) - 10).toBeGreaterThan(600);
    expect(passkeyTask({ targetTokens: 600, depth: 0.5, seed: 7, measure })).toEqual(t);
    expect(passkeyTask({ targetTokens: 600, depth: 0.5, seed: 8, measure }).answer).not.toBe(t.answer);
  });

  it("places the needle at the requested depth", () => {
    const at = (depth: number) => {
      const t = passkeyTask({ targetTokens: 400, depth, seed: 1, measure });
      const body = t.user.split("\n\n")[1]!;
      const lines = body.split("\n").filter(Boolean);
      return { idx: lines.findIndex((l) => l.startsWith("The pass key is")), n: lines.length };
    };
    expect(at(0).idx).toBe(0);
    const end = at(1);
    expect(end.idx).toBe(end.n - 1);
    const mid = at(0.5);
    expect(Math.abs(mid.idx - (mid.n - 1) / 2)).toBeLessThanOrEqual(1);
  });

  it("scores by containment", () => {
    expect(scorePasskey(" 12345. Remember it.", "12345")).toBe(1);
    expect(scorePasskey(" 12346.", "12345")).toBe(0);
    expect(passkeyNeedle("1")).toBe("The pass key is 1. Remember it. 1 is the pass key.\n");
  });

  it("refuses a target smaller than the bare prompt", () => {
    expect(() => passkeyTask({ targetTokens: 20, depth: 0, seed: 1, measure })).toThrow(/target/);
  });
});

describe("multikey", () => {
  it("spreads numbered needles evenly, asks for one of them and fits the token target", () => {
    const t = multikeyTask({ targetTokens: 900, needles: 3, seed: 11, measure });
    const keys = t.meta.keys as number[];
    const ask = t.meta.ask as number;
    expect(keys).toHaveLength(3);
    expect(new Set(keys).size).toBe(3);
    expect(ask >= 1 && ask <= 3).toBe(true);
    expect(t.answer).toBe(String(keys[ask - 1]));
    expect(t.answerPrefix).toBe(`The pass key number ${ask} is`);
    expect(t.user.endsWith(`\n\nWhat is pass key number ${ask}?`)).toBe(true);
    expect(t.tokens).toBeLessThanOrEqual(900);
    const lines = t.user.split("\n\n")[1]!.split("\n").filter(Boolean);
    const at = keys.map((k, i) => lines.indexOf(numberedNeedle(i + 1, String(k)).trimEnd()));
    const n = lines.length - 3; // filler lines
    at.forEach((idx, i) => expect(Math.abs(idx - i - ((i + 0.5) / 3) * n)).toBeLessThanOrEqual(1));
    expect(multikeyTask({ targetTokens: 900, needles: 3, seed: 11, measure })).toEqual(t);
  });
});

describe("2StageRetr", () => {
  it("builds a dict whose key is a + b, with distinct keys and the task's colours", () => {
    for (const seed of [1, 2, 3]) {
      const d = twoStageDict(50, seed);
      expect(d.entries).toHaveLength(50);
      expect(new Set(d.entries.map(([k]) => k)).size).toBe(50);
      expect(d.a + d.b).toBe(d.key);
      expect(d.a).toBeGreaterThan(0);
      expect(d.b).toBeGreaterThan(0);
      expect(d.entries.find(([k]) => k === d.key)?.[1]).toBe(d.colour);
      for (const [, c] of d.entries) expect(COLOURS).toContain(c);
    }
  });

  it("sizes the prompt to the target and asks for the sum", () => {
    const t = twoStageTask({ targetTokens: 500, seed: 5, measure });
    expect(t.tokens).toBeLessThanOrEqual(500);
    expect(t.tokens).toBeGreaterThan(450);
    const a = t.meta.a as number,
      b = t.meta.b as number;
    expect(t.user).toContain(`Question: ${a} + ${b} = ?`);
    expect(t.user).toContain(`\n${t.meta.key}: ${t.answer}\n`);
    expect(t.answerPrefix).toBe(`${a} + ${b} =`);
  });

  it("scores by the colour word appearing; firstColour finds the first one", () => {
    expect(scoreTwoStage(" 93, and 93 is Navy.", "navy")).toBe(1);
    expect(scoreTwoStage(" 93, and 93 is navyblue.", "navy")).toBe(0);
    expect(firstColour("it is red, not blue")).toBe("red");
    expect(firstColour("no colour")).toBeUndefined();
  });
});

describe("long generation", () => {
  it("asks K numbered questions after worked examples", () => {
    const t = longGenTask({ questions: 5, seed: 3, measure });
    expect(t.questions).toHaveLength(5);
    for (let i = 1; i <= 5; i++) expect(t.user).toContain(`Question ${i}: `);
    expect(t.user).toContain("The answer is 14.");
    expect(t.answer.split(",").map(Number)).toEqual(t.questions.map((q) => q.answer));
    for (const q of t.questions) expect(q.answer).toBeGreaterThan(0);
  });

  it("scores answers in order", () => {
    const out = "Answer 1: ... The answer is 3.\nAnswer 2: The answer is 9.\nAnswer 3: The answer is 7.";
    expect(scoreLongGen(out, [3, 8, 7, 1])).toEqual({ score: 0.5, answered: 3 });
  });
});

describe("metrics", () => {
  it("agreement and first divergence", () => {
    expect(tokenAgreement([1, 2, 3, 4], [1, 2, 9, 4])).toBe(0.75);
    expect(firstDivergence([1, 2, 3, 4], [1, 2, 9, 4])).toBe(2);
    expect(firstDivergence([1, 2], [1, 2])).toBeNull();
    expect(tokenAgreement([1, 2], [1])).toBe(0.5);
  });

  it("KL over the softmax of logits", () => {
    const p = logSoftmax([1, 2, 3]);
    expect(klDivergence(p, p)).toBeCloseTo(0, 9);
    const q = logSoftmax([0, 0, 0]);
    const pp = Array.from(p, Math.exp);
    const want = pp.reduce((s, x) => s + x * Math.log(x / (1 / 3)), 0);
    expect(klDivergence(p, q)).toBeCloseTo(want, 5);
    expect(pp.reduce((a, b) => a + b, 0)).toBeCloseTo(1, 6);
  });
});

describe("policies", () => {
  it("covers the grid with the issue's settings", () => {
    const ps = fidelityPolicies([3, 17, 23]);
    expect(ps.map((p) => p.id)).toEqual([
      "full",
      "omnikv k=256",
      "omnikv k=1024",
      "streaming k=256",
      "streaming k=1024",
      "h2o k=256",
      "h2o k=1024",
      "scope 256+256",
      "omnikv k=1024+scope 256+256",
    ]);
    expect(ps.find((p) => p.id === "streaming k=256")!.policy).toEqual({ kind: "streaming", streaming: { sinks: 4, window: 252 } });
    expect(ps.find((p) => p.id === "h2o k=1024")!.policy).toEqual({ kind: "h2o", h2o: { budget: 1024, recent: 256 } });
    expect(ps.find((p) => p.id === "omnikv k=256")!.policy).toEqual({ kind: "omnikv", omnikv: { filterLayers: [3, 17, 23], budget: 256 } });
    const unguarded = fidelityPolicies([5], [512], false);
    expect(unguarded.find((p) => p.id === "omnikv k=512")!.policy).toEqual({
      kind: "omnikv",
      omnikv: { filterLayers: [5], budget: 512, guard: false },
    });
  });
});
