// Continuous batching: every running sequence advances by one token per step, and one step is one
// engine forward pass over all of them (the weights are read once for the whole batch). Sequences
// join between steps as soon as their KV is loaded and leave as soon as they finish or their
// client goes away, so a long generation never holds up a short one.
//
// Prompts computed on this engine (a colocated server's prefills, a recompute after a failed KV
// load) go through the same steps: each step carries a chunk of the oldest prompt next to the
// decode tokens, sized so the running decodes keep their pace (step-plan.ts). Without decodes a
// step carries a whole micro-batch.
//
// Batch places are shared fairly between API keys: a free place goes to the waiting key that joined
// least recently, and a key waiting with fewer places than another key holds minus one takes one
// of that key's places (its newest sequence pauses, its KV kept, and resumes at the next free
// place). So one key's long generations never keep another key's request out of the batch for
// longer than one step.
//
// Admission happens before any work: a request reserves its KV bytes (prompt + max tokens) and a
// place; when the places (batch + queue) or the KV budget are used up it gets 429 at once.
import type { Logger } from "pino";
import type { Engine, ForwardItem, NativeSequence } from "../../shared/inference/engine/engine.ts";
import { ApiError, retryAfter } from "../../shared/platform/http/errors.ts";
import { DrainRate, queueFull } from "../../shared/platform/queue/fair-queue.ts";
import { Reservation, type Slot } from "./slot.ts";
import { prefillChunkTokens, StepCosts } from "./step-plan.ts";

export interface SchedulerOptions {
  maxBatch: number;
  maxQueue: number;
  kvBudgetBytes: number;
  /** Each running decode is paced to this many ms per token while prompts share its steps. */
  tpotTargetMs: number;
  /** The smallest prompt chunk a step carries, however late the decodes are. */
  minPrefillChunk?: number;
}

/** A prompt being computed in the scheduler's steps (one per sequence at a time). */
interface PrefillJob {
  seq: NativeSequence;
  tokens: Int32Array;
  done: number;
  logits: Float32Array;
  signal: AbortSignal | undefined;
  resolve(logits: Float32Array): void;
  reject(error: unknown): void;
}

/** `n` tokens of a prompt, from where it stands, in the next step. */
interface PrefillChunk {
  job: PrefillJob;
  n: number;
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
  /** Sequences paused to give their batch place to another key's, since the start. */
  preemptions: number;
  /** Prompts waiting for or in the steps; steps that carried prompt tokens next to decodes. */
  prefills: number;
  mixed_steps: number;
  prefill_tokens: number;
}

export class DecodeScheduler {
  private readonly running: Slot[] = [];
  private readonly waiting: Slot[] = [];
  private readonly inStep = new Set<Slot>();
  private readonly prefills: PrefillJob[] = [];
  private readonly costs = new StepCosts();
  private admitted = 0;
  private reservedBytes = 0;
  /** How fast admitted requests end while the batch is full: the Retry-After of a refusal. */
  private readonly drain = new DrainRate();
  private looping = false;
  private steps = 0;
  private tokens = 0;
  private maxBatchSeen = 0;
  private preemptions = 0;
  private mixedSteps = 0;
  private prefillTokens = 0;
  /** Sequences of requests in this decode and not yet released (see adopt / release). */
  private liveSequences = 0;
  /** Requests refused with 429 queue_full for want of a place, since the start. */
  rejected = 0;
  /** When each key last had a sequence join the batch (a join counter): the round-robin turn. */
  private readonly lastJoined = new Map<string, number>();
  private joins = 0;

  constructor(
    private readonly engine: Engine,
    readonly options: SchedulerOptions,
    private readonly log: Logger,
  ) {}

  /** Throws 429 queue_full when every place (batch + queue) is taken. */
  checkPlace(): void {
    const { maxBatch, maxQueue } = this.options;
    if (this.admitted >= maxBatch + maxQueue) {
      this.rejected++;
      const retry = this.drain.retryAfterSeconds(this.admitted - (maxBatch + maxQueue) + 1);
      throw queueFull(
        `decode is full: ${this.admitted} requests admitted (batch ${maxBatch} + queue ${maxQueue}); retry in ${retry} s`,
        retry,
      );
    }
  }

  /** Reserves a place and `bytes` of KV memory, or throws 429. */
  admit(bytes: number): Reservation {
    const { kvBudgetBytes } = this.options;
    this.checkPlace();
    if (this.reservedBytes + bytes > kvBudgetBytes) {
      throw retryAfter(
        this.drain.retryAfterSeconds(1),
        new ApiError(
          429,
          "kv_memory_full",
          `not enough KV memory: this request needs ${bytes} bytes, ${kvBudgetBytes - this.reservedBytes} of ${kvBudgetBytes} are free; retry later or ask for fewer tokens`,
        ),
      );
    }
    this.admitted++;
    this.reservedBytes += bytes;
    return new Reservation(this, bytes);
  }

