// OmniKV's window selectors (uniform, exp) through the engine: with a window of one query they
// are the softmax selector exactly; with a longer window the prompt tokens still inside it are
// always kept; the prompt's own queries count when this engine ran the prefill, and after a KV
// import only decode queries exist (so the first selections may differ, and still keep budgets).
import { beforeAll, describe, expect, it } from "vitest";
import { Engine, loadModel } from "../../shared/inference/engine/engine.ts";
import type { AttentionPolicy, NativeSequence } from "../../shared/inference/engine/native.ts";
import { resolveModel } from "../../shared/inference/model/resolve.ts";
import { argmax } from "../../tools/lib/logits.ts";

let engine: Engine;
const PROMPT = Array.from({ length: 400 }, (_, i) => 100 + ((i * 7919) % 30000));
const FILTERS = [2, 7, 17];
const omnikv = (selector: "last_softmax" | "uniform" | "exp", window: number, budget = 32): AttentionPolicy => ({
  kind: "omnikv",
  omnikv: { filterLayers: FILTERS, budget, selector, window },
});

beforeAll(async () => {
  engine = new Engine(await loadModel(await resolveModel()), { threads: 1 });
});

async function decode(seq: NativeSequence, first: number, steps: number) {
  const logits: Float32Array[] = [];
  const selections: Int32Array[][] = [];
  let tok = first;
  for (let s = 0; s < steps; s++) {
    const [l] = await engine.decode([seq], [tok]);
    logits.push(l!);
    selections.push(seq.policyStats.selected);
    tok = argmax(l!);
  }
  return { logits, selections };
}

async function run(policy: AttentionPolicy, steps = 8) {
  const seq = engine.createSequence(PROMPT.length + steps + 1);
  seq.setPolicy(policy);
  const first = argmax(await engine.prefill(seq, PROMPT));
  const out = await decode(seq, first, steps);
  seq.release();
  return { first, ...out };
}

describe("window selectors", () => {
  it("with a window of one query equal last_softmax bit for bit", async () => {
    const ref = await run(omnikv("last_softmax", 16));
    for (const sel of ["uniform", "exp"] as const) {
      const got = await run(omnikv(sel, 1));
      expect(got.selections).toEqual(ref.selections);
      got.logits.forEach((l, i) =>
        expect(Buffer.compare(Buffer.from(l.buffer), Buffer.from(ref.logits[i]!.buffer)), `${sel} step ${i}`).toBe(0),
      );
    }
  });

  it("keep the prompt tokens still inside the window, and the budget", async () => {
    const w = 8;
    for (const sel of ["uniform", "exp"] as const) {
      const { selections } = await run(omnikv(sel, w), 3);
      // First step (position 400): prompt positions 393..399 are inside the window; later steps fewer.
      for (const [step, perFilter] of selections.entries()) {
        const forced = Array.from(
          { length: Math.max(0, PROMPT.length - (PROMPT.length + step - (w - 1))) },
          (_, i) => PROMPT.length + step - (w - 1) + i,
        );
        for (const set of perFilter) {
          expect(set.length).toBe(32);
          for (const p of forced) expect(set, `${sel} step ${step} keeps ${p}`).toContain(p);
        }
      }
    }
  });

  it("use the prompt's queries when this engine prefilled it, decode queries only after an import", async () => {
    const policy = omnikv("uniform", 16, 64);
    const local = await run(policy, 1);
    // The same KV imported (rows copied, no queries): only the current query scores the first step.
    const src = engine.createSequence(PROMPT.length + 2);
    await engine.prefill(src, PROMPT);
    const layers = Array.from({ length: 30 }, (_, i) => i);
    const rows = new Uint8Array(PROMPT.length * 30 * 768);
    src.exportRows(rows, layers, 0, PROMPT.length);
    const dst = engine.createSequence(PROMPT.length + 2);
    dst.setPolicy(policy);
    dst.importRows(rows, layers, 0, PROMPT.length);
    dst.setLength(PROMPT.length);
    const imported = await decode(dst, local.first, 1);
    const lastSoftmax = await run(omnikv("last_softmax", 16, 64), 1);
    // Without prompt queries the window holds the current query alone: the softmax ranking, plus
    // the forced tail of the prompt (positions 385..399 take 15 of the 64 places).
    for (const [i, set] of imported.selections[0]!.entries()) {
      expect(set.length).toBe(64);
      for (let p = 385; p < 400; p++) expect(set).toContain(p);
      // The 49 free places go to the softmax ranking's best tokens outside the tail, which are
      // therefore in last_softmax's top 64 (at most 15 of those can be tail tokens).
      const rest = Array.from(set).filter((p) => p < 385);
      expect(rest).toHaveLength(49);
      // Only the first filter layer's input is the same in both runs (later ones see layers that
      // attended different selections).
      if (i > 0) continue;
      const top = new Set(lastSoftmax.selections[0]![i]!);
      for (const p of rest) expect(top.has(p), `position ${p}`).toBe(true);
    }
    expect(local.selections[0]).not.toEqual(imported.selections[0]); // the prompt queries changed the ranking
    src.release();
    dst.release();
  });

  it("refuses a bad window", () => {
    const seq = engine.createSequence(8);
    expect(() => seq.setPolicy(omnikv("uniform", 0))).toThrow(/policy\.omnikv\.window: Too small: expected number to be >=1/);
    expect(() => seq.setPolicy(omnikv("exp", 65))).toThrow(/policy\.omnikv\.window: Too big: expected number to be <=64/);
    seq.release();
  });
});
