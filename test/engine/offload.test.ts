// Memory tiers (OmniKV offload): the sparse layers' KV lives in a host bank and each selection is
// one packed gather per filter layer. Same logits as without offload, bit for bit (prefill into the
// bank, offload after prefill, and KV imported as chunks); the device arena holds only the dense,
// filter and guard layers plus the packed rows; a device budget is enforced with clear errors.
import { beforeAll, describe, expect, it } from "vitest";
import { Engine, loadModel, type LoadedModel } from "../../shared/inference/engine/engine.ts";
import type { AttentionPolicy } from "../../shared/inference/engine/native.ts";
import { resolveModel } from "../../shared/inference/model/resolve.ts";
import { argmax } from "../../tools/lib/logits.ts";

let model: LoadedModel;
let engine: Engine;
const PROMPT = Array.from({ length: 600 }, (_, i) => 100 + ((i * 7919) % 30000));
const FILTERS = [2, 7, 17];
const omnikv = (offload: boolean, budget = 64): AttentionPolicy => ({ kind: "omnikv", omnikv: { filterLayers: FILTERS, budget, offload } });
const PAIR = 2 * 192 * 2; // one token's K and V rows of one layer, f16

/** Bit-identical logits, step by step (cheap to report when they are not). */
function expectSameLogits(a: Float32Array[], b: Float32Array[]) {
  expect(a.length).toBe(b.length);
  a.forEach((x, i) =>
    expect(
      Buffer.compare(Buffer.from(x.buffer, x.byteOffset, x.byteLength), Buffer.from(b[i]!.buffer, b[i]!.byteOffset, b[i]!.byteLength)),
      `step ${i}`,
    ).toBe(0),
  );
}

beforeAll(async () => {
  model = await loadModel(await resolveModel());
  engine = new Engine(model, { threads: 1 });
});

/** Greedy decode; `when` says whether the policy is set before the prefill or after it. */
async function run(policy: AttentionPolicy, when: "before" | "after", steps = 16, eng = engine) {
  const seq = eng.createSequence(PROMPT.length + steps + 1);
  if (when === "before") seq.setPolicy(policy);
  let logits = await eng.prefill(seq, PROMPT);
  if (when === "after") seq.setPolicy(policy);
  const all: Float32Array[] = [];
  for (let s = 0; s < steps; s++) {
    all.push(logits);
    logits = (await eng.decode([seq], [argmax(logits)]))[0]!;
  }
  return { all, seq };
}

describe("omnikv offload", () => {
  it("gives the same logits as the single-tier cache, bit for bit", async () => {
    const plain = await run(omnikv(false), "before");
    const banked = await run(omnikv(true), "before");
    const movedAfter = await run(omnikv(true), "after");
    expectSameLogits(banked.all, plain.all);
    expectSameLogits(movedAfter.all, plain.all);
    expect(banked.seq.policyStats.selections).toBe(plain.seq.policyStats.selections);
    for (const r of [plain, banked, movedAfter]) r.seq.release();
  });

  it("keeps 8 of 30 layers on the device; the other 22 in the host bank", async () => {
    const { seq } = await run(omnikv(true), "before", 4);
    const n = seq.nPast;
    // Dense 0-1, filters 2, 7, 17 and their guards 3, 8, 18 stay; packed rows: 64 tokens x 22 layers.
    expect(seq.hostBytesUsed).toBe(n * 22 * PAIR);
    expect(seq.deviceBytesUsed).toBe(n * 8 * PAIR + 64 * 22 * PAIR);
    expect(seq.kvBytesUsed).toBe(n * 30 * PAIR);
    seq.setPolicy({ kind: "full" }); // offload off: the rows come back
    expect(seq.hostBytesUsed).toBe(0);
    expect(seq.deviceBytesUsed).toBe(n * 30 * PAIR);
    seq.release();
  });

  it("imports and exports chunk rows in either tier", async () => {
    const src = engine.createSequence(PROMPT.length + 8);
    src.setPolicy(omnikv(false));
    const first = argmax(await engine.prefill(src, PROMPT));
    const layers = Array.from({ length: 30 }, (_, i) => i);
    const n = src.nPast;
    const payload = new Uint8Array(n * 30 * PAIR);
    src.exportRows(payload, layers, 0, n);
    const dst = engine.createSequence(n + 8);
    dst.setPolicy(omnikv(true));
    dst.importRows(payload, layers, 0, n);
    dst.setLength(n);
    const back = new Uint8Array(payload.length);
    dst.exportRows(back, layers, 0, n);
    expect(Buffer.compare(back, payload)).toBe(0);
    const [a] = await engine.decode([src], [first]);
    const [b] = await engine.decode([dst], [first]);
    expectSameLogits([b!], [a!]);
    src.release();
    dst.release();
  });

  it("enforces the device budget: per forward, and for packed rows that could never fit", async () => {
    const small = new Engine(model, { threads: 1, deviceBudgetBytes: 700 * 8 * PAIR });
    expect(small.native.info.deviceBudgetBytes).toBe(700 * 8 * PAIR);
    const full = small.createSequence(PROMPT.length);
    await expect(small.prefill(full, PROMPT)).rejects.toThrow(/600 tokens need \d+ MiB of the device arena, which holds 4 MiB/);
    // Offloaded, 600 tokens x 8 device layers + 16 x 22 packed rows fit the same arena.
    const { all, seq } = await run(omnikv(true, 16), "before", 2, small);
    expect(all).toHaveLength(2);
    expect(seq.deviceBytesUsed).toBeLessThanOrEqual(700 * 8 * PAIR);
    expect(() => seq.setPolicy(omnikv(true, 5000))).toThrow(
      /budget of 5000 tokens needs \d+ MiB of packed rows, more than the device arena/,
    );
    seq.release();
    full.release();
  });

  it("refuses a malformed offload flag", () => {
    const seq = engine.createSequence(8);
    expect(() =>
      seq.setPolicy({ kind: "omnikv", omnikv: { filterLayers: FILTERS, budget: 8, offload: "yes" as unknown as boolean } }),
    ).toThrow(/policy\.omnikv\.offload: .*expected boolean/);
    seq.release();
  });
});
