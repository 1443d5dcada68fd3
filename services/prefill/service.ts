// The prefill service: full-attention prefill of a prompt, its KV written as layer-packed chunks
// (one per layer group per token block) into this instance's shard and recorded two-phase in the
// registry, and a handle that tells a decode where to find it. Blocks are written while the
// engine computes the next micro-batch, so the handle is ready right after the last forward pass.
import { randomUUID } from "node:crypto";
import path from "node:path";
import type { Logger } from "pino";
import type { NativeSequence } from "../../shared/inference/engine/engine.ts";
import { Sampler, validateSampling } from "../../shared/inference/engine/sampler.ts";
import { safeErrorMessage } from "../../shared/platform/http/error-log.ts";
import { ApiError } from "../../shared/platform/http/errors.ts";
import { MAX_PROMPT_STATE_BYTES, type Handle, type PrefillRequest, type PromptHandle } from "../../shared/platform/http/wire.ts";
import { PrefixHasher } from "../handoff/format/chunk-key.ts";
import { LOCAL_TENANT } from "../../shared/platform/auth/api-keys.ts";
import { chunkKeySalt, namespacedRequestId } from "../../shared/platform/auth/tenant.ts";
import { kvShape, tokenBlocks, type KvShape } from "../handoff/format/seq-io.ts";
import { Shard, shardFileName } from "../handoff/shard/shard.ts";
import { decideAdmission, PrefillThroughput } from "../../shared/platform/metrics/admission.ts";
import { ServiceMetrics } from "../../shared/platform/metrics/metrics.ts";
import { RegistryError } from "../../shared/platform/registry/registry.ts";
import { UcxShardExposure, loadUcx, ucxAvailable } from "../handoff/transport/ucx.ts";
import { Membership } from "../membership.ts";
import { policyKind } from "../../shared/inference/policy/request.ts";
import { applyPolicy, checkPolicyBeforeWork, planPolicy, prefillObserverPolicy, resolveRequestPolicy, type PlannedPolicy, type ResolvedPolicy } from "../policy.ts";
import { checkContext, defaultMaxTokens, encodePrompt, sloTargets, type Runtime } from "../runtime.ts";
import { ChunkWriter, planChunks, SHARD_ALIGN, type WriteResult } from "../handoff/writer.ts";
import { FairQueue } from "../../shared/platform/queue/fair-queue.ts";
import { ShardQuota } from "../handoff/shard/shard-quota.ts";
import { RequestOutcomes } from "../request-outcomes.ts";
import { Sweeper } from "../handoff/sweeper.ts";
import { announceWrites, type HandleProgress } from "../handoff/handle-stream.ts";
import { faultPoint } from "../fault-points.ts";
import { FailureLog } from "../../shared/platform/failure-log.ts";

/** Computes a micro-batch of a prompt into `seq` and returns the next-token logits. */
export type PrefillCompute = (seq: NativeSequence, tokens: ArrayLike<number>, signal: AbortSignal) => Promise<Float32Array>;

/** A prefill admitted (queued or running): its prompt tokens and how many are computed. */
interface PrefillWork {
  tokens: number;
  done: number;
  /** Time spent in forward passes (the rest of a prefill is its fixed cost). */
  computeMs: number;
}

/** A prompt checked and tokenized, before it has a place. */
interface PreparedPrompt {
  tokens: number[];
  sampling: { temperature: number; topK: number; topP: number; seed: number };
  /** The answer's planned length: max_tokens, or the decode's default. */
  maxTokens: number;
  roundStarts?: number[];
}

export interface PrefillStatus {
  state: string;
  instance_id: string;
  shard: { id: string; epoch: number; bytes: number; bytes_used: number; bytes_free: number; largest_free: number } | null;
  prefills_running: number;
  prefills_queued: number;
  kv_bytes_in_flight: number;
  totals: { prefills: number; prompt_tokens: number; chunks_written: number; chunks_reused: number; bytes_written: number; ranges_reclaimed: number };
}

