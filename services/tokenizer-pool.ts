// Prompts are tokenized on a small pool of worker threads (tinypool), so a long prompt never
// stalls the event loop that health checks, streams and other requests share. Each thread holds
// its own tokenizer, built once from the model's tokenizer metadata.
import Tinypool from "tinypool";
import { ApiError } from "../shared/platform/http/errors.ts";
import type { PromptJob, PromptJobResult } from "../shared/inference/tokenizer/prompt-job.ts";
import type { GgufMetadata } from "../shared/inference/tokenizer/tokenizer.ts";

/**
 * Threads. Tokenizing a context's worth of ordinary text takes milliseconds, far less than
 * prefilling it, so one keeps up with the engine; each costs ~65 MB (its own vocabulary, merges and
 * module copies). The worst prompt under the character cap, a single 660k-character word (BPE
 * merges a word whole), holds the thread for a few hundred milliseconds.
 */
export const TOKENIZER_THREADS = 1;
/** Prompts waiting for a thread before new ones get 429. */
export const TOKENIZER_QUEUE = 1024;

export class TokenizerPool {
  private pool: Tinypool | undefined;
  private readonly meta: GgufMetadata;

  /** The threads start on the first prompt (or `ready()`): a decode-only service never starts them. */
  constructor(
    meta: GgufMetadata,
    private readonly threads = TOKENIZER_THREADS,
  ) {
    // Only what the tokenizer and chat template read travels to the threads (not the weights' tables).
    this.meta = Object.fromEntries(Object.entries(meta).filter(([k]) => k.startsWith("tokenizer.")));
  }

  private get started(): Tinypool {
    this.pool ??= new Tinypool({
      filename: new URL("./tokenizer-worker.mjs", import.meta.url).href,
      minThreads: this.threads,
      maxThreads: this.threads,
      maxQueue: TOKENIZER_QUEUE,
      workerData: this.meta,
    });
    return this.pool;
  }

  async run(job: PromptJob): Promise<PromptJobResult> {
    try {
      return (await this.started.run(job)) as PromptJobResult;
    } catch (e) {
      if (e instanceof Error && /queue is at limit/i.test(e.message)) {
        throw new ApiError(429, "queue_full", `${TOKENIZER_QUEUE} prompts are waiting to be tokenized; retry later`);
      }
      throw e;
    }
  }

  /** Resolves once a thread has started and tokenized (a failure to start surfaces here, at startup). */
  async ready(): Promise<void> {
    const r = await this.run({ kind: "text", text: "ready", maxTokens: 8 });
    if (!r.ok || r.ids.length === 0) throw new Error("the tokenizer thread could not tokenize");
  }

  async close(): Promise<void> {
    await this.pool?.destroy();
    this.pool = undefined;
  }
}