  unreserve(bytes: number): void {
    this.drain.freed(this.admitted >= this.options.maxBatch);
    this.admitted--;
    this.reservedBytes -= bytes;
  }

  /** A new sequence for a request, counted here until release() (or the batch) frees it. */
  createSequence(capacity: number): NativeSequence {
    return this.adopt(this.engine.createSequence(capacity));
  }

  /** Counts a sequence made elsewhere (an in-process prefill's) as this decode's. */
  adopt(seq: NativeSequence): NativeSequence {
    this.liveSequences++;
    return seq;
  }

  /** Frees a counted sequence that never joined the batch. */
  release(seq: NativeSequence): void {
    seq.release();
    this.liveSequences--;
  }

  /** Hands a loaded sequence to the batch; it is released when it finishes or is cancelled. */
  start(slot: Slot): void {
    slot.wait();
    this.waiting.push(slot);
    if (!this.looping) void this.loop();
  }

  /**
   * Appends `tokens` to `seq` in the coming steps and resolves with the next-token logits; rejects
   * with the signal's reason if it fires first (the sequence then holds part of the prompt).
   * Throws at once when the tokens do not fit the sequence or it already has a prompt queued.
   */
  prefill(seq: NativeSequence, tokens: ArrayLike<number>, signal?: AbortSignal): Promise<Float32Array> {
    this.engine.checkAppend(seq, tokens.length);
    if (this.prefills.some((j) => j.seq === seq)) throw new Error("prefill: this sequence already has a prompt in the steps");
    signal?.throwIfAborted();
    return new Promise((resolve, reject) => {
      const logits = new Float32Array(this.engine.model.config.nVocab);
      this.prefills.push({ seq, tokens: Int32Array.from(tokens), done: 0, logits, signal, resolve, reject });
      if (!this.looping) void this.loop();
    });
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
      preemptions: this.preemptions,
      prefills: this.prefills.length,
      mixed_steps: this.mixedSteps,
      prefill_tokens: this.prefillTokens,
    };
  }

  /** Takes `slot` out of the batch and frees its sequence; `keep`: the slot's owner keeps the sequence (a session parks it). */
  private remove(slot: Slot, keep = false): void {
    if (slot.ended) return;
    slot.ended = true;
    for (const list of [this.running, this.waiting]) {
      const i = list.indexOf(slot);
      if (i >= 0) list.splice(i, 1);
    }
    if (!keep) {
      this.release(slot.seq);
      return;
    }
    this.liveSequences--;
    slot.kept = true;
  }

  /**
   * The next sequence to join the batch: the oldest waiting one of the key that joined least
   * recently (round robin over keys), so one key's burst does not hold the others' behind it.
   */
  private nextWaiting(): Slot {
    let best = 0;
    let bestTurn = Infinity;
    for (let i = 0; i < this.waiting.length; i++) {
      const turn = this.lastJoined.get(this.waiting[i]!.tenant) ?? -1;
      if (turn < bestTurn) {
        best = i;
        bestTurn = turn;
      }
    }
    const [slot] = this.waiting.splice(best, 1);
    this.lastJoined.delete(slot!.tenant); // re-inserted last: the map stays small and ordered
    this.lastJoined.set(slot!.tenant, this.joins++);
    if (this.lastJoined.size > 4 * (this.options.maxBatch + this.options.maxQueue)) {
      this.lastJoined.delete(this.lastJoined.keys().next().value!); // forget the key that joined longest ago
    }
    return slot!;
  }

  /**
   * Fills the batch for the next step: free places to waiting sequences (nextWaiting), then, while
   * a key waits holding at least two places fewer than the key holding the most, that key's newest
   * sequence pauses and gives its place (max-min fair shares; a difference of one never moves a
   * place, so shares settle instead of swapping every step).
   */
  private fillBatch(): void {
    const join = () => {
      const slot = this.nextWaiting();
      slot.join();
      this.running.push(slot);
    };
    while (this.running.length < this.options.maxBatch && this.waiting.length > 0) join();
    for (;;) {
      const held = new Map<string, number>();
      for (const s of this.running) held.set(s.tenant, (held.get(s.tenant) ?? 0) + 1);
      let heaviest: string | undefined;
      for (const [tenant, n] of held) if (heaviest === undefined || n > held.get(heaviest)!) heaviest = tenant;
      const starved = this.waiting.find((s) => (held.get(s.tenant) ?? 0) + 1 < held.get(heaviest!)!);
      if (heaviest === undefined || starved === undefined) return;
      const victim = this.running.findLast((s) => s.tenant === heaviest)!;
      this.running.splice(this.running.indexOf(victim), 1);
      victim.wait();
      this.waiting.push(victim);
      this.preemptions++;
      // The place goes to the starved key: its turn comes before the victim's key (which joined last).
      this.lastJoined.delete(starved.tenant);
      join();
    }
  }

  /** The prompt chunks the next step carries beside `decodes` decode tokens. */
  private planPrefill(decodes: Slot[]): PrefillChunk[] {
    for (const job of this.prefills.filter((j) => j.signal?.aborted)) this.endPrefill(job, job.signal!.reason);
    const now = performance.now();
    const pace = this.options.tpotTargetMs;
    let room = prefillChunkTokens({
      // A slot's text holds every token sent so far, the first included: the next is token text.count.
      slackMs: decodes.map((s) => s.firstTokenAt + s.text.count * pace - now),
      costs: this.costs,
      maxTokens: Math.max(1, this.engine.ubatch - decodes.length),
      minChunk: this.options.minPrefillChunk ?? 16,
    });
    const plan: PrefillChunk[] = [];
    for (const job of this.prefills) {
      if (room <= 0) break;
      const n = Math.min(room, job.tokens.length - job.done);
      plan.push({ job, n });
      room -= n;
    }
    return plan;
  }

  private endPrefill(job: PrefillJob, error?: unknown): void {
    const i = this.prefills.indexOf(job);
    if (i < 0) return;
    this.prefills.splice(i, 1);
    if (error === undefined) job.resolve(job.logits);
    else job.reject(error);
  }

  private async loop(): Promise<void> {
    this.looping = true;
    try {
      for (;;) {
        this.fillBatch();
        const batch = this.running.slice();
        const chunks = this.planPrefill(batch);
        if (batch.length === 0 && chunks.length === 0) return;
        this.maxBatchSeen = Math.max(this.maxBatchSeen, batch.length);
        const error = await this.step(batch, chunks);
        if (error === undefined) continue;
        this.log.error({ err: error, batch: batch.length, prefillTokens: chunks.reduce((sum, c) => sum + c.n, 0) }, "engine step failed");
        if (batch.length > 0 && chunks.length > 0) {
          // The engine checks a whole batch before computing any of it (a refusal changes
          // nothing), so whose fault it was is found by running the decodes alone.
          const alone = await this.step(batch, []);
          if (alone === undefined) for (const { job } of chunks) this.endPrefill(job, error);
          else this.failDecodes(batch, alone); // the prompts stay queued and try again
        } else if (batch.length > 0) {
          this.failDecodes(batch, error);
        } else {
          for (const { job } of chunks) this.endPrefill(job, error);
        }
      }
    } finally {
      this.looping = false;
    }
  }

  /** One forward pass over `batch`'s next tokens and `chunks`; applies its results, or returns its error (nothing applied). */
  private async step(batch: Slot[], chunks: PrefillChunk[]): Promise<unknown> {
    const nVocab = this.engine.model.config.nVocab;
    const items: ForwardItem[] = batch.map((s) => ({ seq: s.seq, tokens: Int32Array.of(s.last), logits: new Float32Array(nVocab) }));
    // Only a prompt's last chunk needs logits (the next token's).
    for (const { job, n } of chunks)
      items.push({
        seq: job.seq,
        tokens: job.tokens.subarray(job.done, job.done + n),
        ...(job.done + n === job.tokens.length ? { logits: job.logits } : {}),
      });
    const prefillTokens = chunks.reduce((sum, c) => sum + c.n, 0);
    batch.forEach((s) => this.inStep.add(s));
    const t0 = performance.now();
    try {
      await this.engine.forward(items);
    } catch (error) {
      return error ?? new Error("engine step failed");
    } finally {
      batch.forEach((s) => this.inStep.delete(s));
    }
    this.costs.observe(batch.length, prefillTokens, performance.now() - t0);
    this.steps++;
    if (batch.length > 0 && prefillTokens > 0) this.mixedSteps++;
    this.prefillTokens += prefillTokens;
    for (const { job, n } of chunks) {
      job.done += n;
      if (job.done === job.tokens.length) this.endPrefill(job);
    }
    for (let i = 0; i < batch.length; i++) {
      const s = batch[i]!;
      if (s.cancelled) {
        this.remove(s);
        continue;
      }
      const id = s.sampler.sample(items[i]!.logits!);
      s.last = id;
      this.tokens++;
      const step = s.text.push(id);
      s.push({ type: "token", id, text: step.text, index: s.text.count - 1 });
      if (step.finish) {
        this.remove(s, s.keep); // before "done": whoever reads it may take the sequence at once
        s.push({ type: "done", finish: step.finish });
      }
    }
    return undefined;
  }

  private failDecodes(batch: Slot[], error: unknown): void {
    for (const s of batch) {
      s.push({ type: "error", error });
      this.remove(s);
    }
  }
}