export class PrefillService {
  private shard: Shard | undefined;
  /** The shard's pages mapped for UCX readers, with its endpoint in the registry. */
  private ucx: UcxShardExposure | undefined;
  private membership: Membership | undefined;
  private reaper: NodeJS.Timeout | undefined;
  private reaping: Promise<void> | undefined;
  private sweepTimer: NodeJS.Timeout | undefined;
  private sweeping: Promise<void> | undefined;
  private readonly sweepLog: FailureLog;
  readonly sweeper: Sweeper;
  /** How failed prefills end in the registry, retried while it cannot be reached. */
  readonly outcomes: RequestOutcomes;
  private state: "starting" | "ready" | "draining" | "stopped" = "starting";
  /** Prefill places, fair across keys: `--max-prefills` running, `--max-prefill-queue` waiting. */
  private readonly gate: FairQueue;
  private readonly quota: ShardQuota;
  private readonly shape: KvShape;
  private kvInFlight = 0;
  /** Measured prefill throughput, and the work admitted: what SLO admission predicts TTFT from. */
  private readonly throughput = new PrefillThroughput();
  private readonly work = new Set<PrefillWork>();
  private readonly writer: ChunkWriter;
  private readonly totals = { prefills: 0, prompt_tokens: 0, chunks_written: 0, chunks_reused: 0, bytes_written: 0, ranges_reclaimed: 0 };

  constructor(
    private readonly rt: Runtime,
    readonly instanceId: string = rt.config.instanceId,
    readonly metrics: ServiceMetrics = new ServiceMetrics({ model: rt.modelId, slo: sloTargets(rt.config), processMetrics: false }),
    /** A colocated server computes prompts in the decode scheduler's steps (chunked prefill). */
    private readonly compute: PrefillCompute = (seq, tokens) => rt.engine.prefill(seq, tokens),
  ) {
    const c = rt.config;
    // One key holds all prefill places but one (when there are several): another key's prompt starts at once.
    this.gate = new FairQueue({ stage: "prefill", limit: c.maxPrefills, capacity: c.maxPrefillQueue, perTenant: Math.max(1, c.maxPrefills - 1) });
    this.sweepLog = new FailureLog(rt.log, "sweep failed");
    // Shares (and the default cap, half the shard) are for API keys; a keyless server has one
    // tenant, "local", with nobody to share the shard with. An explicit --max-shard-bytes-per-key
    // applies to all.
    this.quota = new ShardQuota(
      c.maxShardBytesPerKey ?? Math.floor(c.shardBytes / 2),
      new Set(c.maxShardBytesPerKey === undefined ? ["local"] : []),
      c.retainMs + c.heartbeatTimeoutMs,
    );
    metrics.watchRequests("prefill", () => ({ running: this.gate.running, waiting: this.gate.queued }));
    metrics.watchQueue("prefill", () => ({ queued: this.gate.queued, rejected: this.gate.rejected }));
    metrics.watchQueue("tokenize", () => ({ queued: rt.prompts.queue.queued, rejected: rt.prompts.queue.rejected }));
    metrics.watchKv("shard", () => ({ inUse: this.shard?.bytesUsed ?? 0, capacity: this.shard?.sizeBytes ?? 0 }));
    metrics.watchPrefillThroughput(() => this.throughput.tokensPerSecond);
    this.shape = kvShape(rt.model.config);
    this.writer = new ChunkWriter(rt, this.shape, this.totals);
    this.outcomes = new RequestOutcomes(rt);
    this.sweeper = new Sweeper(
      rt.registry,
      {
        hostId: c.hostId,
        shardDir: c.shardDir,
        // Twice the timeout: decodes first see the owner's chunks as failed (502, or a recompute).
        graceMs: 2 * c.heartbeatTimeoutMs,
        unclaimedMs: c.retainMs + c.heartbeatTimeoutMs,
        retentionMs: c.requestRetentionMs,
      },
      rt.log,
    );
  }

  /** The shard id is the instance id: stable across restarts, so a restart starts its next epoch. */
  get shardId(): string {
    return this.instanceId;
  }
  get ready(): boolean {
    return this.state === "ready";
  }

  /** Registers the instance, starts a new shard epoch, and begins heartbeats and reaping. */
  async start(baseUrl: string): Promise<void> {
    this.membership = new Membership(this.rt, "prefill", this.instanceId, baseUrl, () => this.newEpoch());
    await this.membership.start();
    await this.newEpoch();
    const reaping = new FailureLog(this.rt.log, "reaper failed");
    this.reaper = setInterval(
      () =>
        void this.reap().then(
          () => reaping.succeeded(),
          (err: unknown) => reaping.failed(err),
        ),
      this.rt.config.reapMs,
    );
    this.reaper.unref();
    this.sweepTimer = setInterval(() => void this.sweep(), this.rt.config.sweepMs);
    this.sweepTimer.unref();
    this.state = "ready";
    this.rt.log.info({ shard: this.shardId, epoch: this.shard!.epoch, bytes: this.shard!.sizeBytes, path: this.shard!.path }, "prefill ready");
  }

