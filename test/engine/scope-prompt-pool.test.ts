// SCOPE's prompt pool (SnapKV-style compression, alpha1/alpha2) through the engine: a pool that
// covers the prompt is full attention bit for bit; a small one keeps alpha1 + alpha2 prompt tokens
// per layer and KV head; after a KV import (no prompt queries) the prompt is kept whole.
import { beforeAll, describe, expect, it } from "vitest";
import { Engine, loadModel } from "../../shared/inference/engine/engine.ts";
import type { AttentionPolicy, NativeSequence } from "../../shared/inference/engine/native.ts";
import { resolveModel } from "../../shared/inference/model/resolve.ts";
import { argmax } from "../../tools/lib/logits.ts";

let engine: Engine;
const PROMPT = Array.from({ length: 300 }, (_, i) => 100 + ((i * 7919) % 30000));
const LAYERS_X_HEADS = 30 * 3;
const scope = (alpha1: number, alpha2 = 8): AttentionPolicy => ({
  kind: "scope",
  scope: { beta1: 64, beta2: 64, alpha1, alpha2, maxOutput: 64 },
});

beforeAll(async () => {
  engine = new Engine(await loadModel(await resolveModel()), { threads: 1 });
});

async function decode(seq: NativeSequence, first: number, steps: number) {
  const logits: Float32Array[] = [];
  let tok = first;
  for (let s = 0; s < steps; s++) {
    const [l] = await engine.decode([seq], [tok]);
    logits.push(l!);
    tok = argmax(l!);
  }
  return logits;
}

async function run(policy: AttentionPolicy, steps = 6) {
  const seq = engine.createSequence(PROMPT.length + steps + 1);
  seq.setPolicy(policy);
  const first = argmax(await engine.prefill(seq, PROMPT));
  const logits = await decode(seq, first, steps);
  const stats = seq.policyStats;
  seq.release();
  return { first, logits, stats };
}

const same = (a: Float32Array[], b: Float32Array[]) =>
  a.every((x, i) => Buffer.compare(Buffer.from(x.buffer), Buffer.from(b[i]!.buffer)) === 0);

describe("scope prompt pool", () => {
  it("covering the prompt equals no compression, bit for bit", async () => {
    const whole = await run(scope(0));
    const covering = await run(scope(PROMPT.length - 8));
    expect(same(covering.logits, whole.logits)).toBe(true);
    expect(covering.stats.promptPoolTokens).toBe(LAYERS_X_HEADS * PROMPT.length);
    expect(whole.stats.promptPoolTokens).toBe(0); // no compression: no pools
  });

  it("keeps alpha1 + alpha2 prompt tokens per layer and KV head, and changes what decode sees", async () => {
    const whole = await run(scope(0));
    const small = await run(scope(24, 8));
    expect(small.stats.promptPoolTokens).toBe(LAYERS_X_HEADS * 32);
    expect(same(small.logits, whole.logits)).toBe(false);
  });

  it("keeps the whole prompt after a KV import, whose prompt queries are gone", async () => {
    const src = engine.createSequence(PROMPT.length + 1);
    const first = argmax(await engine.prefill(src, PROMPT));
    const layers = Array.from({ length: 30 }, (_, i) => i);
    const rows = new Uint8Array(PROMPT.length * 30 * 768);
    src.exportRows(rows, layers, 0, PROMPT.length);
    const dst = engine.createSequence(PROMPT.length + 8);
    dst.setPolicy(scope(24, 8));
    dst.importRows(rows, layers, 0, PROMPT.length);
    dst.setLength(PROMPT.length);
    const imported = await decode(dst, first, 6);
    expect(dst.policyStats.promptPoolTokens).toBe(LAYERS_X_HEADS * PROMPT.length);
    expect(same(imported, (await run(scope(0))).logits)).toBe(true);
    src.release();
    dst.release();
  });

  it("refuses bad settings", () => {
    const seq = engine.createSequence(8);
    expect(() => seq.setPolicy(scope(-1))).toThrow(/alpha1/);
    expect(() => seq.setPolicy(scope(16, 0))).toThrow(/alpha2/);
    expect(() => seq.setPolicy(scope(16, 65))).toThrow(/alpha2/);
    expect(() =>
      seq.setPolicy({
        kind: "omnikv+scope",
        omnikv: { filterLayers: [2], budget: 8 },
        scope: { beta1: 8, beta2: 8, alpha1: 16, maxOutput: 64 },
      }),
    ).toThrow(/alpha1 is for kind scope/);
    seq.release();
  });
});
