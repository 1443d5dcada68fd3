// The decode scheduler gives batch places to the keys in turn: with one place, a key's three
// waiting sequences do not all join before another key's one. A fake engine (each step finishes
// every sequence in it) keeps this to the scheduler's own logic.
import pino from "pino";
import { describe, expect, it } from "vitest";
import type { Engine } from "../shared/inference/engine/engine.ts";
import { DecodeScheduler } from "../services/decode/scheduler.ts";
import { Slot } from "../services/decode/slot.ts";

function fakeEngine(): Engine {
  return {
    model: { config: { nVocab: 4 } },
    native: { info: { ubatch: 512 }, forward: async () => new Promise((r) => setTimeout(r, 1)) },
    checkAppend() {},
  } as unknown as Engine;
}

function slot(tenant: string): Slot {
  const text = { count: 1, push: () => ({ text: "x", finish: "length" as const }) };
  const s = new Slot({ release() {}, hostBytesUsed: 0 } as never, 1, { sample: () => 1 } as never, text as never);
  s.tenant = tenant;
  return s;
}

describe("DecodeScheduler batch places", () => {
  it("go round robin across keys, oldest first within a key", async () => {
    const sched = new DecodeScheduler(fakeEngine(), { maxBatch: 1, maxQueue: 8, kvBudgetBytes: 1 << 30, tpotTargetMs: 100 }, pino({ level: "silent" }));
    const slots = { a1: slot("a"), a2: slot("a"), a3: slot("a"), b1: slot("b") };
    for (const s of Object.values(slots)) sched.start(s);
    await Promise.all(Object.values(slots).map((s) => s.next(new AbortController().signal)));
    const order = Object.entries(slots)
      .sort(([, x], [, y]) => x.joinedAt! - y.joinedAt!)
      .map(([name]) => name);
    expect(order).toEqual(["a1", "b1", "a2", "a3"]);
  });
});
