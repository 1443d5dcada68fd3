// The KV memory pool (native/src/kv_pool.h) seen from JS: a released sequence's pages serve the
// next sequence, which reads zeros everywhere (never the last tenant's KV), the limit is set and
// validated, and 0 turns the pool off. The pool is per process; the services set it from
// --kv-pool-mib (services/runtime.ts).
import { afterAll, beforeAll, expect, it } from "vitest";
import { Engine, loadModel } from "../../shared/inference/engine/engine.ts";
import { kvPool } from "../../shared/inference/engine/native.ts";
import { resolveModel } from "../../shared/inference/model/resolve.ts";

let engine: Engine;
const cap = 2048; // ~45 MiB of KV for the default model

beforeAll(async () => {
  engine = new Engine(await loadModel(await resolveModel()), { threads: 1 });
});
afterAll(() => void kvPool(1 << 30));

async function pooled(min: number): Promise<number> {
  for (let i = 0; i < 500 && kvPool().readyRegions < min; i++) await new Promise((r) => setTimeout(r, 10));
  return kvPool().readyRegions;
}

it("a released sequence's memory comes to the next one zeroed", async () => {
  kvPool(0);
  kvPool(512 * 2 ** 20);
  const a = engine.createSequence(cap);
  new Uint8Array(a.kvBuffer()).fill(0xab);
  a.release();
  expect(new Uint8Array(a.kvBuffer()).every((b) => b === 0)).toBe(true); // released: reads see zeros
  expect(await pooled(1)).toBe(1);
  const before = kvPool();
  expect(before.readyBytes).toBeGreaterThan(40 * 2 ** 20);
  const b = engine.createSequence(cap);
  expect(kvPool().takes).toBe(before.takes + 1);
  expect(new Uint8Array(b.kvBuffer()).every((x) => x === 0)).toBe(true);
  b.release();
});

it("the limit is validated, and 0 turns the pool off", async () => {
  for (const bad of [-1, 1.5, Number.NaN, "1" as unknown as number]) expect(() => kvPool(bad)).toThrow(RangeError);
  expect(kvPool(0)).toMatchObject({ limitBytes: 0, readyRegions: 0, readyBytes: 0 });
  const a = engine.createSequence(cap);
  new Uint8Array(a.kvBuffer()).fill(1);
  a.release();
  await new Promise((r) => setTimeout(r, 50));
  expect(kvPool().readyRegions).toBe(0);
  const misses = kvPool().misses;
  engine.createSequence(cap).release();
  expect(kvPool().misses).toBe(misses + 1);
});
