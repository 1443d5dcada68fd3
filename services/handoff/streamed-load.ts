// The reader's half of the streamed handle (handle-stream.ts): as soon as the prefill announces its
// start, a sequence is made (capacity and policy as the decode plans them) and the chunks are
// loaded as they commit, so only the last block's transfer is left when the handle (and its first
// token) arrives. Should the prefill die after it started, the prompt can be recomputed here into
// the same sequence (shard-handoff.ts decides).
import { DECODE_RING_BATCH, type NativeSequence } from "../../shared/inference/engine/engine.ts";
import { Sampler, validateSampling } from "../../shared/inference/engine/sampler.ts";
import { ApiError } from "../../shared/platform/http/errors.ts";
import type { ResolvedPolicy } from "../../shared/inference/policy/request.ts";
import { applyPolicy } from "../policy.ts";
import type { Runtime } from "../runtime.ts";
import { ChunkFeed } from "./chunk-feed.ts";
import type { Handle, KvSummary } from "./handle.ts";
import type { HandleProgress, HandleStart } from "./handle-stream.ts";
import { KvLoadError, type KvLoader } from "./reader.ts";
import { roundsLoadFor } from "./round-chunks.ts";
import type { PlanSequence, PromptCompute } from "./handoff.ts";

type Outcome = { stats: KvSummary } | { error: unknown };

export class StreamedLoad {
  readonly feed = new ChunkFeed();
  start: HandleStart | undefined;
  /** The policy the sequence runs, set with it at the start. */
  policy: ResolvedPolicy | undefined;
  private seq: NativeSequence | undefined;
  private handle: Handle | undefined;
  private taken = false;
  private outcome: Promise<Outcome> | undefined;
  private readonly cancel = new AbortController();
  /** Aborted (with the error) when the load fails before the handle came. */
  readonly failed = new AbortController();

  constructor(
    private readonly rt: Runtime,
    private readonly loader: KvLoader,
    private readonly plan: PlanSequence,
    private readonly signal: AbortSignal,
  ) {}

  readonly progress: HandleProgress = {
    started: (s) => this.begin(s),
    chunk: (id) => this.feed.push(id),
  };

  private begin(start: HandleStart): void {
    if (this.start) return;
    this.start = start;
    try {
      const { capacity, policy } = this.plan(start);
      this.seq = this.rt.engine.createSequence(capacity, { ringBatch: DECODE_RING_BATCH }); // imported, then decoded
      applyPolicy(this.rt, this.seq, policy); // the engine's one validation of it
      this.policy = policy;
    } catch (error) {
      this.seq?.release();
      this.seq = undefined;
      this.outcome = Promise.resolve({ error });
      this.failed.abort(error);
      return;
    }
    const signal = AbortSignal.any([this.signal, this.cancel.signal]);
    const rounds = roundsLoadFor(this.policy, () => this.handle);
    this.outcome = this.loader.loadStream(this.feed, { ...start, rounds }, this.seq, signal).then(
      (stats) => ({ stats: { ...stats, recomputed: false } }),
      (error: unknown) => {
        if (!signal.aborted) this.failed.abort(error);
        return { error };
      },
    );
  }

  /** The handle came: its chunk ids end the feed (and its Round Attention pick is known). */
  finish(handle: Handle): void {
    this.handle = handle;
    this.feed.end(handle.chunk_ids);
  }

  /** The sequence the chunks are imported into; the caller owns it from here. */
  take(): NativeSequence | undefined {
    if (!this.seq) return undefined;
    this.taken = true;
    return this.seq;
  }

  /** The load's end: its summary, or its error thrown. */
  async result(): Promise<KvSummary> {
    if (!this.outcome) throw new KvLoadError("the prefill never announced its chunks", "unavailable");
    const o = await this.outcome;
    if ("error" in o) throw o.error;
    return o.stats;
  }

  /** The load failed (not cancelled) before the handle came: its error. */
  get loadError(): unknown {
    return this.failed.signal.aborted ? this.failed.signal.reason : undefined;
  }

  /**
   * The prefill died after it started and the request asked for a recompute: prefill the prompt
   * here (`compute`: in the decode steps), sample the first token as the prefill would have, and
   * answer the handle it would have sent. The load is stopped first; its sequence is reused.
   */
  async recomputeHandle(compute: PromptCompute, why: unknown, signal: AbortSignal): Promise<Handle> {
    const start = this.start!;
    this.cancel.abort(why);
    await this.outcome;
    const seq = this.seq!;
    const t0 = performance.now();
    seq.truncate(0);
    const logits = await compute(seq, start.prompt_token_ids, signal);
    const s = start.sampling;
    const firstToken = new Sampler(validateSampling({ temperature: s.temperature, topK: s.top_k, topP: s.top_p, seed: s.seed })).sample(
      logits,
    );
    const ms = performance.now() - t0;
    const { total_chunks: _, ...rest } = start;
    const message = why instanceof Error ? why.message : String(why);
    this.outcome = Promise.resolve({ stats: { transport: "recompute", chunks: 0, bytes: 0, ms, recomputed: true, error: message } });
    return { ...rest, first_token: firstToken, chunk_ids: [], prefill_ms: ms, expires_at: new Date().toISOString() };
  }

  /** Stops the load and frees the sequence unless the caller took it. */
  async dispose(): Promise<void> {
    this.cancel.abort(new ApiError(499, "client_closed", "the streamed load was abandoned"));
    this.feed.fail(this.cancel.signal.reason);
    await this.outcome;
    if (!this.taken) this.seq?.release();
    this.seq = undefined;
  }
}
