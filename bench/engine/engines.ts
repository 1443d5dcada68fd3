// The two engines behind one small interface, so the benchmark loop treats them alike:
// open a session (one sequence with room for the prompt plus the decode steps), prefill a
// prompt in ubatch-sized chunks (timing each chunk), greedy-decode N steps (timing each step),
// reset, dispose.
import {
  getLlama,
  LlamaLogLevel,
  type ControlledEvaluateInputItem,
  type Llama,
  type LlamaContext,
  type LlamaContextSequence,
  type LlamaModel,
  type Token,
} from "node-llama-cpp";

import { Engine, loadModel, type EngineInfo, type LoadedModel, type NativeSequence } from "../../shared/inference/engine/engine.ts";

export interface PrefillResult {
  ms: number;
  /** Wall time of each chunk, in order (chunk i covers positions [i·chunk, (i+1)·chunk)). */
  chunkMs: number[];
  /** Greedy next token after the prompt. */
  next: number;
}

export interface DecodeResult {
  ms: number;
  stepMs: number[];
  /** The greedy tokens produced, one per step. */
  tokens: number[];
}

export interface Session {
  prefill(tokens: readonly number[], chunk: number): Promise<PrefillResult>;
  /** `steps` single-token forward passes, starting by feeding `first`, each feeding the argmax of the last. */
  decode(first: number, steps: number): Promise<DecodeResult>;
  /** Forget the sequence's tokens (keeps the allocation). */
  reset(): Promise<void>;
  /** Forget every token from position n on (to decode again from the same prompt). */
  rollback(n: number): Promise<void>;
  dispose(): Promise<void>;
  /** Threads the engine reports it actually uses for this session. */
  actualThreads(): number | undefined;
}

export interface Backend {
  /** Stable id used in the results ("ours", "llama", "llama-fa-off", ...). */
  readonly id: string;
  readonly label: string;
  open(threads: number, tokens: number): Promise<Session>;
  dispose(): Promise<void>;
}

function chunks(tokens: readonly number[], chunk: number): number[][] {
  const size = chunk > 0 ? chunk : tokens.length;
  const out: number[][] = [];
  for (let i = 0; i < tokens.length; i += size) out.push(tokens.slice(i, i + size) as number[]);
  return out;
}

// ---------------------------------------------------------------------------------------------
// Ours: shared/inference/engine (N-API addon). One Engine per thread count, each with one sequence of the
// engine's full context that every session reuses (truncate(0) between runs): the KV cache is
// mmap'ed lazily, so memory stays bounded by the longest prompt instead of piling up until GC.

export interface OursOptions {
  ubatch: number;
  maxContext: number;
}

export class OursBackend implements Backend {
  readonly id = "ours";
  readonly label = "ours";
  private readonly engines = new Map<number, { engine: Engine; seq: NativeSequence }>();

  private constructor(
    readonly model: LoadedModel,
    private readonly opts: OursOptions,
  ) {}

  static async load(modelPath: string, opts: OursOptions): Promise<OursBackend> {
    return new OursBackend(await loadModel(modelPath), opts);
  }

  engine(threads: number): { engine: Engine; seq: NativeSequence } {
    let e = this.engines.get(threads);
    if (!e) {
      // Decode steps on `threads` too (the engine's default is one), as llama.cpp's are.
      const engine = new Engine(this.model, {
        threads,
        decodeThreads: threads,
        ubatch: this.opts.ubatch,
        maxContext: this.opts.maxContext,
      });
      e = { engine, seq: engine.createSequence(engine.maxContext) };
      this.engines.set(threads, e);
    }
    return e;
  }

  info(threads: number): EngineInfo {
    return { ...this.engine(threads).engine.native.info };
  }

