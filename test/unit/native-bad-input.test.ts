// Bad input through the TS wrapper (shared/inference/engine): unreadable or unsupported model files, bad
// engine options and malformed forward() batches are refused with clear messages, change no
// state, and leave the process able to run a normal prefill.
import { existsSync } from "node:fs";
import { copyFile, mkdir, mkdtemp, open, rm, truncate, writeFile } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { afterAll, beforeAll, describe, expect, it } from "vitest";

import { Engine, loadModel, type LoadedModel } from "../../shared/inference/engine/engine.ts";
import { ggufInfo, readGgufMetadata, type NativeSequence } from "../../shared/inference/engine/native.ts";
import { GgmlType, tinyLlama } from "../harness/gguf-writer.ts";

const REAL = process.env.CTXBANK_MODEL || "/tmp/smollm2.gguf";
const hasReal = existsSync(REAL);

let dir: string;
let tinyPath: string;
let tiny: LoadedModel;

beforeAll(async () => {
  dir = await mkdtemp(join(tmpdir(), "ctxbank-bad-input-"));
  tinyPath = join(dir, "tiny.gguf");
  await writeFile(tinyPath, tinyLlama());
  tiny = await loadModel(tinyPath);
});

afterAll(async () => {
  await rm(dir, { recursive: true, force: true });
});

describe("model files", () => {
  it("a missing file", async () => {
    const p = join(dir, "missing.gguf");
    await expect(loadModel(p)).rejects.toThrow(`gguf: cannot open '${p}': No such file or directory`);
    expect(() => ggufInfo(p)).toThrow(/cannot open .*No such file/);
  });

  it("a directory", async () => {
    const p = join(dir, "a-dir.gguf");
    await mkdir(p);
    await expect(loadModel(p)).rejects.toThrow(`gguf: '${p}' is not a regular file`);
  });

  it("a file that is not GGUF", async () => {
    const p = join(dir, "notes.txt");
    await writeFile(p, "this is not a model\n".repeat(100));
    await expect(loadModel(p)).rejects.toThrow(`gguf: '${p}' is not a GGUF file (bad magic)`);
    expect(() => readGgufMetadata(p)).toThrow(/not a GGUF file \(bad magic\)/);
    const small = join(dir, "small.bin");
    await writeFile(small, "GGUF");
    await expect(loadModel(small)).rejects.toThrow(/is too small to be a GGUF file \(4 bytes\)/);
  });

  it("a model with an unsupported tensor type names the tensor and the type", async () => {
    const p = join(dir, "q3k.gguf");
    // Q3_K rows hold 256 values, so give the FFN that width and quantize its down projection.
    await writeFile(p, tinyLlama({ nFf: 256, override: { "blk.0.ffn_down.weight": { type: GgmlType.Q3_K } } }));
    expect(ggufInfo(p).tensors.find((t) => t.name === "blk.0.ffn_down.weight")?.type).toBe("Q3_K");
    await expect(loadModel(p)).rejects.toThrow("model: tensor 'blk.0.ffn_down.weight' has type Q3_K, which ctxbank does not support");
  });

  it("a model of another architecture", async () => {
    const p = join(dir, "gpt2.gguf");
    const buf = tinyLlama();
    // Same-length swap inside the file: "llama" -> "gpt2x" keeps every offset valid.
    buf.write("gpt2x", buf.indexOf("llama", buf.indexOf("general.architecture")), "latin1");
    await writeFile(p, buf);
    await expect(loadModel(p)).rejects.toThrow("model: architecture 'gpt2x' is not supported (supported: llama, qwen2, qwen3, gemma3)");
  });

  describe.skipIf(!hasReal)("truncated copies of the real model", () => {
    it("its first 1 MB", async () => {
      const p = join(dir, "first-1mb.gguf");
      const fh = await open(REAL, "r");
      try {
        const head = Buffer.alloc(1 << 20);
        await fh.read(head, 0, head.length, 0);
        await writeFile(p, head);
      } finally {
        await fh.close();
      }
      // The tokenizer metadata alone is over 1 MB: the cut lands inside it (the merges array,
      // whose element count no longer fits in what is left).
      await expect(loadModel(p)).rejects.toThrow(/^gguf: metadata 'tokenizer\.ggml\.\w+' .*\(truncated or corrupt\)$/);
    });

    it("the whole file but its last byte", async () => {
      const p = join(dir, "minus-one.gguf");
      await copyFile(REAL, p);
      const info = ggufInfo(p);
      await truncate(p, info.fileSize - 1);
      // The last tensor in the file is the one that no longer fits.
      const last = [...info.tensors].sort((a, b) => b.offset - a.offset)[0]!;
      await expect(loadModel(p)).rejects.toThrow(`gguf: tensor '${last.name}' extends past the end of the file (truncated?)`);
      await rm(p);
    });
  });
});

