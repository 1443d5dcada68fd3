// --max-context: a sequence may hold more tokens than the model was trained for (to measure the
// cost of long contexts with a small model); the setting is validated, the engine computes past
// the trained context, and the runtime says that such positions give no meaningful answers.
import { mkdtemp, rm, writeFile } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { Writable } from "node:stream";
import { afterAll, beforeAll, describe, expect, it } from "vitest";

import { ConfigError, loadConfig } from "../../shared/platform/config.ts";
import { Engine, loadModel } from "../../shared/inference/engine/engine.ts";
import { resolveModel } from "../../shared/inference/model/resolve.ts";
import { createLogger, openRuntime } from "../../services/runtime.ts";
import { tinyLlama } from "../harness/gguf-writer.ts";

let dir: string;
let tinyPath: string;

beforeAll(async () => {
  dir = await mkdtemp(join(tmpdir(), "ctxbank-max-context-"));
  tinyPath = join(dir, "tiny.gguf");
  await writeFile(tinyPath, tinyLlama({ nCtx: 64 }));
});

afterAll(async () => {
  await rm(dir, { recursive: true, force: true });
});

describe("--max-context", () => {
  it("is read from the flag or CTXBANK_MAX_CONTEXT and validated", () => {
    expect(loadConfig("serve", {}, {}).maxContext).toBeUndefined();
    expect(loadConfig("serve", { "max-context": "32770" }, {}).maxContext).toBe(32770);
    expect(loadConfig("serve", {}, { CTXBANK_MAX_CONTEXT: "16384" }).maxContext).toBe(16384);
    expect(() => loadConfig("serve", { "max-context": "0" }, {})).toThrow(ConfigError);
    expect(() => loadConfig("serve", {}, { CTXBANK_MAX_CONTEXT: "lots" })).toThrow(/CTXBANK_MAX_CONTEXT/);
  });

  it("lets the engine compute past the trained context, with the same logits as a longer default would give", async () => {
    const model = await loadModel(tinyPath);
    expect(model.config.nCtxTrain).toBe(64);
    const trained = new Engine(model, { threads: 1 });
    const longer = new Engine(model, { threads: 1, maxContext: 160 });
    expect(trained.maxContext).toBe(64);
    expect(longer.maxContext).toBe(160);
    const ids = Array.from({ length: 150 }, (_, i) => (i * 7) % 16);
    expect(() => trained.createSequence(150)).toThrow();
    const seq = longer.createSequence(150);
    const first = await longer.prefill(seq, ids.slice(0, 60));
    const last = await longer.prefill(seq, ids.slice(60));
    expect(seq.nPast).toBe(150);
    expect(last.every(Number.isFinite)).toBe(true);
    // Within the trained context both engines agree exactly.
    const ref = trained.createSequence(60);
    expect(Array.from(await trained.prefill(ref, ids.slice(0, 60)))).toEqual(Array.from(first));
    seq.release();
    ref.release();
  });

  it("the runtime warns when the context is longer than the model's", async () => {
    let logged = "";
    const sink = new Writable({ write: (chunk, _enc, done) => ((logged += String(chunk)), done()) });
    const config = loadConfig("serve", { model: await resolveModel(), "max-context": "9000" }, {}, { logLevel: "warn" });
    const rt = await openRuntime(config, createLogger(config, sink)).catch((e: unknown) => e);
    try {
      if (rt instanceof Error) throw rt;
      expect((rt as Awaited<ReturnType<typeof openRuntime>>).engine.maxContext).toBe(9000);
      expect(logged).toMatch(/"maxContext":9000,"trainedContext":8192.*longer than the model was trained for/);
    } finally {
      if (!(rt instanceof Error)) await (rt as Awaited<ReturnType<typeof openRuntime>>).close();
    }
  });
});
