// Physical reclamation from the API (policy `reclaim`, native/src/kv_slots.h): scope, streaming
// and h2o sequences that free their evicted tokens' rows give the same logits, bit for bit, as
// masking, while deviceBytesUsed stays within the bound admission reserves (reclaimedRows) instead
// of growing with the output; on the default model (every layer global) and on a Gemma 3-shaped
// one (only the global layers reclaim, the sliding ones keep their rings). Once rows moved, what
// addresses the cache by position is refused.
import { mkdtempSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { afterAll, beforeAll, describe, expect, it } from "vitest";

import { Engine, loadModel } from "../../shared/inference/engine/engine.ts";
import type { AttentionPolicy } from "../../shared/inference/engine/native.ts";
import { resolveModel } from "../../shared/inference/model/resolve.ts";
import { reclaimedRows, withReclaim } from "../../shared/inference/policy/reclaim.ts";
import { completePolicy, PolicySpecSchema } from "../../shared/inference/policy/schema.ts";
import { argmax } from "../../tools/lib/logits.ts";
import { tinyArchModel, TINY_ARCH_VOCAB } from "../harness/arch-models.ts";

const PROMPT = 48;
const STEPS = 80; // well past every bound below, so masking holds rows reclamation has freed

const dir = mkdtempSync(join(tmpdir(), "ctxbank-reclaim-"));
afterAll(() => rmSync(dir, { recursive: true, force: true }));

/** Greedy decoding under `policy`; the largest deviceBytesUsed seen and the sequence (released by the caller). */
async function run(engine: Engine, policy: AttentionPolicy, vocab: number) {
  const ids = Array.from({ length: PROMPT }, (_, i) => 3 + ((i * 7919) % (vocab - 3)));
  const seq = engine.createSequence(PROMPT + STEPS + 8); // room for the refused prompt below
  engine.applyPolicy(seq, policy);
  const logits: Float32Array[] = [await engine.prefill(seq, ids)];
  let peak = seq.deviceBytesUsed;
  for (let s = 0; s < STEPS; s++) {
    logits.push((await engine.decode([seq], [argmax(logits.at(-1)!)]))[0]!);
    peak = Math.max(peak, seq.deviceBytesUsed);
  }
  return { logits, peak, seq };
}

/** The same policy with and without reclamation: same logits, fewer bytes, within the admission bound. */
async function compare(engine: Engine, policy: AttentionPolicy, vocab: number) {
  const on = withReclaim(policy);
  const masked = await run(engine, policy, vocab);
  const reclaimed = await run(engine, on, vocab);
  try {
    expect(reclaimed.logits).toEqual(masked.logits);
    expect(masked.seq.rowsMoved).toBe(false);
    expect(reclaimed.seq.rowsMoved).toBe(true);
    expect(masked.seq.deviceBytesUsed).toBe(engine.kvBytes(PROMPT + STEPS));
    const bound = engine.kvBytes(PROMPT + STEPS, { globalRows: reclaimedRows(completePolicy(on), PROMPT) });
    expect(bound).toBeLessThan(engine.kvBytes(PROMPT + STEPS));
    expect(reclaimed.peak).toBeLessThanOrEqual(bound);
    expect(reclaimed.seq.deviceBytesUsed).toBeLessThan(masked.seq.deviceBytesUsed);
    return reclaimed.seq;
  } catch (e) {
    reclaimed.seq.release();
    throw e;
  } finally {
    masked.seq.release();
  }
}

const POLICIES: AttentionPolicy[] = [
  { kind: "scope", scope: { beta1: 8, beta2: 8, maxOutput: STEPS } },
  { kind: "streaming", streaming: { sinks: 4, window: 16 } },
  { kind: "h2o", h2o: { budget: 24, recent: 8 } },
];

describe("reclamation on the default model", () => {
  let engine: Engine;
  beforeAll(async () => {
    engine = new Engine(await loadModel(await resolveModel()), { threads: 1 });
  });

  for (const policy of POLICIES) {
    it(`${policy.kind}: the same logits in the rows its bound allows`, async () => {
      const seq = await compare(engine, policy, engine.model.config.nVocab);
      seq.release();
    });
  }

  it("set before a KV import, as a decode sets it: the same logits", async () => {
    const { nLayer, nVocab } = engine.model.config;
    const ids = Array.from({ length: PROMPT }, (_, i) => 3 + ((i * 7919) % (nVocab - 3)));
    const source = engine.createSequence(PROMPT);
    const layers = Array.from({ length: nLayer }, (_, l) => l);
    const rows = new Uint8Array(engine.kvBytes(PROMPT));
    const first = argmax(await engine.prefill(source, ids));
    source.exportRows(rows, layers, 0, PROMPT);
    source.release();
    const decode = async (policy: AttentionPolicy) => {
      const seq = engine.createSequence(PROMPT + STEPS + 1);
      try {
        engine.applyPolicy(seq, policy); // before the import, as handover.sequence does
        seq.importRows(rows, layers, 0, PROMPT);
        seq.setLength(PROMPT);
        const out: Float32Array[] = [];
        let tok = first;
        for (let s = 0; s < STEPS; s++) {
          out.push((await engine.decode([seq], [tok]))[0]!);
          tok = argmax(out.at(-1)!);
        }
        return { out, moved: seq.rowsMoved };
      } finally {
        seq.release();
      }
    };
    const policy: AttentionPolicy = { kind: "streaming", streaming: { sinks: 4, window: 16 } };
    const masked = await decode(policy);
    const reclaimed = await decode({ kind: "streaming", streaming: { sinks: 4, window: 16, reclaim: true } });
    expect(reclaimed.moved).toBe(true);
    expect(reclaimed.out).toEqual(masked.out);
  });

  it("refuses what addresses the cache by position once rows moved", async () => {
    const seq = await compare(engine, POLICIES[0]!, engine.model.config.nVocab);
    try {
      const rows = new Uint8Array(engine.kvBytes(1) / engine.model.config.nLayer);
      const moved = { name: "RangeError", code: "rows_moved" };
      for (const call of [
        () => seq.truncate(4),
        () => seq.setLength(4),
        () => seq.exportRows(rows, [0], 0, 1),
        () => seq.importRows(rows, [0], 0, 1),
        () => seq.setPolicy({ kind: "full" }),
      ]) {
        expect(call).toThrow(expect.objectContaining(moved));
      }
      await expect(engine.prefill(seq, [5, 6])).rejects.toThrow(/reclaimed evicted KV rows/);
    } finally {
      seq.release();
    }
  });

  it("is refused where evicted rows are still read, and defaults to off", () => {
    const bad = PolicySpecSchema.safeParse({
      kind: "omnikv+scope",
      omnikv: { filter_layers: [2], budget: 64 },
      scope: { beta1: 8, beta2: 8, reclaim: true },
    });
    expect(bad.success).toBe(false);
    expect(bad.error?.issues[0]?.message).toMatch(/scope\.reclaim is for kind scope/);
    expect(completePolicy({ kind: "h2o", h2o: { budget: 24, recent: 8 } })).toMatchObject({ h2o: { reclaim: false } });
    expect(reclaimedRows(completePolicy({ kind: "h2o", h2o: { budget: 24, recent: 8 } }), PROMPT)).toBeUndefined();
  });
});

describe("reclamation on a model with sliding-window layers", () => {
  it("frees the global layers' rows only: the same logits, the rings untouched", async () => {
    const path = join(dir, "gemma3-reclaim.gguf");
    // Layers 0 and 2 slide (window 16), 1 and 3 are global.
    writeFileSync(path, tinyArchModel({ arch: "gemma3", nLayer: 4, slidingWindow: 16, swaPeriod: 2, nCtx: 512, seed: 77 }));
    const engine = new Engine(await loadModel(path), { threads: 1 });
    for (const policy of POLICIES) {
      const seq = await compare(engine, policy, TINY_ARCH_VOCAB);
      seq.release();
    }
  });
});
