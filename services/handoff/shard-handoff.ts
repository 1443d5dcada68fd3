// The reader half of the shard handoff: the decode's own prompts are prefilled by a prefill
// instance (prefill-client.ts) whose chunks are loaded while it computes (streamed-load.ts), or
// after its handle with --kv-streaming false, as a client's handle always is (reader.ts). Where the
// KV cannot be had, the request's on_kv_failure decides: the failure, or the prompt prefilled here
// (in the decode steps) and the first token sampled as the prefill would have.
import type { Logger } from "pino";
import { DECODE_RING_BATCH, type NativeSequence } from "../../shared/inference/engine/engine.ts";
import type { InternalAuth } from "../../shared/platform/auth/capability.ts";
import { ApiError } from "../../shared/platform/http/errors.ts";
import type { PrefillRequest } from "../../shared/platform/http/wire.ts";
import type { ServiceMetrics } from "../../shared/platform/metrics/metrics.ts";
import type { ResolvedPolicy } from "../../shared/inference/policy/request.ts";
import { applyPolicy, loadPromptState } from "../policy.ts";
import type { Runtime } from "../runtime.ts";
import type { Handle, KvSummary } from "./handle.ts";
import type {
  Handover,
  HandoffReader,
  KvFailureChoice,
  LoadedKv,
  OwnRequest,
  PromptCompute,
  ReaderStatus,
  SequencePlan,
} from "./handoff.ts";
import { PeerWatch } from "./peer-watch.ts";
import { PrefillClient } from "./prefill-client.ts";
import { KvLoadError, KvLoader } from "./reader.ts";
import { StreamedLoad } from "./streamed-load.ts";
import { leftOutOf, pickFor, roundsLayoutOf, roundsLoadFor, wholePrefix } from "./round-chunks.ts";

export interface ShardReaderOptions {
  metrics: ServiceMetrics;
  /** Signs the capabilities of prefill calls and chunk reads (the services' shared secret). */
  auth: InternalAuth | undefined;
  /** The decode's own compute, for a recompute: in its steps, so the batch keeps its pace. */
  compute: PromptCompute;
}

export class ShardHandoff implements HandoffReader {
  private readonly loader: KvLoader;
  private readonly client: PrefillClient;
  /** One watch over the peers the decode calls (prefill instances, chunk owners): a call to a peer the registry declares dead is aborted at once. */
  private readonly peers: PeerWatch;
  private recomputed = 0;

  constructor(
    private readonly rt: Runtime,
    private readonly opts: ShardReaderOptions,
  ) {
    this.peers = new PeerWatch(rt);
    this.loader = new KvLoader(rt, opts.metrics, opts.auth, this.peers);
    this.client = new PrefillClient(rt, opts.auth, this.peers);
  }

  get prefillCalls() {
    return this.client.queue;
  }

  async prefill(body: PrefillRequest, own: OwnRequest, signal: AbortSignal, log: Logger): Promise<Handover> {
    if (!this.rt.config.kvStreaming) return this.accept(await this.client.prefill(body, signal, own.tenant), own.onKvFailure);
    const stream = new StreamedLoad(this.rt, this.loader, own.sequencePlan, signal);
    // Asked to fail fast, a chunk that cannot be loaded stops the prefill call at once.
    const callSignal = own.onKvFailure === "recompute" ? signal : AbortSignal.any([signal, stream.failed.signal]);
    let handle: Handle;
    try {
      handle = await this.client.prefill(body, callSignal, own.tenant, stream.progress);
      stream.finish(handle);
    } catch (e) {
      if (!(stream.start && own.onKvFailure === "recompute" && !signal.aborted && prefillDied(e))) {
        await stream.dispose();
        throw stream.loadError && !signal.aborted ? stream.loadError : e;
      }
      log.warn({ err: (e as Error).message }, "the prefill died mid-stream; recomputing the prompt locally");
      try {
        handle = await stream.recomputeHandle(this.opts.compute, e, signal);
        this.recomputed++;
      } catch (err) {
        await stream.dispose();
        throw signal.aborted ? signal.reason : err;
      }
    }
    return new ShardHandover(this.rt, handle, this.load(handle, own.onKvFailure), stream);
  }

  accept(handle: Handle, onKvFailure: KvFailureChoice): Handover {
    return new ShardHandover(this.rt, handle, this.load(handle, onKvFailure));
  }

