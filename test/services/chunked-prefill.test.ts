// Chunked prefill in the decode scheduler: a prompt computed while sequences decode rides in their
// steps in chunks sized to the decodes' pace (step-plan.ts). The decodes get the tokens they get
// alone, the prompt gets the logits it gets alone, and every step they share carries a chunk of
// the size the plan allows.
import pino from "pino";
import { beforeAll, describe, expect, it } from "vitest";
import { Engine, loadModel } from "../../shared/inference/engine/engine.ts";
import type { ForwardItem, NativeSequence } from "../../shared/inference/engine/native.ts";
import { Sampler } from "../../shared/inference/engine/sampler.ts";
import { resolveModel } from "../../shared/inference/model/resolve.ts";
import { GgufTokenizer } from "../../shared/inference/tokenizer/tokenizer.ts";
import { DecodeScheduler, type SchedulerOptions } from "../../services/decode/scheduler.ts";
import { Slot } from "../../services/decode/slot.ts";
import { prefillChunkTokens, StepCosts } from "../../services/decode/step-plan.ts";
import { TokenTextStream } from "../../shared/inference/text-stream.ts";
import { argmax } from "../../tools/lib/logits.ts";

const prompt = (n: number, salt: number) => Array.from({ length: n }, (_, i) => 100 + ((i * 7919 + salt * 104729) % 30000));

describe("step plan", () => {
  it("learns a decode step's cost and a prompt token's marginal cost", () => {
    const costs = new StepCosts(1); // weight 1: the latest sample
    costs.observe(0, 512, 1024); // a prefill-only step: 2 ms per token
    expect(costs.prefillMsPerToken).toBe(2);
    costs.observe(3, 0, 30);
    expect(costs.decodeMs).toBe(30);
    costs.observe(3, 50, 130); // 30 ms of decode, 100 ms for 50 tokens
    expect(costs.prefillMsPerToken).toBe(2);
    const avg = new StepCosts(0.5);
    avg.observe(1, 0, 10);
    avg.observe(1, 0, 20);
    expect(avg.decodeMs).toBe(15);
  });

  it("sizes a chunk to the most urgent decode's slack, within [minChunk, maxTokens]", () => {
    const costs = new StepCosts(1);
    costs.observe(2, 0, 20);
    costs.observe(0, 100, 200); // 2 ms per token
    const plan = (slackMs: number[], maxTokens = 510) => prefillChunkTokens({ slackMs, costs, maxTokens, minChunk: 16 });
    expect(plan([])).toBe(510); // no decodes: a whole micro-batch
    expect(plan([120, 500])).toBe(50); // (120 - 20) / 2
    expect(plan([121])).toBe(50); // whole tokens, rounded down
    expect(plan([-40])).toBe(16); // late: still the minimum, so the prompt progresses
    expect(plan([60])).toBe(20);
    expect(plan([1e6])).toBe(510);
    expect(plan([1e6], 8)).toBe(8);
    expect(prefillChunkTokens({ slackMs: [1e6], costs: new StepCosts(), maxTokens: 510, minChunk: 16 })).toBe(16); // nothing measured yet
  });
});