  private async newEpoch(): Promise<void> {
    const { shardDir } = this.rt.config;
    const sizeBytes = Math.ceil(this.rt.config.shardBytes / SHARD_ALIGN) * SHARD_ALIGN;
    const row = await this.rt.registry.shards.create({
      id: this.shardId,
      instanceId: this.instanceId,
      sizeBytes,
      pathFor: (epoch) => path.join(shardDir, shardFileName(this.shardId, epoch)),
    });
    const shard = await Shard.create({ shardId: this.shardId, epoch: row.epoch, sizeBytes, dir: shardDir, alignment: SHARD_ALIGN });
    let ucx: UcxShardExposure | undefined;
    try {
      await this.rt.registry.shards.recordFile(this.shardId, row.epoch, shard.fileId);
      ucx = await this.publishUcx(shard);
    } catch (err) {
      ucx?.close();
      await shard.destroy();
      throw err;
    }
    const old = this.shard;
    const oldUcx = this.ucx;
    this.shard = shard;
    this.ucx = ucx;
    oldUcx?.close(); // before the pages go: UCX readers of the old epoch then see it gone
    await old?.destroy();
  }

  /**
   * Maps the shard for UCX readers and publishes the endpoint, where the UCX transport is built and
   * the mode allows it (the first publication loads the UCX addon). Under auto a UCX that cannot be
   * loaded is logged and left out; under ucx it is an error.
   */
  private async publishUcx(shard: Shard): Promise<UcxShardExposure | undefined> {
    const mode = this.rt.config.transport;
    if (mode === "ucx" && !ucxAvailable()) throw new Error("--transport ucx: the UCX transport is not built (install libucx-dev and run \"npm run build:native\" with CTXBANK_UCX=AUTO or ON)");
    if ((mode !== "ucx" && mode !== "auto") || !ucxAvailable()) return undefined;
    if (mode === "auto") {
      try {
        loadUcx();
      } catch (err) {
        this.rt.log.warn({ err }, "--transport auto: the UCX transport cannot be used; publishing no UCX endpoint");
        return undefined;
      }
    }
    const exposure = UcxShardExposure.create(shard);
    try {
      await this.rt.registry.shards.recordUcxEndpoint(shard.shardId, shard.epoch, exposure.endpoint);
    } catch (err) {
      exposure.close();
      throw err;
    }
    return exposure;
  }

  /** For the chunk route: this instance's current shard. */
  chunkSource(shardId: string): Shard | undefined {
    return shardId === this.shardId ? this.shard : undefined;
  }

  /** Returns expired and released chunks' ranges to the shard's allocator. */
  reap(): Promise<void> {
    this.reaping ??= (async () => {
      const shard = this.shard;
      if (!shard) return;
      const { expired, freed } = await this.rt.registry.chunks.reapExpired({ shardId: shard.shardId, epoch: shard.epoch });
      this.metrics.leaseExpiries(expired);
      for (const f of freed) {
        try {
          shard.free(f.offset);
          this.totals.ranges_reclaimed++;
        } catch (err) {
          this.rt.log.error({ err, offset: f.offset }, "reaper freed a range the shard does not hold");
        }
      }
      if (expired > 0 || freed.length > 0) this.rt.log.debug({ expired, freed: freed.length }, "reaped chunks");
    })().finally(() => (this.reaping = undefined));
    return this.reaping;
  }

  /** Sweeps dead instances' shard files, chunks and open requests, and prunes old rows (see sweeper.ts). */
  sweep(): Promise<void> {
    this.sweeping ??= this.sweeper
      .sweep()
      .then(
        () => this.sweepLog.succeeded(),
        (err: unknown) => this.sweepLog.failed(err),
      )
      .finally(() => (this.sweeping = undefined));
    return this.sweeping;
  }