describe("engine options", () => {
  it("rejects out-of-range and non-integer numbers with RangeError", () => {
    expect(() => new Engine(tiny, { threads: 0 })).toThrow(RangeError);
    expect(() => new Engine(tiny, { threads: 0 })).toThrow("threads must be an integer in [1, 256]");
    expect(() => new Engine(tiny, { threads: 1000 })).toThrow(RangeError);
    expect(() => new Engine(tiny, { ubatch: -1 })).toThrow("ubatch must be an integer in [1, 8192]");
    expect(() => new Engine(tiny, { ubatch: -1 })).toThrow(RangeError);
    expect(() => new Engine(tiny, { maxContext: 1.5 })).toThrow("maxContext must be an integer in [0, 4194304]");
    expect(() => new Engine(tiny, { maxContext: 1.5 })).toThrow(RangeError);
    expect(() => new Engine(tiny, { threads: Number.NaN })).toThrow(RangeError);
  });

  it("rejects non-numbers with TypeError", () => {
    expect(() => new Engine(tiny, { threads: "2" as unknown as number })).toThrow(TypeError);
    expect(() => new Engine(tiny, { threads: "2" as unknown as number })).toThrow("threads must be a number");
    expect(() => new Engine(tiny, { maxContext: null as unknown as number })).toThrow(TypeError);
  });

  it("rejects a sequence capacity beyond maxContext", () => {
    const e = new Engine(tiny, { maxContext: 32 });
    expect(e.maxContext).toBe(32);
    expect(() => e.createSequence(33)).toThrow(RangeError);
    expect(() => e.createSequence(0)).toThrow("createSequence: capacity must be an integer in [1, 32]");
  });
});