  /** Loads `handle`'s KV into a sequence; a load that fails is recomputed when the request asked. */
  private load(handle: Handle, onKvFailure: KvFailureChoice): LoadKv {
    return async (seq, loading, policy, signal, log) => {
      try {
        if (loading) return await loading;
        const rounds = roundsLoadFor(policy, () => handle);
        return { ...(await this.loader.load(handle, seq, signal, rounds)), recomputed: false };
      } catch (e) {
        if (signal.aborted) throw signal.reason;
        const unavailable = e instanceof KvLoadError || (e instanceof ApiError && e.code === "handle_expired");
        if (!unavailable || onKvFailure !== "recompute") throw e;
        const message = (e as Error).message;
        log.warn({ requestId: handle.request_id, err: message }, "KV load failed; recomputing the prefill locally");
        const t = performance.now();
        seq.truncate(0);
        await this.opts.compute(seq, handle.prompt_token_ids, signal);
        this.recomputed++;
        return { transport: "recompute", chunks: 0, bytes: 0, ms: performance.now() - t, recomputed: true, error: message };
      }
    };
  }

  status(): ReaderStatus {
    return { kv_loads: { ...this.loader.totals }, prefill_calls: this.client.calls, recomputed: this.recomputed, in_process: 0 };
  }

  async close(): Promise<void> {
    this.peers.stop();
    await Promise.all([this.loader.close(), this.client.close()]);
  }
}

/** Loads the KV into `seq`: from the streamed load when it is `loading`, else from the shard. */
type LoadKv = (
  seq: NativeSequence,
  loading: Promise<KvSummary> | undefined,
  policy: ResolvedPolicy,
  signal: AbortSignal,
  log: Logger,
) => Promise<KvSummary>;

/** A prompt prefilled into a shard: its KV loads (or loaded while it computed) into the decode's sequence. */
class ShardHandover implements Handover {
  readonly path = "shard";
  readonly ringBatch = DECODE_RING_BATCH; // its sequences are imported into, then decoded
  private seq: NativeSequence | undefined;
  private ran: ResolvedPolicy | undefined;
  /** Set when the sequence came from the streamed load: its outcome is the load's. */
  private streamed = false;

  constructor(
    private readonly rt: Runtime,
    readonly handle: Handle,
    private readonly loadKv: LoadKv,
    private readonly stream?: StreamedLoad,
  ) {}

  get policy(): ResolvedPolicy | undefined {
    return this.stream?.policy;
  }

  sequence(plan: SequencePlan): NativeSequence {
    const loading = this.stream?.take();
    if (loading) {
      this.streamed = true;
      this.ran = this.stream!.policy;
      return (this.seq = loading);
    }
    const seq = this.rt.engine.createSequence(plan.capacity, { ringBatch: DECODE_RING_BATCH }); // imported, then decoded
    try {
      applyPolicy(this.rt, seq, plan.policy); // the engine's one validation: 400 before the handle is taken
    } catch (e) {
      seq.release();
      throw e;
    }
    this.ran = plan.policy;
    return (this.seq = seq);
  }

  async load(signal: AbortSignal, log: Logger): Promise<LoadedKv> {
    const seq = this.seq!;
    const kv = await this.loadKv(seq, this.streamed ? this.stream!.result() : undefined, this.ran!, signal, log);
    // The KV is the decode's now: the prefill's shard space can be reclaimed.
    await this.rt.registry.chunks.releaseRequest(this.handle.request_id);
    if (kv.recomputed) return { kv, warnings: [] }; // the prompt computed here, its state and pick with it
    // An import needs the prefill's prompt state, and under Round Attention its pick: the rounds
    // the load brought above the watershed are the ones attended.
    const missing = loadPromptState(seq, this.ran!, this.handle.prompt_state);
    const picked = pickFor(this.ran, this.handle);
    if (!picked) return { kv, warnings: missing ? [missing] : [] };
    try {
      seq.setRoundPick([...picked]);
    } catch (e) {
      if (e instanceof RangeError) throw new ApiError(400, "invalid_request", `handle.rounds_picked: ${e.message}`, "handle.rounds_picked");
      throw e;
    }
    const n = this.handle.prompt_tokens;
    const layout = roundsLayoutOf(this.ran)!;
    return { kv, warnings: missing ? [missing] : [], wholeTokens: wholePrefix(n, leftOutOf(layout, n, picked)) };
  }

  async dispose(): Promise<void> {
    await this.stream?.dispose();
  }
}

/** Whether a failure of the prefill call is the prefill dying (not the client's error, not a 4xx). */
function prefillDied(e: unknown): boolean {
  return e instanceof ApiError && e.code === "prefill_failed";
}