  status(): PrefillStatus {
    const s = this.shard;
    return {
      state: this.state,
      instance_id: this.instanceId,
      shard: s ? { id: s.shardId, epoch: s.epoch, bytes: s.sizeBytes, bytes_used: s.bytesUsed, bytes_free: s.bytesFree, largest_free: s.largestFree } : null,
      prefills_running: this.gate.running,
      prefills_queued: this.gate.queued,
      kv_bytes_in_flight: this.kvInFlight,
      totals: { ...this.totals },
    };
  }

  /** Prefills `req` for `tenant` (the API key id, "local" keyless): its place in the fair queue, its shard cap, and its own request ids and chunk keys (shared/platform/auth/tenant.ts). */
  async prefill(req: PrefillRequest, signal: AbortSignal, log: Logger, tenant: string = LOCAL_TENANT, progress?: HandleProgress): Promise<Handle> {
    const t0 = performance.now();
    const p = await this.prepare(req, tenant, signal);
    // The engine validates the policy once, here: the layer groups the chunks are packed by.
    const policy = planPolicy(this.rt, req.policy, p.tokens.length, p.maxTokens, p.roundStarts);
    return this.inPlace(p.tokens.length, tenant, signal, async (work, queueMs) => ({
      ...(await this.run(req, tenant, p.tokens, policy, p.sampling, signal, log, t0, work, progress)),
      queue_ms: queueMs,
    }));
  }

  /**
   * Prefills `req` for a decode in this process (services/handoff/in-process.ts): into the
   * decode's own sequence, with room for the answer and the decode policy set before the prompt,
   * so that whatever the policy keeps of the prompt's queries is observed. No chunk is written.
   * The caller owns the returned sequence.
   */
  async prefillInProcess(req: PrefillRequest, signal: AbortSignal, log: Logger, tenant: string = LOCAL_TENANT): Promise<{ handle: PromptHandle; seq: NativeSequence }> {
    const t0 = performance.now();
    const p = await this.prepare(req, tenant, signal);
    const policy = resolveRequestPolicy(this.rt, req.policy, p.tokens.length, p.maxTokens, p.roundStarts);
    return this.inPlace(p.tokens.length, tenant, signal, (work, queueMs) => this.runInProcess(req, tenant, p, policy, signal, log, { t0, work, queueMs }));
  }

  /**
   * Everything checked before any work (503 unless ready, sampling, the policy's limits), then the
   * prompt tokenized (off the event loop, in the tenant's turn, stopping past the context), with a
   * chat's rounds found in the same pass, and checked against the context.
   */
  private async prepare(req: PrefillRequest, tenant: string, signal: AbortSignal): Promise<PreparedPrompt> {
    if (this.state !== "ready") {
      throw new ApiError(503, this.state === "draining" ? "draining" : "not_ready", `the prefill service is ${this.state}`);
    }
    const sampling = validateSampling({ temperature: req.temperature, topK: req.top_k, topP: req.top_p, ...(req.seed === undefined ? {} : { seed: req.seed }) });
    checkPolicyBeforeWork(this.rt, req.policy, { maxTokens: req.max_tokens, chat: req.messages !== undefined });
    const wantsRounds = policyKind(req.policy ?? this.rt.config.policy) === "rounds";
    const { ids: tokens, roundStarts } = await encodePrompt(this.rt, req, { rounds: wantsRounds && req.messages !== undefined, tenant, signal }).catch((e: unknown) => {
      throw signal.aborted && !(e instanceof ApiError) ? clientClosed() : e;
    });
    checkContext(this.rt.engine.maxContext, tokens.length, req.max_tokens);
    // The length the decode plans for (SCOPE's T is max_tokens, or the decode's default).
    const maxTokens = req.max_tokens ?? defaultMaxTokens(this.rt.engine.maxContext, tokens.length);
    return { tokens, sampling, maxTokens, ...(roundStarts ? { roundStarts } : {}) };
  }

