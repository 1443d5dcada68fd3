// Chunked prefill in the decode scheduler: a prompt computed while sequences decode rides in their
// steps in chunks sized to the decodes' pace (step-plan.ts). The decodes get the tokens they get
// alone, the prompt gets the logits it gets alone, and every step they share carries a chunk of
// the size the plan allows.
import pino from "pino";
import { beforeAll, describe, expect, it } from "vitest";
import { Engine, loadModel } from "../shared/engine/engine.ts";
import { Sampler } from "../shared/engine/sampler.ts";
import { resolveModel } from "../shared/model/resolve.ts";
import { GgufTokenizer } from "../shared/tokenizer/tokenizer.ts";
import { DecodeScheduler, type SchedulerOptions } from "../services/decode/scheduler.ts";
import { Slot } from "../services/decode/slot.ts";
import { prefillChunkTokens, StepCosts } from "../services/decode/step-plan.ts";
import { TokenTextStream } from "../services/decode/text-stream.ts";
import { argmax } from "./helpers/logits.ts";

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

  async function startDecode(sched: DecodeScheduler, ids: number[], steps: number) {
    const seq = engine.createSequence(ids.length + steps + 1);
    const first = argmax(await engine.prefill(seq, ids));
    const text = new TokenTextStream({ createDetokenizer: () => tokenizer.createDetokenizer(), isEog: () => false }, steps, []);
    text.push(first);
    const slot = new Slot(seq, first, new Sampler({ temperature: 0 }), text);
    sched.liveSequences++;
    sched.start(slot);
    const tokens = [first];
    const done = (async () => {
      const signal = new AbortController().signal;
      for (;;) {
        const ev = await slot.next(signal);
        if (ev.type === "done") return tokens;
        if (ev.type === "error") throw ev.error;
        tokens.push(ev.id);
      }
    })();
    return done;
  }

  const options = (o: Partial<SchedulerOptions>): SchedulerOptions => ({ maxBatch: 4, maxQueue: 4, kvBudgetBytes: 1 << 30, tpotTargetMs: 100, ...o });

  it("a late decode makes every shared step carry the minimum chunk; both get what they get alone", async () => {
    const [a, b] = [prompt(40, 1), prompt(700, 2)];
    const steps = 24;
    const expectA = await alone(a, steps);
    const seqB = engine.createSequence(b.length);
    const refB = await engine.prefill(seqB, b);
    seqB.release();

    // A pace of 0 ms per token: the decode is always late, so a shared step carries 16 tokens.
    const sched = new DecodeScheduler(engine, options({ tpotTargetMs: 0, minPrefillChunk: 16 }), log);
    const mixedB = engine.createSequence(b.length);
    const decodeA = startDecode(sched, a, steps);
    const prefillB = sched.prefill(mixedB, b);
    const [tokensA, logitsB] = await Promise.all([decodeA, prefillB]);
    expect(tokensA).toEqual(expectA);
    expect(argmax(logitsB)).toBe(argmax(refB));
    for (let i = 0; i < refB.length; i += 997) expect(logitsB[i]).toBeCloseTo(refB[i]!, 3);
    const st = sched.status();
    // Every one of A's steps after its first token shared the step with B (B's 700 tokens outlast
    // 23 × 16), and B's remaining tokens ran alone in micro-batches of up to 128.
    expect(st.mixed_steps).toBe(steps - 1);
    expect(st.prefill_tokens).toBe(700);
    expect(st.steps).toBe(steps - 1 + Math.ceil((700 - (steps - 1) * 16) / 128));
    expect(mixedB.nPast).toBe(700);
    mixedB.release();
    expect(st).toMatchObject({ running: 0, prefills: 0 });
  });

  it("a decode with time to spare lets the prompt take whole micro-batches", async () => {
    const sched = new DecodeScheduler(engine, options({ tpotTargetMs: 1e6 }), log);
    const seqB = engine.createSequence(600);
    const decodeA = startDecode(sched, prompt(30, 3), 8);
    const logits = await sched.prefill(seqB, prompt(600, 4));
    await decodeA;
    const st = sched.status();
    // The first shared step has no measured costs and carries the minimum; from then on the
    // decode's slack covers any chunk, so B's 600 tokens need few steps.
    expect(st.prefill_tokens).toBe(600);
    expect(st.mixed_steps).toBeLessThanOrEqual(Math.ceil((600 - 16) / (128 - 1)) + 1);
    expect(argmax(logits)).toBeGreaterThanOrEqual(0);
    seqB.release();
  });

  it("an aborted prompt leaves the steps at once and the decode goes on", async () => {
    const sched = new DecodeScheduler(engine, options({ tpotTargetMs: 0, minPrefillChunk: 16 }), log);
    const a = prompt(20, 5);
    const expectA = await alone(a, 16);
    const seqB = engine.createSequence(2000);
    const ac = new AbortController();
    const decodeA = startDecode(sched, a, 16);
    const prefillB = sched.prefill(seqB, prompt(2000, 6), ac.signal);
    setTimeout(() => ac.abort(new Error("client gone")), 50);
    await expect(prefillB).rejects.toThrow("client gone");
    expect(seqB.nPast).toBeLessThan(2000);
    expect(await decodeA).toEqual(expectA);
    expect(sched.status().prefills).toBe(0);
    seqB.release();
  });

  it("refuses a prompt that does not fit before it joins a step", async () => {
    const sched = new DecodeScheduler(engine, options({}), log);
    const seq = engine.createSequence(10);
    expect(() => sched.prefill(seq, prompt(11, 7))).toThrow(/exceed the context limit of 10/);
    expect(() => sched.prefill(seq, [])).toThrow(/empty/);
    expect(sched.status().prefills).toBe(0);
    seq.release();
  });
});
