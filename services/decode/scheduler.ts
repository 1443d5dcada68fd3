// Continuous batching: every running sequence advances by one token per step, and one step is one
// engine.decode() call over all of them (the weights are read once for the whole batch). Sequences
// join between steps as soon as their KV is loaded and leave as soon as they finish or their
// client goes away, so a long generation never holds up a short one.
//
// Admission happens before any work: a request reserves its KV bytes (prompt + max tokens) and a
// place; when the places (batch + queue) or the KV budget are used up it gets 429 at once.
import type { Logger } from "pino";
import type { Engine, NativeSequence } from "../../shared/engine/engine.ts";
import type { Sampler } from "../../shared/engine/sampler.ts";
import type { FinishReason } from "../../shared/generate.ts";
import { ApiError } from "../../shared/http/errors.ts";
import type { TokenTextStream } from "./text-stream.ts";

export type SlotEvent =
  | { type: "token"; id: number; text: string; index: number }
  | { type: "done"; finish: FinishReason }
  | { type: "error"; error: unknown };

export interface SchedulerOptions {
  maxBatch: number;
  maxQueue: number;
  kvBudgetBytes: number;
}

/** A sequence being decoded: its cache, the token to feed next, its sampler and text stream. */
export class Slot {
  private readonly events: SlotEvent[] = [];
  private wake: (() => void) | undefined;
  cancelled = false;
  ended = false;
  /** performance.now() when it was handed to the batch, and when it first joined a step. */
  queuedAt: number | undefined;
  joinedAt: number | undefined;

  constructor(
    readonly seq: NativeSequence,
    public last: number,
    readonly sampler: Sampler,
    readonly text: TokenTextStream,
  ) {}

  push(ev: SlotEvent): void {
    this.events.push(ev);
    const wake = this.wake;
    this.wake = undefined;
    wake?.();
  }

  /** How long it waited for a batch place (so far, if it has not joined yet). */
  batchWaitMs(now: number = performance.now()): number {
    return this.queuedAt === undefined ? 0 : (this.joinedAt ?? now) - this.queuedAt;
  }

  /** The next event; rejects with the signal's reason once the signal fires. */
  async next(signal: AbortSignal): Promise<SlotEvent> {
    while (this.events.length === 0) {
      signal.throwIfAborted();
      await new Promise<void>((resolve) => {
        const onAbort = () => resolve();
        this.wake = () => {
          signal.removeEventListener("abort", onAbort);
          resolve();
        };
        signal.addEventListener("abort", onAbort, { once: true });
      });
    }
    return this.events.shift()!;
  }
}

export class Reservation {
  private released = false;
  constructor(
    private readonly scheduler: DecodeScheduler,
    readonly bytes: number,
  ) {}
  release(): void {
    if (this.released) return;
    this.released = true;
    this.scheduler.unreserve(this.bytes);
  }
}

export interface SchedulerStatus {
  running: number;
  waiting: number;
  admitted: number;
  kv_reserved_bytes: number;
  kv_budget_bytes: number;
  live_sequences: number;
  steps: number;
  tokens: number;
  max_batch_seen: number;
}

export class DecodeScheduler {
  private readonly running: Slot[] = [];
  private readonly waiting: Slot[] = [];
  private readonly inStep = new Set<Slot>();
  private admitted = 0;
  private reservedBytes = 0;
  private looping = false;
  private steps = 0;
  private tokens = 0;
  private maxBatchSeen = 0;
  /** Sequences created for requests and not yet released (whoever owns them). */
  liveSequences = 0;

  constructor(
    private readonly engine: Engine,
    readonly options: SchedulerOptions,
    private readonly log: Logger,
  ) {}

  /** Reserves a place and `bytes` of KV memory, or throws 429. */
  admit(bytes: number): Reservation {
    const { maxBatch, maxQueue, kvBudgetBytes } = this.options;
    if (this.admitted >= maxBatch + maxQueue) {
      throw new ApiError(429, "queue_full", `decode is full: ${this.admitted} requests admitted (batch ${maxBatch} + queue ${maxQueue}); retry later`);
    }
    if (this.reservedBytes + bytes > kvBudgetBytes) {
      throw new ApiError(
        429,
        "kv_memory_full",
        `not enough KV memory: this request needs ${bytes} bytes, ${kvBudgetBytes - this.reservedBytes} of ${kvBudgetBytes} are free; retry later or ask for fewer tokens`,
      );
    }
    this.admitted++;
    this.reservedBytes += bytes;
    return new Reservation(this, bytes);
  }

  unreserve(bytes: number): void {
    this.admitted--;
    this.reservedBytes -= bytes;
  }

  /** Hands a loaded sequence to the batch; it is released when it finishes or is cancelled. */
  start(slot: Slot): void {
    slot.queuedAt = performance.now();
    this.waiting.push(slot);
    if (!this.looping) void this.loop();
  }

  /** The client went away: the sequence leaves the batch and its memory is freed now (or right after the step in flight). */
  cancel(slot: Slot): void {
    if (slot.ended) return;
    slot.cancelled = true;
    if (!this.inStep.has(slot)) this.remove(slot);
  }

  /** Host-bank bytes (offloaded sparse layers) of the sequences in the batch and waiting for it. */
  hostBytesInUse(): number {
    let bytes = 0;
    for (const list of [this.running, this.waiting]) for (const slot of list) bytes += slot.seq.hostBytesUsed;
    return bytes;
  }

  status(): SchedulerStatus {
    return {
      running: this.running.length,
      waiting: this.waiting.length,
      admitted: this.admitted,
      kv_reserved_bytes: this.reservedBytes,
      kv_budget_bytes: this.options.kvBudgetBytes,
      live_sequences: this.liveSequences,
      steps: this.steps,
      tokens: this.tokens,
      max_batch_seen: this.maxBatchSeen,
    };
  }

  private remove(slot: Slot): void {
    if (slot.ended) return;
    slot.ended = true;
    for (const list of [this.running, this.waiting]) {
      const i = list.indexOf(slot);
      if (i >= 0) list.splice(i, 1);
    }
    slot.seq.release();
    this.liveSequences--;
  }

  private async loop(): Promise<void> {
    this.looping = true;
    try {
      for (;;) {
        while (this.running.length < this.options.maxBatch && this.waiting.length > 0) {
          const slot = this.waiting.shift()!;
          slot.joinedAt = performance.now();
          this.running.push(slot);
        }
        if (this.running.length === 0) return;
        const batch = this.running.slice();
        this.maxBatchSeen = Math.max(this.maxBatchSeen, batch.length);
        batch.forEach((s) => this.inStep.add(s));
        let logits: Float32Array[];
        try {
          logits = await this.engine.decode(
            batch.map((s) => s.seq),
            batch.map((s) => s.last),
          );
        } catch (error) {
          this.log.error({ err: error, batch: batch.length }, "decode step failed");
          for (const s of batch) {
            this.inStep.delete(s);
            s.push({ type: "error", error });
            this.remove(s);
          }
          continue;
        } finally {
          batch.forEach((s) => this.inStep.delete(s));
        }
        this.steps++;
        for (let i = 0; i < batch.length; i++) {
          const s = batch[i]!;
          if (s.cancelled) {
            this.remove(s);
            continue;
          }
          const id = s.sampler.sample(logits[i]!);
          s.last = id;
          this.tokens++;
          const step = s.text.push(id);
          s.push({ type: "token", id, text: step.text, index: s.text.count - 1 });
          if (step.finish) {
            s.push({ type: "done", finish: step.finish });
            this.remove(s);
          }
        }
      }
    } finally {
      this.looping = false;
    }
  }
}
