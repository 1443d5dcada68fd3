// Prompts are tokenized on a small pool of worker threads (tinypool), so a long prompt never
// stalls the event loop that health checks, streams and other requests share. Each thread holds
// its own tokenizer, built once from the model's tokenizer metadata.
import Tinypool from "tinypool";
import { ApiError } from "../shared/http/errors.ts";
import type { PromptJob, PromptJobResult } from "../shared/tokenizer/prompt-job.ts";
import type { GgufMetadata } from "../shared/tokenizer/tokenizer.ts";

/**
 * Threads. Tokenizing a whole context takes milliseconds (tens at worst: a single 600k-character
 * word), far less than prefilling it, so one keeps up with the engine; each costs ~65 MB (its own
 * vocabulary, merges and module copies).
 */
export const TOKENIZER_THREADS = 1;
/** Prompts waiting for a thread before new ones get 429. */
export const TOKENIZER_QUEUE = 1024;

export class TokenizerPool {
  private readonly pool: Tinypool;

  constructor(meta: GgufMetadata, threads = TOKENIZER_THREADS) {
    // Only what the tokenizer and chat template read travels to the threads (not the weights' tables).
    const tokenizerMeta = Object.fromEntries(Object.entries(meta).filter(([k]) => k.startsWith("tokenizer.")));
    this.pool = new Tinypool({
      filename: new URL("./tokenizer-worker.mjs", import.meta.url).href,
      minThreads: threads,
      maxThreads: threads,
      maxQueue: TOKENIZER_QUEUE,
      workerData: tokenizerMeta,
    });
  }

  async run(job: PromptJob): Promise<PromptJobResult> {
    try {
      return (await this.pool.run(job)) as PromptJobResult;
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

  close(): Promise<void> {
    return this.pool.destroy();
  }
}