describe("the scheduler's mixed steps", () => {
  let engine: Engine;
  let tokenizer: GgufTokenizer;
  const log = pino({ level: "silent" });

  beforeAll(async () => {
    const path = await resolveModel();
    engine = new Engine(await loadModel(path), { threads: 1, ubatch: 128 });
    tokenizer = GgufTokenizer.fromGguf(path);
  });

  /** Greedy tokens of `ids` decoded alone (prefill, then one step per token). */
  async function alone(ids: number[], steps: number): Promise<number[]> {
    const seq = engine.createSequence(ids.length + steps + 1);
    try {
      let logits = await engine.prefill(seq, ids);
      const out = [argmax(logits)];
      while (out.length < steps) {
        logits = (await engine.decode([seq], [out.at(-1)!]))[0]!;
        out.push(argmax(logits));
      }
      return out;
    } finally {
      seq.release();
    }
  }

  /** The logits of `ids` prefilled alone. */
  async function reference(ids: number[]): Promise<Float32Array> {
    const seq = engine.createSequence(ids.length);
    try {
      return await engine.prefill(seq, ids);
    } finally {
      seq.release();
    }
  }

  function expectSameLogits(got: Float32Array, want: Float32Array) {
    expect(argmax(got)).toBe(argmax(want));
    for (let i = 0; i < want.length; i += 997) expect(got[i]).toBeCloseTo(want[i]!, 3);
  }

  /**
   * Prefills `ids` (outside the scheduler) and starts decoding it greedily in the scheduler;
   * resolves once it is in the batch, with the promise of all its tokens.
   */
  async function decodeIn(
    sched: DecodeScheduler,
    ids: number[],
    steps: number,
    o: { onToken?: (count: number) => void; feedToken?: number } = {},
  ): Promise<{ tokens: Promise<number[]> }> {
    const seq = engine.createSequence(ids.length + steps + 1);
    const first = argmax(await engine.prefill(seq, ids));
    const text = new TokenTextStream({ createDetokenizer: () => tokenizer.createDetokenizer(), isEog: () => false }, steps, []);
    text.push(first);
    // `feedToken` replaces the token the first step is fed (a bad id makes that step fail).
    const slot = new Slot(seq, o.feedToken ?? first, new Sampler({ temperature: 0 }), text);
    sched.adopt(seq);
    sched.start(slot);
    const tokens = [first];
    const all = (async () => {
      const signal = new AbortController().signal;
      for (;;) {
        const ev = await slot.next(signal);
        if (ev.type === "done") return tokens;
        if (ev.type === "error") throw ev.error;
        tokens.push(ev.id);
        o.onToken?.(tokens.length);
      }
    })();
    return { tokens: all };
  }

  /**
   * The engine as a scheduler sees it, with every forward pass recorded: the tokens each sequence
   * carried, and whether the engine refused the pass.
   */
  /** The engine with every forward pass recorded: which sequences it carried, and whether it went through. */
  function recordingEngine() {
    const steps: { tokens: Map<NativeSequence, number>; ok: boolean }[] = [];
    const forward = async (items: ForwardItem[]) => {
      const tokens = new Map(items.map((item) => [item.seq, item.tokens.length]));
      try {
        await engine.forward(items);
        steps.push({ tokens, ok: true });
      } catch (error) {
        steps.push({ tokens, ok: false });
        throw error;
      }
    };
    return {
      steps,
      engine: new Proxy(engine, {
        get: (target, key) => {
          if (key === "forward") return forward;
          const value: unknown = Reflect.get(target, key, target);
          return typeof value === "function" ? value.bind(target) : value;
        },
      }),
    };
  }

  const options = (o: Partial<SchedulerOptions>): SchedulerOptions => ({
    maxBatch: 4,
    maxQueue: 4,
    kvBudgetBytes: 1 << 30,
    tpotTargetMs: 100,
    ...o,
  });

  it("a late decode makes every shared step carry the minimum chunk; both get what they get alone", async () => {
    const [a, b] = [prompt(40, 1), prompt(700, 2)];
    const steps = 24;
    const [expectA, refB] = [await alone(a, steps), await reference(b)];
    // A pace of 0 ms per token: the decode is always late, so a shared step carries 16 tokens.
    const sched = new DecodeScheduler(engine, options({ tpotTargetMs: 0, minPrefillChunk: 16 }), log);
    const decodeA = await decodeIn(sched, a, steps); // its first step is already running, alone
    const seqB = engine.createSequence(b.length);
    const [tokensA, logitsB] = await Promise.all([decodeA.tokens, sched.prefill(seqB, b)]);
    expect(tokensA).toEqual(expectA);
    expectSameLogits(logitsB, refB);
    const st = sched.status();
    // A's steps 2..23 carried 16 of B's tokens each (700 outlast 22 × 16); the other 348 ran after
    // A finished, in micro-batches of up to 128.
    expect(st.mixed_steps).toBe(steps - 2);
    expect(st.prefill_tokens).toBe(700);
    expect(st.steps).toBe(steps - 1 + Math.ceil((700 - (steps - 2) * 16) / 128));
    expect(seqB.nPast).toBe(700);
    seqB.release();
    expect(st).toMatchObject({ running: 0, prefills: 0 });
  });

  it("a decode with time to spare lets the prompt take whole micro-batches", async () => {
    const [a, b] = [prompt(30, 3), prompt(600, 4)];
    const [expectA, refB] = [await alone(a, 8), await reference(b)];
    const sched = new DecodeScheduler(engine, options({ tpotTargetMs: 1e6 }), log);
    const decodeA = await decodeIn(sched, a, 8);
    const seqB = engine.createSequence(b.length);
    const logitsB = await sched.prefill(seqB, b);
    expect(await decodeA.tokens).toEqual(expectA);
    expectSameLogits(logitsB, refB);
    // A's first step ran alone (a decode step's cost measured); the first shared step knows no
    // prompt cost yet and carries the minimum, 16; from then on A's slack covers a whole
    // micro-batch less its own token: 127. 16 + 5 × 127 >= 600, all within A's 7 steps.
    expect(sched.status()).toMatchObject({ steps: 7, mixed_steps: 6, prefill_tokens: 600 });
    seqB.release();
  });

  it("several prompts share a step when there is room", async () => {
    const [b, c] = [prompt(100, 8), prompt(60, 9)];
    const [refB, refC] = [await reference(b), await reference(c)];
    const sched = new DecodeScheduler(engine, options({}), log);
    const [seqB, seqC] = [engine.createSequence(100), engine.createSequence(60)];
    const [logitsB, logitsC] = await Promise.all([sched.prefill(seqB, b), sched.prefill(seqC, c)]);
    expectSameLogits(logitsB, refB);
    expectSameLogits(logitsC, refC);
    expect(sched.status()).toMatchObject({ steps: 2, prefill_tokens: 160, mixed_steps: 0 }); // 100 + 28, then 32
    expect(() => sched.prefill(seqB, [1])).toThrow(/exceed the context limit/);
    seqB.release();
    seqC.release();
  });

  it("an aborted prompt leaves the steps it shares at once, and the decode goes on", async () => {
    const sched = new DecodeScheduler(engine, options({ tpotTargetMs: 0, minPrefillChunk: 16 }), log);
    const a = prompt(20, 5);
    const expectA = await alone(a, 16);
    const seqB = engine.createSequence(2000);
    const ac = new AbortController();
    // Abort when A has its 5th token: A's steps 2-4 have carried B's chunks by then.
    const decodeA = await decodeIn(sched, a, 16, { onToken: (n) => n === 5 && ac.abort(new Error("client gone")) });
    const prefillB = sched.prefill(seqB, prompt(2000, 6), ac.signal);
    await expect(prefillB).rejects.toThrow("client gone");
    expect(seqB.nPast % 16).toBe(0);
    expect(seqB.nPast).toBeGreaterThanOrEqual(3 * 16);
    expect(seqB.nPast).toBeLessThan(2000);
    expect(await decodeA.tokens).toEqual(expectA);
    expect(sched.status().prefills).toBe(0);
    seqB.release();
  });

  it("a failed shared step is blamed on whoever fails alone", async () => {
    const recorded = recordingEngine();
    const sched = new DecodeScheduler(recorded.engine, options({ tpotTargetMs: 0 }), log);
    const nVocab = engine.model.config.nVocab;
    // A prompt with a token outside the vocabulary: the engine refuses the step; the decode,
    // retried alone, goes on with the tokens it gets alone, and only the prompt fails.
    const a = prompt(20, 10);
    const expectA = await alone(a, 10);
    const decodeA = await decodeIn(sched, a, 10);
    const bad = engine.createSequence(50);
    recorded.steps.length = 0;
    await expect(sched.prefill(bad, [...prompt(49, 11), nVocab + 3])).rejects.toThrow(/outside the vocabulary/);
    expect(await decodeA.tokens).toEqual(expectA);
    // One refused pass, shared: the decode's token and the prompt's last chunk (its 49th token
    // and the bad one). The decode alone went through right after, so the prompt was failed,
    // holding the 48 tokens of the chunks before: the refused pass left nothing behind.
    const steps = recorded.steps;
    const refused = steps.findIndex((s) => !s.ok);
    expect(steps.filter((s) => !s.ok)).toHaveLength(1);
    expect(steps[refused]!.tokens.get(bad)).toBe(2);
    expect(steps[refused]!.tokens.size).toBe(2);
    expect(steps[refused + 1]).toMatchObject({ ok: true });
    expect([...steps[refused + 1]!.tokens.values()]).toEqual([1]);
    expect(bad.nPast).toBe(48);
    bad.release();

    // A decode fed a token outside the vocabulary fails; the prompt sharing its step goes on.
    // The prompt goes first and is long, so the decode joins while it still has chunks to run.
    const b = prompt(1000, 12);
    const refB = await reference(b);
    const seqB = engine.createSequence(1000);
    recorded.steps.length = 0;
    const prefillB = sched.prefill(seqB, b);
    const broken = (await decodeIn(sched, a, 10, { feedToken: nVocab + 5 })).tokens.catch((e: unknown) => e);
    const [failure, logitsB] = await Promise.all([broken, prefillB]);
    expect(String(failure)).toMatch(/outside the vocabulary/);
    // Refused: the shared pass (the bad token and 16 prompt tokens), then the decode alone; the
    // prompt's chunk ran again without it, and the prompt ends whole with the logits it gets alone.
    const refusedB = recorded.steps.filter((s) => !s.ok).map((s) => ({ promptTokens: s.tokens.get(seqB) ?? 0, sequences: s.tokens.size }));
    expect(refusedB).toEqual([
      { promptTokens: 16, sequences: 2 },
      { promptTokens: 0, sequences: 1 },
    ]);
    expect(seqB.nPast).toBe(1000);
    expectSameLogits(logitsB, refB);
    expect(sched.status()).toMatchObject({ running: 0, prefills: 0, live_sequences: 0 });
    seqB.release();
  });

  it("refuses a prompt that does not fit, or a second one for the same sequence, before it joins a step", async () => {
    const sched = new DecodeScheduler(engine, options({}), log);
    const seq = engine.createSequence(10);
    expect(() => sched.prefill(seq, prompt(11, 7))).toThrow(/exceed the context limit of 10/);
    expect(() => sched.prefill(seq, [])).toThrow(/empty/);
    const first = sched.prefill(seq, [1, 2, 3]);
    expect(() => sched.prefill(seq, [4])).toThrow(/already has a prompt/);
    await first;
    expect(sched.status().prefills).toBe(0);
    seq.release();
  });
});
