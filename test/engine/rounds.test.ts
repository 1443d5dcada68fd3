// Round Attention through the engine: the watershed layer picks whole earlier rounds once (round 0,
// a chat's system part, always), where the prompt ends or at the first decode step; the layers
// above attend to those and the current round only. Keeping every round is full attention bit for
// bit; a single round is dense; choices are whole rounds.
import { beforeAll, describe, expect, it } from "vitest";
import { Engine, loadModel } from "../../shared/inference/engine/engine.ts";
import type { AttentionPolicy } from "../../shared/inference/engine/native.ts";
import { resolveModel } from "../../shared/inference/model/resolve.ts";
import { argmax } from "../../tools/lib/logits.ts";

let engine: Engine;
const PROMPT = Array.from({ length: 360 }, (_, i) => 100 + ((i * 7919) % 30000));
const STARTS = [0, 80, 150, 230, 300]; // four earlier rounds, the current one from 300
const rounds = (topK: number, starts = STARTS): AttentionPolicy => ({ kind: "rounds", rounds: { watershedLayer: 12, starts, topK } });

beforeAll(async () => {
  engine = new Engine(await loadModel(await resolveModel()), { threads: 1 });
});

async function run(policy: AttentionPolicy, steps = 6) {
  const seq = engine.createSequence(PROMPT.length + steps + 1);
  seq.setPolicy(policy);
  let tok = argmax(await engine.prefill(seq, PROMPT));
  const logits: Float32Array[] = [];
  const selected: Int32Array[] = [];
  for (let s = 0; s < steps; s++) {
    const [l] = await engine.decode([seq], [tok]);
    logits.push(l!);
    selected.push(seq.policyStats.selected[0] ?? new Int32Array());
    tok = argmax(l!);
  }
  seq.release();
  return { logits, selected };
}
const same = (a: Float32Array[], b: Float32Array[]) =>
  a.every((x, i) => Buffer.compare(Buffer.from(x.buffer), Buffer.from(b[i]!.buffer)) === 0);
const rangesOf = (sel: Int32Array) =>
  STARTS.slice(0, -1)
    .map((s, r) => [s, STARTS[r + 1]!])
    .filter(([s, e]) => sel.includes(s!) || sel.includes(e! - 1));

describe("rounds", () => {
  it("keeping every earlier round, or having none, is full attention bit for bit", async () => {
    const full = await run({ kind: "full" });
    expect(same((await run(rounds(3))).logits, full.logits)).toBe(true); // round 0 and the three others
    expect(same((await run(rounds(1, [0]))).logits, full.logits)).toBe(true);
  });

  it("chooses whole rounds, once, and the layers above the watershed see only them", async () => {
    const full = await run({ kind: "full" });
    for (const k of [1, 2]) {
      const { logits, selected } = await run(rounds(k));
      const chosen = rangesOf(selected[0]!);
      expect(chosen).toHaveLength(1 + k); // round 0, then k of the three others
      expect(chosen[0]).toEqual([0, 80]);
      expect(Array.from(selected[0]!)).toEqual(chosen.flatMap(([s, e]) => Array.from({ length: e! - s! }, (_, i) => s! + i)));
      for (const sel of selected) expect(sel).toEqual(selected[0]); // fixed for the whole answer
      expect(same(logits, full.logits)).toBe(false);
    }
  });

  it("adaptive keeps round 0 and the rounds above mean + std (whole rounds, at most all but one)", async () => {
    const { selected } = await run(rounds(0));
    const chosen = rangesOf(selected[0]!);
    expect(chosen[0]).toEqual([0, 80]);
    expect(chosen.length).toBeLessThan(4); // round 0 and at most two of the three others
    expect(selected[0]!.length).toBe(chosen.reduce((n, [s, e]) => n + e! - s!, 0));
  });

  it("the pick made where the prompt ends is the decode's, and a pick given to another sequence is what it attends", async () => {
    for (const k of [0, 1, 2]) {
      // The prefill's side: the prompt computed, the rounds picked before any decode step.
      const prefill = engine.createSequence(PROMPT.length + 1);
      prefill.setPolicy(rounds(k));
      await engine.prefill(prefill, PROMPT);
      const picked = await engine.pickRounds(prefill);
      prefill.release();
      const own = await run(rounds(k));
      expect(rangesOf(own.selected[0]!).map(([s]) => STARTS.indexOf(s!))).toEqual(picked);
    }
    // Given a pick (as a decode whose KV came from a prefill is), a sequence attends those rounds
    // whatever its own scores say; a new prompt drops it.
    const seq = engine.createSequence(PROMPT.length + 4);
    seq.setPolicy(rounds(1));
    const first = argmax(await engine.prefill(seq, PROMPT));
    const own = await engine.pickRounds(seq);
    const other = [[0, 1, 2, 3].find((r) => !own.includes(r))!];
    seq.setRoundPick(other);
    await engine.decode([seq], [first]);
    expect(rangesOf(seq.policyStats.selected[0]!).map(([s]) => STARTS.indexOf(s!))).toEqual(other);
    seq.release();
  });

  it("refuses a pick that is not ascending earlier rounds, or on another policy", async () => {
    const seq = engine.createSequence(PROMPT.length);
    seq.setPolicy(rounds(1));
    await engine.prefill(seq, PROMPT);
    expect(() => seq.setRoundPick([4])).toThrow(/ascending indices of the 4 rounds before the current one/);
    expect(() => seq.setRoundPick([2, 1])).toThrow(/ascending/);
    expect(() => seq.setRoundPick([-1])).toThrow(/non-negative integers/);
    seq.setRoundPick([]); // none: only the current round above the watershed
    seq.setPolicy({ kind: "full" });
    expect(() => seq.setRoundPick([0])).toThrow(/not rounds/);
    expect(() => engine.pickRounds(seq)).toThrow(/not rounds/);
    seq.release();
  });

  it("refuses bad rounds", () => {
    const seq = engine.createSequence(8);
    expect(() => seq.setPolicy({ kind: "rounds", rounds: { watershedLayer: 29, starts: [0] } })).toThrow(/watershed layer 29/);
    expect(() => seq.setPolicy({ kind: "rounds", rounds: { watershedLayer: 5, starts: [3, 9] } })).toThrow(/begin with 0/);
    expect(() => seq.setPolicy({ kind: "rounds", rounds: { watershedLayer: 5, starts: [0, 9, 9] } })).toThrow(/strictly increasing/);
    expect(() => seq.setPolicy({ kind: "rounds", rounds: { watershedLayer: 5, starts: "0" as unknown as number[] } })).toThrow(
      /policy\.rounds\.starts: .*expected array/,
    );
    seq.release();
  });
});