  async open(threads: number, tokens: number): Promise<Session> {
    const { engine, seq } = this.engine(threads);
    if (tokens > seq.capacity) throw new Error(`ours: ${tokens} tokens exceed the engine context ${seq.capacity}`);
    seq.truncate(0);
    // Greedy tokens come from the engine (`argmax`: no logits row is written or copied to JS), as
    // llama.cpp samples in C++; only the prompt's last chunk asks for one, as on llama.cpp's side.
    const greedy = new Int32Array(1);
    return {
      async prefill(prompt, chunk) {
        const chunkMs: number[] = [];
        const parts = chunks(prompt, chunk);
        const t0 = performance.now();
        for (let p = 0; p < parts.length; p++) {
          const tc = performance.now();
          await engine.forward([{ seq, tokens: Int32Array.from(parts[p]!), ...(p === parts.length - 1 ? { argmax: greedy } : {}) }]);
          chunkMs.push(performance.now() - tc);
        }
        return { ms: performance.now() - t0, chunkMs, next: greedy[0]! };
      },
      async decode(first, steps) {
        const stepMs: number[] = [];
        const tokens: number[] = [];
        let tok = first;
        const t0 = performance.now();
        for (let i = 0; i < steps; i++) {
          const ts = performance.now();
          await engine.forward([{ seq, tokens: Int32Array.of(tok), argmax: greedy }]);
          tok = greedy[0]!;
          stepMs.push(performance.now() - ts);
          tokens.push(tok);
        }
        return { ms: performance.now() - t0, stepMs, tokens };
      },
      async reset() {
        seq.truncate(0);
      },
      async rollback(n) {
        seq.truncate(n);
      },
      async dispose() {
        seq.truncate(0);
      },
      actualThreads: () => engine.native.info.threads,
    };
  }

  async dispose(): Promise<void> {
    this.engines.clear();
  }
}

// ---------------------------------------------------------------------------------------------
// llama.cpp through node-llama-cpp's prebuilt CPU binary. One context per session (created with
// exactly the requested threads and batch size, disposed afterwards).
//
// Prefill: `controlledEvaluate` per chunk; the last token of the prompt asks for a greedy next
// token, the others only fill the KV cache (same work as ours, whose prefill returns the logits
// of the last token).
// Decode: the `sequence.evaluate([first], { temperature: 0 })` generator: per step one
// llama_decode of one token plus greedy sampling in C++; this is node-llama-cpp's own generation
// path and has less JS overhead per step than issuing a controlledEvaluate call per token.

export type FlashAttention = "auto" | "on" | "off";

export interface LlamaOptions {
  batchSize: number;
  flashAttention: FlashAttention;
}

export interface LlamaRuntime {
  llama: Llama;
  model: LlamaModel;
  /** Log lines kept for inspection (flash-attention resolution etc.). */
  logs: string[];
}

export async function loadLlama(modelPath: string): Promise<LlamaRuntime> {
  const logs: string[] = [];
  const llama = await getLlama({
    gpu: false,
    build: "never",
    // Info level so the context creation reports how "auto" flash attention was resolved; the
    // lines are captured, not printed (warnings and errors still go to stderr).
    logLevel: LlamaLogLevel.info,
    logger: (level, message) => {
      const line = message.trimEnd();
      if (level === LlamaLogLevel.error || level === LlamaLogLevel.fatal || level === LlamaLogLevel.warn) {
        if (!/^\s*$/.test(line)) process.stderr.write(`[llama.cpp ${level}] ${line}\n`);
      }
      if (logs.length < 20_000) logs.push(line);
    },
    // 0 = no thread cap: each context then uses exactly the `threads` it is given.
    maxThreads: 0,
  });
  const model = await llama.loadModel({ modelPath });
  return { llama, model, logs };
}

export class LlamaBackend implements Backend {
  readonly id: string;
  readonly label: string;
  /** How llama.cpp resolved the flash-attention setting in the last context created. */
  resolvedFlashAttention: "enabled" | "disabled" | "unknown" = "unknown";

  constructor(
    private readonly rt: LlamaRuntime,
    readonly opts: LlamaOptions,
    primary: boolean,
  ) {
    this.id = primary ? "llama" : `llama-fa-${opts.flashAttention}`;
    this.label = `llama.cpp (FA ${opts.flashAttention})`;
  }