  /** Runs `run` in a prefill place (SLO admission, then the fair queue), counting the work and its throughput. */
  private async inPlace<T>(promptTokens: number, tenant: string, signal: AbortSignal, run: (work: PrefillWork, queueMs: number) => Promise<T>): Promise<T> {
    this.admit(promptTokens);
    const work: PrefillWork = { tokens: promptTokens, done: 0, computeMs: 0 };
    this.work.add(work);
    try {
      const queuedAt = performance.now();
      const leave = await this.gate.enter(tenant, signal).catch((e: unknown) => {
        throw e instanceof ApiError ? e : clientClosed();
      });
      const startedAt = performance.now();
      try {
        const out = await run(work, startedAt - queuedAt);
        this.totals.prefills++;
        this.totals.prompt_tokens += promptTokens;
        this.throughput.observe(promptTokens, work.computeMs / 1000, (performance.now() - startedAt) / 1000);
        return out;
      } finally {
        leave();
      }
    } finally {
      this.work.delete(work);
    }
  }

  /** SLO admission: 429 slo_unattainable when this prompt's predicted TTFT misses the TTFT objective by more than the margin. */
  private admit(promptTokens: number): void {
    const { admission, sloTtftMs, admissionMargin } = this.rt.config;
    let tokensAhead = 0;
    for (const w of this.work) tokensAhead += w.tokens - w.done;
    const { tokensPerSecond, overheadSeconds } = this.throughput;
    const d = decideAdmission(admission, sloTtftMs, admissionMargin, { prefillsAhead: this.work.size, tokensAhead, promptTokens, tokensPerSecond, overheadSeconds });
    if (d.admit) return;
    throw new ApiError(
      429,
      "slo_unattainable",
      `predicted time to first token ${Math.round(d.predictedMs!)} ms (${this.work.size} prefills with ${tokensAhead} prompt tokens ahead + ${promptTokens} at ~${Math.round(tokensPerSecond!)} tokens/s) ` +
        `exceeds the ${sloTtftMs} ms objective by more than ${Math.round(admissionMargin * 100)}%; retry later or elsewhere`,
    );
  }

