// Decode's half of the streamed handle (services/handoff/handle-stream.ts): as soon as the prefill
// announces its start, a sequence is made (capacity and policy as decode() plans them) and the
// chunks are loaded as they commit, so only the last block's transfer is left when the handle
// (and its first token) arrives. A failure mid-stream ends as the request's on_kv_failure says:
// a fast 502 (the prefill call is aborted at once), or a local recompute.
import type { NativeSequence } from "../../shared/inference/engine/engine.ts";
import { Sampler, validateSampling } from "../../shared/inference/engine/sampler.ts";
import { ApiError } from "../../shared/platform/http/errors.ts";
import type { Handle } from "../../shared/platform/http/wire.ts";
import { ChunkFeed } from "../handoff/chunk-feed.ts";
import type { HandleProgress, HandleStart } from "../handoff/handle-stream.ts";
import { KvLoadError, type KvLoader } from "../handoff/reader.ts";
import { applyPolicy, resolveRequestPolicy } from "../policy.ts";
import { checkContext, defaultMaxTokens, type Runtime } from "../runtime.ts";
import type { DecodeScheduler } from "./scheduler.ts";

/** How a request's KV reached the decode: the transport, what moved, and whether it was recomputed. */
export interface KvSummary {
  transport: "http" | "shm" | "ucx" | "recompute" | "in_process" | "none";
  chunks: number;
  bytes: number;
  ms: number;
  recomputed: boolean;
  error?: string;
}

type Outcome = { stats: KvSummary } | { error: unknown };

export class StreamedLoad {
  readonly feed = new ChunkFeed();
  start: HandleStart | undefined;
  private seq: NativeSequence | undefined;
  private taken = false;
  private outcome: Promise<Outcome> | undefined;
  private readonly cancel = new AbortController();
  /** Aborted (with the error) when the load fails before the handle came. */
  readonly failed = new AbortController();

  constructor(
    private readonly rt: Runtime,
    private readonly loader: KvLoader,
    private readonly maxTokens: number | undefined,
    private readonly policy: Parameters<typeof resolveRequestPolicy>[1],
    private readonly signal: AbortSignal,
  ) {}

  readonly progress: HandleProgress = {
    started: (s) => this.begin(s),
    chunk: (id) => this.feed.push(id),
  };

  private begin(start: HandleStart): void {
    if (this.start) return;
    this.start = start;
    const { engine } = this.rt;
    const n = start.prompt_tokens;
    const maxTokens = this.maxTokens ?? defaultMaxTokens(engine.maxContext, n);
    try {
      checkContext(engine.maxContext, n, maxTokens);
      const { policy } = resolveRequestPolicy(this.rt, start.policy ?? this.policy, n, maxTokens);
      this.seq = engine.createSequence(n + maxTokens);
      applyPolicy(this.rt, this.seq, policy); // the engine's one validation of it
    } catch (error) {
      this.seq?.release();
      this.seq = undefined;
      this.outcome = Promise.resolve({ error });
      this.failed.abort(error);
      return;
    }
    const signal = AbortSignal.any([this.signal, this.cancel.signal]);
    this.outcome = this.loader.loadStream(this.feed, start, this.seq, signal).then(
      (stats) => ({ stats: { ...stats, recomputed: false } }),
      (error: unknown) => {
        if (!signal.aborted) this.failed.abort(error);
        return { error };
      },
    );
  }

  /** The handle came: its chunk ids end the feed. */
  finish(handle: Handle): void {
    this.feed.end(handle.chunk_ids);
  }

  /** The sequence the chunks are imported into; decode() owns it from here. */
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
   * here (in the decode steps), sample the first token as the prefill would have, and answer the
   * handle it would have sent. The load is stopped first; its sequence is reused.
   */
  async recomputeHandle(prefill: DecodeScheduler["prefill"], why: unknown, signal: AbortSignal): Promise<Handle> {
    const start = this.start!;
    this.cancel.abort(why);
    await this.outcome;
    const seq = this.seq!;
    const t0 = performance.now();
    seq.truncate(0);
    const logits = await prefill(seq, start.prompt_token_ids, signal);
    const s = start.sampling;
    const firstToken = new Sampler(validateSampling({ temperature: s.temperature, topK: s.top_k, topP: s.top_p, seed: s.seed })).sample(logits);
    const ms = performance.now() - t0;
    const { total_chunks: _, ...rest } = start;
    const message = why instanceof Error ? why.message : String(why);
    this.outcome = Promise.resolve({ stats: { transport: "recompute", chunks: 0, bytes: 0, ms, recomputed: true, error: message } });
    return { ...rest, first_token: firstToken, chunk_ids: [], prefill_ms: ms, expires_at: new Date().toISOString() };
  }

  /** Stops the load and frees the sequence unless decode() took it. */
  async dispose(): Promise<void> {
    this.cancel.abort(new ApiError(499, "client_closed", "the streamed load was abandoned"));
    this.feed.fail(this.cancel.signal.reason);
    await this.outcome;
    if (!this.taken) this.seq?.release();
    this.seq = undefined;
  }
}

/** Whether a failure of the prefill call is the prefill dying (not the client's error, not a 4xx). */
export function prefillDied(e: unknown): boolean {
  return e instanceof ApiError && e.code === "prefill_failed";
}