describe("forward() with bad input", () => {
  let engine: Engine;
  let nVocab: number;
  const ids = (...t: number[]) => Int32Array.from(t);

  beforeAll(() => {
    engine = new Engine(tiny, { threads: 1 });
    nVocab = tiny.config.nVocab;
  });

  // Each refusal leaves the sequence as it was.
  async function unchanged(seq: NativeSequence, attempt: () => unknown): Promise<unknown> {
    const before = seq.nPast;
    let error: unknown;
    try {
      await attempt();
    } catch (e) {
      error = e;
    }
    expect(seq.nPast).toBe(before);
    return error;
  }

  it("empty prompts and prompts longer than the context", async () => {
    const seq = engine.createSequence();
    await expect(engine.prefill(seq, [])).rejects.toThrow("prefill: the prompt is empty (it needs at least one token)");
    const tooLong = new Array(engine.maxContext + 1).fill(1);
    await expect(engine.prefill(seq, tooLong)).rejects.toThrow(
      `prefill: ${engine.maxContext + 1} tokens exceed the context limit of ${engine.maxContext}`,
    );
    // The native layer checks the same on its own.
    await expect(engine.native.forward([{ seq, tokens: new Int32Array(0) }])).rejects.toThrow("forward: empty token list");
    await expect(engine.native.forward([{ seq, tokens: Int32Array.from(tooLong) }])).rejects.toThrow(
      `forward: ${engine.maxContext + 1} tokens exceed the context limit of ${engine.maxContext}`,
    );
    expect(seq.nPast).toBe(0);
  });

  it("malformed batches are refused synchronously with TypeError/RangeError", async () => {
    const seq = engine.createSequence();
    const f = engine.native.forward.bind(engine.native) as (items: unknown) => Promise<void>;
    expect(await unchanged(seq, () => f([{ seq, tokens: [1, 2, 3] }]))).toEqual(
      new TypeError("forward: item 0.tokens must be an Int32Array"),
    );
    expect(await unchanged(seq, () => f([{ seq, tokens: Uint32Array.of(1) }]))).toBeInstanceOf(TypeError);
    expect(await unchanged(seq, () => f([{ seq, tokens: ids(1), logits: new Float32Array(nVocab - 1) }]))).toEqual(
      new TypeError("forward: item 0.logits must be a Float32Array of nVocab"),
    );
    expect(await unchanged(seq, () => f([{ seq, tokens: ids(1), logits: new Float64Array(nVocab) }]))).toBeInstanceOf(TypeError);
    expect(await unchanged(seq, () => f([{ seq: {}, tokens: ids(1) }]))).toEqual(new TypeError("forward: item 0.seq is not a sequence"));
    expect(await unchanged(seq, () => f([]))).toEqual(new RangeError("forward: empty batch"));
    expect(await unchanged(seq, () => f("x"))).toEqual(new TypeError("forward(items) needs an array"));
  });

  it("token ids outside the vocabulary", async () => {
    const seq = engine.createSequence();
    for (const bad of [nVocab, -1, 2 ** 31 - 1]) {
      const err = await unchanged(seq, () => engine.native.forward([{ seq, tokens: ids(1, bad) }]));
      expect(err).toEqual(new Error(`forward: token id ${bad} is outside the vocabulary`));
    }
  });

  it("the same sequence twice in one batch, or a sequence already in flight", async () => {
    const a = engine.createSequence();
    const b = engine.createSequence();
    const err = await unchanged(a, () =>
      engine.native.forward([
        { seq: b, tokens: ids(1) },
        { seq: a, tokens: ids(2) },
        { seq: a, tokens: ids(3) },
      ]),
    );
    expect(err).toEqual(new Error("forward: a sequence appears twice in one batch"));
    expect(b.nPast).toBe(0); // the valid item of the refused batch did not run either

    const inFlight = engine.native.forward([{ seq: a, tokens: ids(1, 2, 3) }]);
    expect(() => engine.native.forward([{ seq: a, tokens: ids(4) }])).toThrow("forward: sequence is already in a forward pass");
    expect(() => a.truncate(0)).toThrow("sequence is busy in a forward pass");
    await inFlight;
    expect(a.nPast).toBe(3);
    await engine.native.forward([{ seq: a, tokens: ids(4) }]); // free again once settled
    expect(a.nPast).toBe(4);
  });

  it("prompt state: wrong arguments are TypeErrors, malformed bytes RangeErrors, and the sequence keeps working", async () => {
    const policy = { kind: "scope", scope: { beta1: 4, beta2: 4, alpha1: 2, alpha2: 2, maxOutput: 8 } } as const;
    const seq = engine.createSequence();
    seq.setPolicy(policy);
    await engine.prefill(seq, [1, 2, 3, 4, 5, 6]);
    const state = seq.exportPromptState()!;
    expect(state).toBeInstanceOf(Uint8Array);
    for (const bad of [undefined, "x", [1, 2], new Int32Array(4), new Float32Array(state.buffer.slice(0, 8))])
      expect(() => seq.importPromptState(bad as never)).toThrow(TypeError);
    for (const bad of [
      new Uint8Array(0),
      state.subarray(0, state.length - 1),
      Uint8Array.from([...state, 0]),
      new Uint8Array(state.length).fill(0xff),
    ])
      expect(() => seq.importPromptState(bad)).toThrow(/^importPromptState: prompt state: /);
    // Not read from a sequence of another length.
    const other = engine.createSequence();
    other.setPolicy(policy);
    await engine.prefill(other, [1, 2, 3]);
    expect(() => other.importPromptState(state)).toThrow(RangeError);
    expect(seq.importPromptState(state)).toBe(true);
    await engine.decode([seq], [7]);
    const full = engine.createSequence();
    await engine.prefill(full, [1, 2, 3]);
    expect(full.exportPromptState()).toBeNull(); // full attention remembers nothing
  });

  it("a normal prefill still works and matches a fresh engine", async () => {
    const seq = engine.createSequence();
    const logits = await engine.prefill(seq, [1, 2, 3, 4, 5]);
    expect(seq.nPast).toBe(5);
    const fresh = new Engine(tiny, { threads: 1 });
    expect(await fresh.prefill(fresh.createSequence(), [1, 2, 3, 4, 5])).toEqual(logits);
    expect(logits.every(Number.isFinite)).toBe(true);
  });
});

describe.skipIf(!hasReal)("the real model", () => {
  let engine: Engine;
  beforeAll(async () => {
    engine = new Engine(await loadModel(REAL), { threads: 1 });
  });

  it("refuses a prompt longer than the model context, then prefills normally", async () => {
    const ctx = engine.maxContext;
    expect(ctx).toBe(engine.model.config.nCtxTrain);
    const seq = engine.createSequence();
    const tooLong = new Array(ctx + 1).fill(1);
    await expect(engine.prefill(seq, tooLong)).rejects.toThrow(`prefill: ${ctx + 1} tokens exceed the context limit of ${ctx}`);
    await expect(engine.native.forward([{ seq, tokens: Int32Array.from(tooLong) }])).rejects.toThrow(
      `forward: ${ctx + 1} tokens exceed the context limit of ${ctx} (model context)`,
    );
    await expect(engine.prefill(seq, [])).rejects.toThrow("prefill: the prompt is empty");
    await expect(engine.native.forward([{ seq, tokens: Int32Array.of(engine.model.config.nVocab) }])).rejects.toThrow(
      "outside the vocabulary",
    );
    expect(seq.nPast).toBe(0);
    const logits = await engine.prefill(seq, [1, 9690, 198]);
    expect(seq.nPast).toBe(3);
    expect(logits.every(Number.isFinite)).toBe(true);
  });
});