  private async run(
    req: PrefillRequest,
    tenant: string,
    tokens: number[],
    policy: PlannedPolicy,
    sampling: { temperature: number; topK: number; topP: number; seed: number },
    signal: AbortSignal,
    log: Logger,
    t0: number,
    work: PrefillWork,
    progress?: HandleProgress,
  ): Promise<Handle> {
    const { registry, engine, model, config } = this.rt;
    const shard = this.shard!;
    const n = tokens.length;
    const requestId = await this.createRequest(req, tenant, n);

    const groups = policy.layerGroups;
    const blocks = tokenBlocks(n, config.blockTokens);
    const plan = planChunks(blocks, groups, model.fingerprint, this.shape);
    const kvBytes = n * model.config.kvBytesPerToken;
    const writes: Promise<WriteResult>[] = [];
    const wire = { temperature: sampling.temperature, top_p: sampling.topP, top_k: sampling.topK, seed: sampling.seed };
    // Streaming (services/handoff/handle-stream.ts): each chunk is announced as it commits.
    const announce = announceWrites(progress, () => ({
      request_id: requestId, shard_id: shard.shardId, shard_epoch: shard.epoch, model_fingerprint: model.fingerprint, prompt_tokens: n, prompt_token_ids: tokens,
      layer_groups: groups, policy: policy.spec, block_tokens: config.blockTokens, sampling: wire, total_chunks: plan.flat().length,
    }));
    let seq: ReturnType<typeof engine.createSequence> | undefined;
    this.kvInFlight += kvBytes;
    try {
      await this.writer.reserve(plan.flat(), shard, () => this.reap(), tenant, this.quota);
      await registry.requests.mark(requestId, { event: "prefill_start" });
      seq = engine.createSequence(n);
      // Set before the prompt, the decode's policy derives what it needs of the prompt as it is
      // cached (exported with the handle); prefill attention is full either way.
      applyPolicy(this.rt, seq, prefillObserverPolicy(policy.policy));
      seq.preparePromptStateExport();
      const hasher = new PrefixHasher(model.fingerprint, { salt: chunkKeySalt(tenant) });
      const ubatch = engine.ubatch;
      let logits: Float32Array | undefined;
      let next = 0;
      for (let i = 0; i < n; i += ubatch) {
        const batch = tokens.slice(i, i + ubatch);
        const computeStart = performance.now();
        logits = await this.compute(seq, batch, signal);
        work.computeMs += performance.now() - computeStart;
        work.done += batch.length;
        this.metrics.prefillTokens(batch.length);
        if (signal.aborted) throw clientClosed();
        // Blocks whose tokens are all computed are final (causal attention): write them now.
        while (next < blocks.length && blocks[next]!.tokenEnd <= seq.nPast) {
          const b = blocks[next]!;
          if (next > 0 && next === blocks.length - 1) await faultPoint("prefill.last", log);
          hasher.push(tokens.slice(b.tokenStart, b.tokenEnd));
          for (const p of plan[next]!) writes.push(this.writer.write(p, hasher.keyFor(b.tokenStart, p.meta.layerIds), requestId, req, seq, shard).then(announce));
          next++;
        }
      }
      const firstToken = new Sampler(sampling).sample(logits!);
      let promptState = seq.exportPromptState();
      if (promptState && promptState.byteLength > MAX_PROMPT_STATE_BYTES) {
        log.warn({ requestId, bytes: promptState.byteLength, max: MAX_PROMPT_STATE_BYTES }, "the prompt state is larger than a handle carries; the decode will do without it");
        promptState = null;
      }
      const results = await Promise.all(writes);
      const failed = results.find((r): r is { error: unknown } => "error" in r);
      if (failed) throw failed.error;
      if (signal.aborted) throw clientClosed();
      // Chunk ids group-major (layer group, then token block): the order decode imports them in.
      const ids = results as { id: string }[];
      const chunkIds = groups.flatMap((_, g) => blocks.map((_, b) => ids[b * groups.length + g]!.id));
      // The retention runs from the handle (the reaper kept them while we prefilled).
      const live = await registry.chunks.retainFromHandle([...new Set(chunkIds)], config.retainMs);
      if (live !== new Set(chunkIds).size) throw new Error(`${new Set(chunkIds).size - live} of the request's chunks were reclaimed during its prefill`);
      await registry.requests.mark(requestId, { event: "prefill_end" });
      const prefillMs = performance.now() - t0;
      log.info({ requestId, promptTokens: n, chunks: chunkIds.length, ms: Math.round(prefillMs) }, "prefilled");
      return {
        request_id: requestId,
        first_token: firstToken,
        chunk_ids: chunkIds,
        shard_id: shard.shardId,
        shard_epoch: shard.epoch,
        model_fingerprint: model.fingerprint,
        prompt_tokens: n,
        prompt_token_ids: tokens,
        layer_groups: groups,
        policy: policy.spec,
        resolved_policy: policy.resolved,
        ...(promptState ? { prompt_state: Buffer.from(promptState.buffer, promptState.byteOffset, promptState.byteLength).toString("base64") } : {}),
        block_tokens: config.blockTokens,
        sampling: wire,
        prefill_ms: prefillMs,
        expires_at: new Date(Date.now() + config.retainMs).toISOString(),
      };
    } catch (err) {
      await Promise.allSettled(writes);
      for (const p of plan.flat()) {
        if (p.state === "reserved") {
          shard.free(p.offset);
          p.state = "freed";
        }
      }
      const cancelled = signal.aborted;
      await this.outcomes.record(requestId, { state: cancelled ? "cancelled" : "failed", error: safeErrorMessage(err, 4000) }, log);
      if (cancelled) throw clientClosed();
      if (err instanceof RegistryError && err.code === "stale_epoch") {
        throw new ApiError(503, "not_ready", "the prefill instance restarted its shard during the request; retry", null, undefined, { cause: err });
      }
      throw err;
    } finally {
      seq?.release(); // nothing reads the cache any more: every write has settled
      this.kvInFlight -= kvBytes;
    }
  }

