// The prefill service: full-attention prefill of a prompt, its KV handed to the handoff's owner
// half as it is computed (services/handoff: layer-packed chunks in this instance's shard,
// recorded in the registry), and a handle that tells a decode where to find it. Blocks are written
// while the engine computes the next micro-batch, so the handle is ready right after the last
// forward pass. Under `serve` it also prefills for the decode in this process, into the decode's
// own sequence (prefillInProcess). A request is planned once (services/request-plan.ts) and its
// policy validated by the engine once, on the sequence that computes it.
import { randomUUID } from "node:crypto";
import type { Logger } from "pino";
import type { NativeSequence } from "../../shared/inference/engine/engine.ts";
import { Sampler } from "../../shared/inference/engine/sampler.ts";
import { safeErrorMessage } from "../../shared/platform/http/error-log.ts";
import { ApiError } from "../../shared/platform/http/errors.ts";
import { MAX_PROMPT_STATE_BYTES, type PrefillRequest } from "../../shared/platform/http/wire.ts";
import { LOCAL_TENANT } from "../../shared/platform/auth/api-keys.ts";
import { namespacedRequestId } from "../../shared/platform/auth/tenant.ts";
import { decideAdmission, PrefillThroughput } from "../../shared/platform/metrics/admission.ts";
import { ServiceMetrics } from "../../shared/platform/metrics/metrics.ts";
import { RegistryError } from "../../shared/platform/registry/registry.ts";
import { Membership } from "../membership.ts";
import { resolvedSpec, type ResolvedPolicy } from "../../shared/inference/policy/request.ts";
import { applyPolicy, layerGroupsOf, prefillObserverPolicy } from "../policy.ts";
import { planRequest, type RequestPlan } from "../request-plan.ts";
import { sloTargets, type Runtime } from "../runtime.ts";
import { FairQueue } from "../../shared/platform/queue/fair-queue.ts";
import { RequestOutcomes } from "../request-outcomes.ts";
import {
  openOwner,
  type Handle,
  type HandleProgress,
  type HandoffOwner,
  type InProcessPrefill,
  type OwnerStatus,
  type PromptCompute,
  type PromptHandle,
  type PromptHandoff,
  roundsLayoutOf,
} from "../handoff/index.ts";

/** A prefill admitted (queued or running): its prompt tokens and how many are computed. */
interface PrefillWork {
  tokens: number;
  done: number;
  /** Time spent in forward passes (the rest of a prefill is its fixed cost). */
  computeMs: number;
}

export interface PrefillStatus {
  state: string;
  instance_id: string;
  shard: OwnerStatus["shard"];
  prefills_running: number;
  prefills_queued: number;
  kv_bytes_in_flight: number;
  totals: { prefills: number; prompt_tokens: number } & OwnerStatus["totals"];
}

export class PrefillService implements InProcessPrefill {
  /** The handoff's owner half: where the prompts' KV goes (the shard, named by the instance id). */
  readonly owner: HandoffOwner;
  private membership: Membership | undefined;
  /** How failed prefills end in the registry, retried while it cannot be reached. */
  readonly outcomes: RequestOutcomes;
  private state: "starting" | "ready" | "draining" | "stopped" = "starting";
  /** Prefill places, fair across keys: `--max-prefills` running, `--max-prefill-queue` waiting. */
  private readonly gate: FairQueue;
  private kvInFlight = 0;
  /** Measured prefill throughput, and the work admitted: what SLO admission predicts TTFT from. */
  private readonly throughput = new PrefillThroughput();
  private readonly work = new Set<PrefillWork>();
  private readonly totals = { prefills: 0, prompt_tokens: 0 };

  constructor(
    private readonly rt: Runtime,
    readonly instanceId: string = rt.config.instanceId,
    readonly metrics: ServiceMetrics = new ServiceMetrics({ model: rt.modelId, slo: sloTargets(rt.config), processMetrics: false }),
    /** A colocated server computes prompts in the decode scheduler's steps (chunked prefill). */
    private readonly compute: PromptCompute = (seq, tokens) => rt.engine.prefill(seq, tokens),
  ) {
    const c = rt.config;
    // One key holds all prefill places but one (when there are several): another key's prompt starts at once.
    this.gate = new FairQueue({
      stage: "prefill",
      limit: c.maxPrefills,
      capacity: c.maxPrefillQueue,
      perTenant: Math.max(1, c.maxPrefills - 1),
    });
    metrics.watchRequests("prefill", () => ({ running: this.gate.running, waiting: this.gate.queued }));
    metrics.watchQueue("prefill", () => ({ queued: this.gate.queued, rejected: this.gate.rejected }));
    metrics.watchQueue("tokenize", () => ({ queued: rt.prompts.queue.queued, rejected: rt.prompts.queue.rejected }));
    metrics.watchPrefillThroughput(() => this.throughput.tokensPerSecond);
    this.owner = openOwner(rt, instanceId, metrics);
    this.outcomes = new RequestOutcomes(rt);
  }

