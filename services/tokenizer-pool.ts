// Prompts are tokenized on a small pool of worker threads (tinypool), so a long prompt never
// stalls the event loop that health checks, streams and other requests share. Each thread holds
// its own tokenizer, built once from the model's tokenizer metadata. Turns on the threads are
// given per API key (a fair queue): one key holds one thread at most, so another key's prompt
// never waits behind its prompts.
import Tinypool from "tinypool";
import { LOCAL_TENANT } from "../shared/platform/auth/api-keys.ts";
import { FairQueue } from "../shared/platform/queue/fair-queue.ts";
import type { PromptJob, PromptJobResult } from "../shared/inference/tokenizer/prompt-job.ts";
import type { GgufMetadata } from "../shared/inference/tokenizer/tokenizer.ts";

/**
 * Threads. Tokenizing a context's worth of ordinary text takes milliseconds, far less than
 * prefilling it, so one keeps up with the engine; the second is the other keys' while one key
 * holds the first. Each costs ~65 MB (its own vocabulary, merges and module copies). The worst
 * prompt under the character cap, a single word too long for the context, is refused unmerged
 * (tokenizer.ts encodeWord) in tens of milliseconds.
 */
export const TOKENIZER_THREADS = 2;
/** Prompts waiting for a thread before new ones get 429. */
export const TOKENIZER_QUEUE = 1024;

export class TokenizerPool {
  private pool: Tinypool | undefined;
  private readonly meta: GgufMetadata;
  private readonly turns: FairQueue;

  /** The threads start on the first prompt (or `ready()`): a decode-only service never starts them. */
  constructor(
    meta: GgufMetadata,
    private readonly threads = TOKENIZER_THREADS,
  ) {
    // Only what the tokenizer and chat template read travels to the threads (not the weights' tables).
    this.meta = Object.fromEntries(Object.entries(meta).filter(([k]) => k.startsWith("tokenizer.")));
    this.turns = new FairQueue({ stage: "tokenize", limit: threads, capacity: TOKENIZER_QUEUE, perTenant: Math.max(1, threads - 1) });
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

  /** Tokenizes `job` on a thread, in `tenant`'s turn; rejects with the signal's reason if it fires while waiting. */
  async run(job: PromptJob, tenant: string = LOCAL_TENANT, signal: AbortSignal = new AbortController().signal): Promise<PromptJobResult> {
    const leave = await this.turns.enter(tenant, signal);
    try {
      return (await this.started.run(job)) as PromptJobResult;
    } finally {
      leave();
    }
  }

  /** Keys' turns on the threads: running and waiting prompts (for tests and status). */
  get queue(): FairQueue {
    return this.turns;
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