  /** The in-process prefill: the prompt computed into the decode's sequence, which is handed over as it is. */
  private async runInProcess(
    req: PrefillRequest,
    tenant: string,
    p: PreparedPrompt,
    policy: ResolvedPolicy,
    signal: AbortSignal,
    log: Logger,
    at: { t0: number; work: PrefillWork; queueMs: number },
  ): Promise<{ handle: PromptHandle; seq: NativeSequence }> {
    const { registry, engine, model } = this.rt;
    const n = p.tokens.length;
    const seq = engine.createSequence(n + p.maxTokens);
    let handed = false;
    try {
      applyPolicy(this.rt, seq, policy.policy); // the engine's one validation of this request's policy
      const requestId = await this.createRequest(req, tenant, n);
      try {
        await registry.requests.mark(requestId, { event: "prefill_start" });
        let logits: Float32Array | undefined;
        for (let i = 0; i < n; i += engine.ubatch) {
          const batch = p.tokens.slice(i, i + engine.ubatch);
          const computeStart = performance.now();
          logits = await this.compute(seq, batch, signal);
          at.work.computeMs += performance.now() - computeStart;
          at.work.done += batch.length;
          this.metrics.prefillTokens(batch.length);
          if (signal.aborted) throw clientClosed();
        }
        const firstToken = new Sampler(p.sampling).sample(logits!);
        await registry.requests.mark(requestId, { event: "prefill_end" });
        const prefillMs = performance.now() - at.t0;
        log.info({ requestId, promptTokens: n, handoff: "in_process", ms: Math.round(prefillMs) }, "prefilled");
        handed = true;
        const { temperature, topP, topK, seed } = p.sampling;
        return {
          seq,
          handle: {
            request_id: requestId,
            first_token: firstToken,
            model_fingerprint: model.fingerprint,
            prompt_tokens: n,
            prompt_token_ids: p.tokens,
            policy: policy.spec,
            resolved_policy: policy.resolved,
            sampling: { temperature, top_p: topP, top_k: topK, seed },
            prefill_ms: prefillMs,
            queue_ms: at.queueMs,
          },
        };
      } catch (err) {
        const cancelled = signal.aborted;
        await this.outcomes.record(requestId, { state: cancelled ? "cancelled" : "failed", error: safeErrorMessage(err, 4000) }, log);
        if (cancelled) throw clientClosed();
        throw err;
      }
    } finally {
      if (!handed) seq.release();
    }
  }

  /** The request's registry row; 409 when its id was used before. */
  private async createRequest(req: PrefillRequest, tenant: string, promptTokens: number): Promise<string> {
    const requestId = namespacedRequestId(tenant, req.request_id ?? `req-${randomUUID()}`);
    try {
      await this.rt.registry.requests.create({ id: requestId, sessionId: req.session_id ?? null, roundId: req.round_id ?? null, promptTokens, prefillInstanceId: this.instanceId });
    } catch (e) {
      if (e instanceof RegistryError && e.code === "conflict") {
        throw new ApiError(409, "request_id_conflict", `request id ${req.request_id ?? requestId} was used before; pick a new one`, "request_id");
      }
      throw e;
    }
    return requestId;
  }

  /** Graceful stop, part one: refuse new prefills, let running ones finish and readers pull. */
  async drain(deadline: number): Promise<void> {
    if (this.state === "stopped") return;
    this.state = "draining";
    await this.membership?.drain();
    while (Date.now() < deadline && this.gate.running + this.gate.queued > 0) await sleep(50);
    // An unreachable registry cannot tell: stop waiting rather than fail the shutdown.
    while (Date.now() < deadline && (await this.readersOnShard().catch(() => 0)) > 0) await sleep(100);
  }

  /** Part two: retire the shard (its chunks fail: the bytes die with us), delete it, leave. */
  async stop(): Promise<void> {
    if (this.state === "stopped") return;
    this.state = "stopped";
    clearInterval(this.reaper);
    clearInterval(this.sweepTimer);
    this.outcomes.stop();
    await this.reaping?.catch(() => undefined); // its failure is the reaper's to log (start())
    await this.sweeping;
    const shard = this.shard;
    if (shard) {
      await this.rt.registry.shards
        .retire(shard.shardId, shard.epoch)
        .catch((err: unknown) => this.rt.log.warn({ err }, "could not retire the shard"));
      await this.rt.registry.chunks.reapExpired({ shardId: shard.shardId, epoch: shard.epoch }).catch((err: unknown) => this.rt.log.warn({ err }, "could not reap the shard's expired chunks"));
      this.ucx?.close();
      this.ucx = undefined;
      await shard.destroy();
      this.shard = undefined;
    }
    await this.membership?.leave();
  }

  private async readersOnShard(): Promise<number> {
    const shard = this.shard;
    if (!shard) return 0;
    return this.rt.registry.chunks.countReading({ shardId: shard.shardId, epoch: shard.epoch });
  }
}

function clientClosed(): ApiError {
  return new ApiError(499, "client_closed", "the client closed the request");
}

function sleep(ms: number): Promise<void> {
  return new Promise((r) => setTimeout(r, ms));
}