  async open(threads: number, tokens: number): Promise<Session> {
    const logFrom = this.rt.logs.length;
    const ctx: LlamaContext = await this.rt.model.createContext({
      contextSize: tokens,
      batchSize: this.opts.batchSize,
      threads: { ideal: threads, min: threads },
      flashAttention: this.opts.flashAttention === "auto" ? "auto" : this.opts.flashAttention === "on",
      // F16 K/V is llama.cpp's default; stated explicitly so a changed default cannot skew the comparison.
      experimentalKvCacheKeyType: "F16",
      experimentalKvCacheValueType: "F16",
    });
    this.resolvedFlashAttention = resolveFlashAttention(this.rt.logs.slice(logFrom));
    const seq: LlamaContextSequence = ctx.getSequence();
    return {
      async prefill(prompt, chunk) {
        const chunkMs: number[] = [];
        const parts = chunks(prompt, chunk);
        let next = -1;
        const t0 = performance.now();
        for (let p = 0; p < parts.length; p++) {
          const c = parts[p]!;
          const last = p === parts.length - 1;
          const tc = performance.now();
          const ids = c as Token[]; // node-llama-cpp brands token ids; these come from its tokenizer
          const input: ControlledEvaluateInputItem[] = last
            ? ids.map((id, i) => (i === ids.length - 1 ? [id, { generateNext: { token: true, options: { temperature: 0 } } }] : id))
            : ids;
          const out = await seq.controlledEvaluate(input);
          chunkMs.push(performance.now() - tc);
          if (last) next = out[c.length - 1]?.next?.token ?? -1;
        }
        const ms = performance.now() - t0;
        if (next < 0) throw new Error("llama.cpp: prefill produced no next token");
        return { ms, chunkMs, next };
      },
      async decode(first, steps) {
        const stepMs: number[] = [];
        const tokens: number[] = [];
        const start = seq.nextTokenIndex;
        const it = seq.evaluate([first as Token], { temperature: 0, yieldEogToken: true })[Symbol.asyncIterator]();
        const t0 = performance.now();
        for (let i = 0; i < steps; i++) {
          const ts = performance.now();
          const r = await it.next();
          if (r.done) throw new Error(`llama.cpp: generation ended after ${i} steps`);
          stepMs.push(performance.now() - ts);
          tokens.push(r.value);
        }
        const ms = performance.now() - t0;
        await it.return(undefined);
        if (seq.nextTokenIndex !== start + steps) {
          throw new Error(
            `llama.cpp: the sequence went from ${start} to ${seq.nextTokenIndex} tokens over ${steps} steps ` +
              `(context shift? context size ${ctx.contextSize})`,
          );
        }
        return { ms, stepMs, tokens };
      },
      async reset() {
        await seq.clearHistory();
      },
      async rollback(n) {
        if (seq.nextTokenIndex > n) await seq.eraseContextTokenRanges([{ start: n, end: seq.nextTokenIndex }]);
      },
      async dispose() {
        await ctx.dispose();
      },
      actualThreads: () => {
        try {
          // Internal, best effort: the thread count llama.cpp's context really has.
          const n = (ctx as unknown as { _ctx?: { getThreads?: () => number } })._ctx?.getThreads?.();
          return typeof n === "number" ? n : undefined;
        } catch {
          return undefined;
        }
      },
    };
  }

  async dispose(): Promise<void> {
    /* the shared runtime is disposed by its owner */
  }
}

/** "enabled"/"disabled" from llama.cpp's context-creation log lines. */
export function resolveFlashAttention(lines: readonly string[]): "enabled" | "disabled" | "unknown" {
  let state: "enabled" | "disabled" | "unknown" = "unknown";
  for (const l of lines) {
    const fused = /Flash Attention (enabled|disabled)/i.exec(l);
    if (fused) state = fused[1]!.toLowerCase() as "enabled" | "disabled";
    const param = /flash_attn\s*=\s*(enabled|disabled)/i.exec(l);
    if (param) state = param[1]!.toLowerCase() as "enabled" | "disabled";
  }
  return state;
}