  get ready(): boolean {
    return this.state === "ready";
  }

  /** Registers the instance, starts the shard's first epoch and its reaping and sweeping. */
  async start(baseUrl: string): Promise<void> {
    this.membership = new Membership(this.rt, "prefill", this.instanceId, baseUrl, undefined, () => this.owner.newEpoch());
    await this.membership.start();
    await this.owner.start();
    this.state = "ready";
  }

  status(): PrefillStatus {
    const { shard, totals } = this.owner.status();
    return {
      state: this.state,
      instance_id: this.instanceId,
      shard,
      prefills_running: this.gate.running,
      prefills_queued: this.gate.queued,
      kv_bytes_in_flight: this.kvInFlight,
      totals: { ...this.totals, ...totals },
    };
  }

  /** Prefills `req` for `tenant` (the API key id, "local" keyless): its place in the fair queue, its shard cap, and its own request ids and chunk keys (shared/platform/auth/tenant.ts). */
  async prefill(
    req: PrefillRequest,
    signal: AbortSignal,
    log: Logger,
    tenant: string = LOCAL_TENANT,
    progress?: HandleProgress,
  ): Promise<Handle> {
    const t0 = performance.now();
    const plan = await this.plan(req, tenant, signal);
    return this.inPlace(plan.tokens.length, tenant, signal, async (work, queueMs) => ({
      ...(await this.run(req, tenant, plan, signal, log, t0, work, progress)),
      queue_ms: queueMs,
    }));
  }

  /**
   * Prefills `req` for a decode in this process (services/handoff/in-process.ts): into the
   * decode's own sequence, with room for the answer and the decode policy set before the prompt,
   * so that whatever the policy keeps of the prompt's queries is observed. No chunk is written.
   * `plan`: the decode's, when it planned the request itself (a session's turn); else planned here.
   * The caller owns the returned sequence.
   */
  async prefillInProcess(
    req: PrefillRequest,
    plan: RequestPlan | undefined,
    signal: AbortSignal,
    log: Logger,
    tenant: string = LOCAL_TENANT,
  ): Promise<{ handle: PromptHandle; seq: NativeSequence; policy: ResolvedPolicy }> {
    const t0 = performance.now();
    const p = plan ?? (await this.plan(req, tenant, signal));
    return this.inPlace(p.tokens.length, tenant, signal, (work, queueMs) =>
      this.runInProcess(req, tenant, p, signal, log, { t0, work, queueMs }),
    );
  }

  /** 503 unless ready, then the request planned (services/request-plan.ts: checked before any work, tokenized, its policy resolved). */
  private plan(req: PrefillRequest, tenant: string, signal: AbortSignal): Promise<RequestPlan> {
    if (this.state !== "ready") {
      throw new ApiError(503, this.state === "draining" ? "draining" : "not_ready", `the prefill service is ${this.state}`);
    }
    return planRequest(this.rt, req, { tenant, signal }).catch((e: unknown) => {
      throw signal.aborted && !(e instanceof ApiError) ? clientClosed() : e;
    });
  }

