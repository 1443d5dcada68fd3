// The engine as the rest of the project uses it: a loaded model, its fingerprint, and a
// compute engine that runs batched forward passes over sequences.
import { createHash } from "node:crypto";
import { open } from "node:fs/promises";

import { PolicyError } from "../policy/errors.ts";
import {
  addon,
  ggufInfo,
  type AttentionPolicy,
  type EngineDevice,
  type EngineInfo,
  type EngineOptions,
  type ForwardItem,
  type ModelConfig,
  type NativeEngine,
  type NativeModel,
  type NativeSequence,
} from "./native.ts";

export type { EngineDevice, EngineInfo, EngineOptions, ForwardItem, ModelConfig, NativeSequence };

export interface LoadedModel {
  path: string;
  native: NativeModel;
  config: ModelConfig;
  /** sha256 over the GGUF header (metadata + tensor table), the file size and the weights' CRC-32C. */
  fingerprint: string;
}

/**
 * The model's identity for KV compatibility (chunk headers, chunk keys, handles): sha256 of the
 * GGUF's descriptive header, its size and the CRC-32C of all its tensor data (taken by the engine
 * at load), so the same architecture with any weight byte changed is another model.
 */
export async function modelFingerprint(path: string, weightsCrc32c: number): Promise<string> {
  const info = ggufInfo(path);
  const fh = await open(path, "r");
  try {
    const header = Buffer.alloc(info.headerBytes);
    await fh.read(header, 0, header.length, 0);
    const tail = Buffer.alloc(12);
    tail.writeBigUInt64LE(BigInt(info.fileSize));
    tail.writeUInt32LE(weightsCrc32c >>> 0, 8);
    return createHash("sha256").update(header).update(tail).digest("hex");
  } finally {
    await fh.close();
  }
}

export async function loadModel(path: string): Promise<LoadedModel> {
  const native = await addon().loadModel(path);
  return { path, native, config: native.config, fingerprint: await modelFingerprint(path, native.weightsCrc32c) };
}

export interface SequenceOptions {
  /**
   * A model with sliding-window layers: their rings hold the window plus this many rows (default:
   * the engine's micro-batch), and the sequence's prompt runs are cut to it. A sequence filled by
   * a KV import and decoded a token at a time needs few (DECODE_RING_BATCH).
   */
  ringBatch?: number;
}

/** The ring batch of a decode's imported sequences: 64 rows past the window (its own prompt runs: 65 tokens). */
export const DECODE_RING_BATCH = 64;

export class Engine {
  readonly native: NativeEngine;
  readonly model: LoadedModel;

  constructor(model: LoadedModel, options: EngineOptions = {}) {
    this.model = model;
    this.native = new (addon().NativeEngine)(model.native, options);
  }

  /** What the engine runs with: kernels, threads, micro-batch, context, device. */
  get info(): EngineInfo {
    return this.native.info;
  }

  get maxContext(): number {
    return this.native.info.maxContext;
  }

  /** "cpu" or "cuda:N": where this engine's forward passes run. */
  get device(): string {
    return this.native.info.device;
  }

  /** Prompt tokens one forward pass computes at most (the engine's micro-batch). */
  get ubatch(): number {
    return this.native.info.ubatch;
  }

  /**
   * KV bytes a sequence holds with n tokens: every global layer's n rows (`globalRows` at most, a
   * reclaiming policy's bound: reclaimedRows), each sliding-window layer's ring at most.
   */
  kvBytes(nTokens: number, opts: SequenceOptions & { globalRows?: number } = {}): number {
    return this.native.kvBytes(nTokens, opts.ringBatch, opts.globalRows);
  }

  createSequence(capacity?: number, opts: SequenceOptions = {}): NativeSequence {
    return this.native.createSequence(capacity, opts.ringBatch);
  }

  /**
   * Applies `policy` to `seq` (before its prompt, so what the policy keeps of the prompt's queries
   * is observed): the engine's validation of it; PolicyError with the engine's reason when it is refused.
   */
  applyPolicy(seq: NativeSequence, policy: AttentionPolicy): void {
    try {
      seq.setPolicy(policy);
    } catch (e) {
      if (e instanceof RangeError || e instanceof TypeError) throw new PolicyError(`invalid attention policy: ${e.message}`);
      throw e;
    }
  }

  /** One batched forward pass over several sequences' tokens (see ForwardItem). */
  forward(items: ForwardItem[]): Promise<void> {
    return this.native.forward(items);
  }

  /**
   * Round Attention's pick over the whole prompt `seq` holds: the earlier rounds (indices into its
   * policy's starts) whose KV the layers above the watershed will attend. What a prefill that hands
   * its KV over names, so the decode loads only those (setRoundPick there).
   */
  pickRounds(seq: NativeSequence): Promise<number[]> {
    return this.native.pickRounds(seq);
  }

  /** Throws unless `n` more tokens fit in `seq` (its capacity and the engine's context). */
  checkAppend(seq: NativeSequence, n: number): void {
    if (n === 0) throw new Error("prefill: the prompt is empty (it needs at least one token)");
    const limit = Math.min(seq.capacity, this.maxContext);
    if (seq.nPast + n > limit) throw new Error(`prefill: ${seq.nPast + n} tokens exceed the context limit of ${limit}`);
  }

  /** Appends `tokens` to `seq` and returns the logits of the token that would come next. */
  async prefill(seq: NativeSequence, tokens: ArrayLike<number>): Promise<Float32Array> {
    this.checkAppend(seq, tokens.length);
    const logits = new Float32Array(this.model.config.nVocab);
    await this.forward([{ seq, tokens: Int32Array.from(tokens), logits }]);
    return logits;
  }

  /** One decode step for several sequences at once: one token each, logits for each. */
  async decode(seqs: NativeSequence[], tokens: number[]): Promise<Float32Array[]> {
    if (seqs.length !== tokens.length) throw new Error("decode: one token per sequence");
    const logits = seqs.map(() => new Float32Array(this.model.config.nVocab));
    await this.forward(seqs.map((seq, i) => ({ seq, tokens: Int32Array.of(tokens[i]!), logits: logits[i] })));
    return logits;
  }
}
