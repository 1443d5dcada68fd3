// The decode scheduler shares batch places fairly between keys: free places go to the keys in turn,
// and a key left without a place takes one from the key holding the most (whose newest sequence
// pauses, KV kept, and resumes later). A fake engine keeps this to the scheduler's own logic.
import pino from "pino";
import { describe, expect, it } from "vitest";
import type { Engine } from "../../shared/inference/engine/engine.ts";
import { DecodeScheduler } from "../../services/decode/scheduler.ts";
import { Slot } from "../../services/decode/slot.ts";

function fakeEngine(steps: { n: number }): Engine {
  return {
    model: { config: { nVocab: 4 } },
    native: { info: { ubatch: 512 }, forward: async () => new Promise((r) => setTimeout(r, 1)) },
    checkAppend() {},
    forward: async () => {
      steps.n++;
      await new Promise((r) => setTimeout(r, 1));
    },
  } as unknown as Engine;
}

/** A sequence that samples `tokens` tokens (one per step it is in, each recorded) and finishes. */
function slot(name: string, tenant: string, tokens: number, order: string[]): Slot {
  let count = 1;
  const text = {
    get count() {
      return count;
    },
    push: () => ({ text: "x", finish: ++count > tokens ? ("length" as const) : undefined }),
  };
  const sampler = { sample: () => (order.push(name), 1) };
  const s = new Slot({ release() {}, hostBytesUsed: 0 } as never, 1, sampler as never, text as never);
  s.tenant = tenant;
  return s;
}

const drain = async (s: Slot) => {
  for (;;) if ((await s.next(new AbortController().signal)).type !== "token") return;
};

describe("DecodeScheduler batch places", () => {
  it("go round robin across keys, oldest first within a key", async () => {
    const order: string[] = [];
    const sched = new DecodeScheduler(
      fakeEngine({ n: 0 }),
      { maxBatch: 1, maxQueue: 8, kvBudgetBytes: 1 << 30, tpotTargetMs: 100 },
      pino({ level: "silent" }),
    );
    const slots = [slot("a1", "a", 1, order), slot("a2", "a", 1, order), slot("a3", "a", 1, order), slot("b1", "b", 1, order)];
    for (const s of slots) sched.start(s);
    await Promise.all(slots.map(drain));
    expect(order).toEqual(["a1", "b1", "a2", "a3"]);
    expect(sched.status().preemptions).toBe(0);
  });

  it("a key holding every place gives one up for another key's request within a step", async () => {
    const order: string[] = [];
    const steps = { n: 0 };
    const sched = new DecodeScheduler(
      fakeEngine(steps),
      { maxBatch: 4, maxQueue: 8, kvBudgetBytes: 1 << 30, tpotTargetMs: 100 },
      pino({ level: "silent" }),
    );
    // Key a: four long generations fill the batch.
    const long = [1, 2, 3, 4].map((i) => slot(`a${i}`, "a", 40, order));
    for (const s of long) sched.start(s);
    while (steps.n < 5) await new Promise((r) => setTimeout(r, 1));
    // Key b: a 2-token chat arrives while a holds all four places.
    const short = slot("b1", "b", 2, order);
    const arrivedAtStep = steps.n;
    sched.start(short);
    await drain(short);
    const firstB = order.indexOf("b1");
    // b joined the very next step: no more than one step of a's ran after it arrived.
    expect(order.slice(0, firstB).filter((n) => n.startsWith("a")).length).toBeLessThanOrEqual((arrivedAtStep + 1) * 4);
    expect(sched.status().preemptions).toBe(1);
    expect(short.batchWaitMs()).toBeLessThan(1000);
    // The paused sequence of a resumes and every one of a's finishes.
    await Promise.all(long.map(drain));
    for (const name of ["a1", "a2", "a3", "a4"]) expect(order.filter((n) => n === name).length).toBe(40);
    // It was paused: it spent steps waiting, the others did not.
    const waited = long.map((s) => s.batchWaitMs());
    expect(Math.max(...waited)).toBeGreaterThan(0);
  });
});