  /** Runs `run` in a prefill place (SLO admission, then the fair queue), counting the work and its throughput. */
  private async inPlace<T>(
    promptTokens: number,
    tenant: string,
    signal: AbortSignal,
    run: (work: PrefillWork, queueMs: number) => Promise<T>,
  ): Promise<T> {
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
    const d = decideAdmission(admission, sloTtftMs, admissionMargin, {
      prefillsAhead: this.work.size,
      tokensAhead,
      promptTokens,
      tokensPerSecond,
      overheadSeconds,
    });
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
    plan: RequestPlan,
    signal: AbortSignal,
    log: Logger,
    t0: number,
    work: PrefillWork,
    progress?: HandleProgress,
  ): Promise<Handle> {
    const { registry, engine, model } = this.rt;
    const { tokens, sampling } = plan;
    const n = tokens.length;
    const kvBytes = engine.kvBytes(n);
    const wire = { temperature: sampling.temperature, top_p: sampling.topP, top_k: sampling.topK, seed: sampling.seed };
    const resolved = resolvedSpec(plan.policy);
    const seq = engine.createSequence(n);
    let requestId: string | undefined;
    let handoff: PromptHandoff | undefined;
    this.kvInFlight += kvBytes;
    try {
      // Set before the prompt, the decode's policy derives what it needs of the prompt as it is
      // cached (exported with the handle); prefill attention is full either way. The engine's one
      // validation of this sequence's policy, before the request is recorded; the layer roles it
      // reports group the chunks.
      applyPolicy(this.rt, seq, prefillObserverPolicy(plan.policy));
      const layerGroups = layerGroupsOf(this.rt, seq);
      seq.preparePromptStateExport();
      requestId = await this.createRequest(req, tenant, n);
      handoff = await this.owner.open(
        {
          requestId,
          tenant,
          tokens,
          layerGroups,
          rounds: roundsLayoutOf(plan.policy),
          sessionId: req.session_id ?? null,
          roundId: req.round_id ?? null,
          policy: plan.spec,
          resolvedPolicy: resolved,
          sampling: wire,
        },
        progress,
      );
      await registry.requests.mark(requestId, { event: "prefill_start" });
      const ubatch = engine.ubatch;
      let logits: Float32Array | undefined;
      for (let i = 0; i < n; i += ubatch) {
        const batch = tokens.slice(i, i + ubatch);
        const computeStart = performance.now();
        logits = await this.compute(seq, batch, signal);
        work.computeMs += performance.now() - computeStart;
        work.done += batch.length;
        this.metrics.prefillTokens(batch.length);
        if (signal.aborted) throw clientClosed();
        await handoff.computed(seq);
      }
      const firstToken = new Sampler(sampling).sample(logits!);
      // Round Attention: the rounds the layers above the watershed will attend, picked now so the
      // decode loads only theirs (round-chunks.ts).
      const roundsPicked = plan.policy.kind === "rounds" ? await engine.pickRounds(seq) : undefined;
      let promptState = seq.exportPromptState();
      if (promptState && promptState.byteLength > MAX_PROMPT_STATE_BYTES) {
        log.warn(
          { requestId, bytes: promptState.byteLength, max: MAX_PROMPT_STATE_BYTES },
          "the prompt state is larger than a handle carries; the decode will do without it",
        );
        promptState = null;
      }
      const placed = await handoff.finish(signal);
      await registry.requests.mark(requestId, { event: "prefill_end" });
      const prefillMs = performance.now() - t0;
      log.info({ requestId, promptTokens: n, chunks: placed.chunk_ids.length, ms: Math.round(prefillMs) }, "prefilled");
      return {
        request_id: requestId,
        first_token: firstToken,
        chunk_ids: placed.chunk_ids,
        shard_id: placed.shard_id,
        shard_epoch: placed.shard_epoch,
        model_fingerprint: model.fingerprint,
        prompt_tokens: n,
        prompt_token_ids: tokens,
        layer_groups: placed.layer_groups,
        policy: plan.spec,
        resolved_policy: resolved,
        ...(promptState
          ? { prompt_state: Buffer.from(promptState.buffer, promptState.byteOffset, promptState.byteLength).toString("base64") }
          : {}),
        block_tokens: placed.block_tokens,
        ...(roundsPicked ? { rounds_picked: roundsPicked } : {}),
        sampling: wire,
        prefill_ms: prefillMs,
        expires_at: placed.expires_at,
      };
    } catch (err) {
      await handoff?.abandon();
      const cancelled = signal.aborted;
      if (requestId !== undefined)
        await this.outcomes.record(requestId, { state: cancelled ? "cancelled" : "failed", error: safeErrorMessage(err, 4000) }, log);
      if (cancelled) throw clientClosed();
      throw err;
    } finally {
      seq.release(); // nothing reads the cache any more: every write has settled
      this.kvInFlight -= kvBytes;
    }
  }

  /** The in-process prefill: the prompt computed into the decode's sequence, which is handed over as it is. */
  private async runInProcess(
    req: PrefillRequest,
    tenant: string,
    p: RequestPlan,
    signal: AbortSignal,
    log: Logger,
    at: { t0: number; work: PrefillWork; queueMs: number },
  ): Promise<{ handle: PromptHandle; seq: NativeSequence; policy: ResolvedPolicy }> {
    const { registry, engine, model } = this.rt;
    const n = p.tokens.length;
    const seq = engine.createSequence(n + p.maxTokens);
    let handed = false;
    try {
      applyPolicy(this.rt, seq, p.policy); // the engine's one validation of this request's policy
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
          policy: p.policy,
          handle: {
            request_id: requestId,
            first_token: firstToken,
            model_fingerprint: model.fingerprint,
            prompt_tokens: n,
            prompt_token_ids: p.tokens,
            policy: p.spec,
            resolved_policy: resolvedSpec(p.policy),
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
      await this.rt.registry.requests.create({
        id: requestId,
        sessionId: req.session_id ?? null,
        roundId: req.round_id ?? null,
        promptTokens,
        prefillInstanceId: this.instanceId,
      });
    } catch (e) {
      if (e instanceof RegistryError && e.code === "conflict") {
        throw new ApiError(
          409,
          "request_id_conflict",
          `request id ${req.request_id ?? requestId} was used before; pick a new one`,
          "request_id",
        );
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
    while (Date.now() < deadline && this.gate.running + this.gate.queued > 0) await new Promise((r) => setTimeout(r, 50));
    await this.owner.drain(deadline);
  }

  /** Part two: retire the shard (its chunks fail: the bytes die with us), delete it, leave. */
  async stop(): Promise<void> {
    if (this.state === "stopped") return;
    this.state = "stopped";
    this.outcomes.stop();
    await this.owner.stop();
    await this.membership?.leave();
  }
}

function clientClosed(): ApiError {
  return new ApiError(499, "client_closed", "the client closed the request");
}
