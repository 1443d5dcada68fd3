// The decode service: takes a prompt handed over by the KV handoff's reader half (its own request,
// prefilled in this process or by a prefill instance; or a client's handle), streams the handle's
// first token at once, has the handoff load the KV into the sequence, and hands the sequence to
// the continuous-batching scheduler. Every exit path — done, error, client gone — releases the
// sequence, the KV reservation and what the handoff holds, and records the outcome in the registry.
import type { Logger } from "pino";
import { Sampler, validateSampling } from "../../shared/inference/engine/sampler.ts";
import type { FinishReason } from "../../shared/inference/generate.ts";
import { safeErrorMessage } from "../../shared/platform/http/error-log.ts";
import { ApiError } from "../../shared/platform/http/errors.ts";
import { samplingOptions, type CtxbankExtension, type PrefillRequest } from "../../shared/platform/http/wire.ts";
import { ctxbankExtension } from "../../shared/platform/metrics/extension.ts";
import { ServiceMetrics } from "../../shared/platform/metrics/metrics.ts";
import { RequestClock } from "../../shared/platform/metrics/timings.ts";
import { policyFromWire, policyKind, resolvedSpec, type PolicySpec, type ResolvedPolicy } from "../../shared/inference/policy/request.ts";
import { reclaimedRows } from "../../shared/inference/policy/reclaim.ts";
import { Membership } from "../membership.ts";
import { applyPolicy, resolveRequestPolicy } from "../policy.ts";
import { checkBeforeWork, planPrompt, type RequestPlan } from "../request-plan.ts";
import { checkContext, checkTokenIds, defaultMaxTokens, encodePrompt, sloTargets, type Runtime } from "../runtime.ts";
import { LOCAL_TENANT } from "../../shared/platform/auth/api-keys.ts";
import type { InternalAuth } from "../../shared/platform/auth/capability.ts";
import { ownsRequest } from "../../shared/platform/auth/tenant.ts";
import type { NativeSequence } from "../../shared/inference/engine/engine.ts";
import { kvPool } from "../../shared/inference/engine/native.ts";
import {
  KvLoadError,
  openReader,
  type Handle,
  type Handover,
  type HandoffReader,
  type InProcessPrefill,
  type KvSummary,
  type OwnRequest,
} from "../handoff/index.ts";
import { RequestOutcomes } from "../request-outcomes.ts";
import { SessionDisk } from "../sessions/session-disk.ts";
import { SessionStore } from "../sessions/session-store.ts";
import { messageHashes, promptMessages, type HashedMessage } from "../sessions/message-hashes.ts";
import { checkPickedRounds, kvShape } from "../handoff/index.ts";
import { placePrefill, prefillLocally, type LocalPrompt, type Placement } from "./local-prefill.ts";
import { DecodeScheduler } from "./scheduler.ts";
import { Slot } from "./slot.ts";
import { TokenTextStream } from "../../shared/inference/text-stream.ts";

export interface DecodeOptions {
  maxTokens?: number | undefined;
  temperature?: number | undefined;
  top_p?: number | undefined;
  top_k?: number | undefined;
  seed?: number | undefined;
  stop?: readonly string[] | undefined;
  onKvFailure?: "fail" | "recompute" | undefined;
  /** How decode steps attend; default: the handle's policy, else the server's --policy. */
  policy?: PolicySpec | undefined;
  /** performance.now() when the request arrived (TTFT and e2e start there); default: when decoding starts. */
  arrivedAt?: number | undefined;
  /** Who the request is for (the API key's id; "local" keyless): fair queuing of its prefill call, and only its own handles can be decoded. */
  tenant?: string | undefined;
  /** The conversation this request is a turn of (the client's id, in the key's namespace): its KV is kept for the next turn. */
  session?: string | undefined;
}

/** How a turn of complete() is computed: where its prompt is prefilled, and its session. */
interface TurnPlan {
  placement: Placement;
  /** The request planned here, for the prefill in this process to compute (a session's turn in `serve`). */
  plan?: RequestPlan;
  /** When the decode computes the prompt itself. */
  local?: LocalPrompt;
  session?: { id: string; reused: number; turns: number; tokens: number[]; roundStarts: number[]; messages: HashedMessage[] };
}

export type DecodeEvent =
  /** The first token (index 0) carries the policy that runs, as a spec with every default and budget written in (resolvedSpec). */
  | { type: "token"; id: number; text: string; index: number; policy?: Exclude<PolicySpec, string> }
  | {
      type: "done";
      requestId: string;
      finish: FinishReason;
      promptTokens: number;
      completionTokens: number;
      tokenIds: number[];
      kv: KvSummary;
      ttftMs: number;
      totalMs: number;
      /** The request's own timings and SLO verdicts (what the metrics recorded for it). */
      ctxbank: CtxbankExtension;
    };

const OPEN = ["queued", "prefilling", "decoding"] as const;
/** Decodes are paced a little under the TPOT objective, leaving room for the steps' jitter. */
const TPOT_PACE = 0.8;

export class DecodeService {
  readonly scheduler: DecodeScheduler;
  /** The KV handoff's reader half: how a prefilled prompt becomes a sequence holding its KV. */
  readonly handoff: HandoffReader;
  /** How requests end in the registry, retried while it cannot be reached. */
  readonly outcomes: RequestOutcomes;
  /** Conversations' KV kept between turns (undefined with --session-bytes 0). */
  readonly sessions: SessionStore | undefined;
  private sessionSweep: NodeJS.Timeout | undefined;
  /** Whether prompts are prefilled in this process (`serve`): no prefill instance to place them on. */
  private readonly colocated: boolean;
  private membership: Membership | undefined;
  private state: "starting" | "ready" | "draining" | "stopped" = "starting";
  private readonly active = new Set<AbortController>();
  /** Requests between arrival and their last event (a prefill call's wait included): the load the router reads. */
  private requestsInFlight = 0;
  private readonly totals = { requests: 0, done: 0, cancelled: 0, failed: 0 };

  constructor(
    private readonly rt: Runtime,
    readonly instanceId: string = rt.config.instanceId,
    readonly metrics: ServiceMetrics = new ServiceMetrics({ model: rt.modelId, slo: sloTargets(rt.config), processMetrics: false }),
    /** Signs the capabilities of its prefill calls and chunk reads (the services' shared secret). */
    auth?: InternalAuth,
    /** Under `serve`: the prefill service in this process, which hands this decode's own prompts over directly. */
    inProcess?: InProcessPrefill,
  ) {
    const c = rt.config;
    this.scheduler = new DecodeScheduler(
      rt.engine,
      { maxBatch: c.maxBatch, maxQueue: c.maxQueue, kvBudgetBytes: c.kvBudgetBytes, tpotTargetMs: c.sloTpotMs * TPOT_PACE },
      rt.log,
    );
    this.handoff = openReader(rt, {
      metrics,
      auth,
      compute: (seq, tokens, signal) => this.scheduler.prefill(seq, tokens, signal),
      inProcess,
    });
    this.outcomes = new RequestOutcomes(rt);
    this.colocated = inProcess !== undefined;
    const m = rt.model.config;
    this.sessions =
      c.sessionBytes > 0
        ? new SessionStore({
            limits: { memoryBytes: c.sessionBytes, perKeyBytes: c.sessionBytesPerKey, ttlMs: c.sessionTtlMs },
            createSequence: (capacity) => rt.engine.createSequence(capacity),
            kvBytes: (n) => rt.engine.kvBytes(n),
            shape: kvShape(m),
            disk: c.sessionDir
              ? new SessionDisk(c.sessionDir, c.sessionDiskBytes, kvShape(m), rt.model.fingerprint, c.blockTokens)
              : undefined,
          })
        : undefined;
    if (this.sessions) {
      const store = this.sessions;
      metrics.watchSessions(() => ({ ...store.tiers(), events: store.counts }));
    }
    const calls = this.handoff.prefillCalls;
    metrics.watchRequests("decode", () => {
      const s = this.scheduler.status();
      // Waiting: admitted but not in the batch, and queued for a call to a prefill instance.
      return { running: s.running, waiting: s.admitted - s.running + calls.queued };
    });
    metrics.watchQueue("prefill_calls", () => ({ queued: calls.queued, rejected: calls.rejected }));
    // The decode stage's queue: sequences with their KV loaded, waiting for a batch place.
    metrics.watchQueue("decode", () => ({ queued: this.scheduler.status().waiting, rejected: this.scheduler.rejected }));
    metrics.watchKv("device", () => ({ inUse: this.scheduler.status().kv_reserved_bytes, capacity: c.kvBudgetBytes }));
    // The host bank of OmniKV offload: what the sequences hold there (it has no fixed capacity).
    metrics.watchKv("host", () => ({ inUse: this.scheduler.hostBytesInUse(), capacity: 0 }));
    // The process's pool of freed KV memory (native/src/kv_pool.h): resident, so part of the RSS.
    metrics.watchKv("pool", () => {
      const pool = kvPool();
      return { inUse: pool.readyBytes, capacity: pool.limitBytes };
    });
  }

  get ready(): boolean {
    return this.state === "ready";
  }

  /** Registers the decode: `baseUrl` its internal listener, `publicUrl` its API (where the router sends clients). */
  async start(baseUrl: string, publicUrl?: string): Promise<void> {
    this.membership = new Membership(this.rt, "decode", this.instanceId, baseUrl, publicUrl);
    await this.membership.start();
    if (this.sessions) {
      const adopted = await this.sessions.adoptDisk();
      if (adopted > 0) this.rt.log.info({ sessions: adopted }, "adopted the sessions on disk");
      this.sessionSweep = setInterval(() => void this.sweepSessions(), Math.min(60_000, this.rt.config.sessionTtlMs));
      this.sessionSweep.unref();
    }
    this.state = "ready";
  }

  /** Ends the sessions past their TTL (and their registry rows past theirs). */
  private async sweepSessions(): Promise<void> {
    try {
      await this.sessions?.sweep();
      await this.rt.registry.sessions.sweep();
    } catch (err) {
      this.rt.log.warn({ err }, "session sweep failed");
    }
  }

  status() {
    const { kv_loads, prefill_calls, recomputed, in_process } = this.handoff.status();
    return {
      state: this.state,
      requests_in_flight: this.requestsInFlight,
      ...this.scheduler.status(),
      kv_loads,
      prefill_calls,
      totals: { ...this.totals, recomputed, in_process },
    };
  }

  private assertReady(): void {
    if (this.state !== "ready") {
      throw new ApiError(503, this.state === "draining" ? "draining" : "not_ready", `the decode service is ${this.state}`);
    }
  }

  /**
   * The OpenAI routes' path: prefill the prompt — in this process when a prefill service runs
   * here (`serve`: the prefill's sequence is handed over as it is), else on a prefill instance
   * (the KV comes through its shard) — then decode it here.
   */
  complete(prompt: Omit<PrefillRequest, "max_tokens">, opts: DecodeOptions, signal: AbortSignal, log: Logger): AsyncGenerator<DecodeEvent> {
    return this.counted(this.completeTurn(prompt, opts, signal, log));
  }

  private async *counted(events: AsyncGenerator<DecodeEvent>): AsyncGenerator<DecodeEvent> {
    this.requestsInFlight++;
    try {
      yield* events;
    } finally {
      this.requestsInFlight--;
    }
  }

  private async *completeTurn(
    prompt: Omit<PrefillRequest, "max_tokens">,
    opts: DecodeOptions,
    signal: AbortSignal,
    log: Logger,
  ): AsyncGenerator<DecodeEvent> {
    const t0 = opts.arrivedAt ?? performance.now();
    let handover: Handover;
    let turn: TurnPlan;
    try {
      this.assertReady();
      this.scheduler.checkPlace();
      const body: PrefillRequest = {
        ...prompt,
        ...(opts.maxTokens === undefined ? {} : { max_tokens: opts.maxTokens }),
        ...(opts.temperature === undefined ? {} : { temperature: opts.temperature }),
        ...(opts.top_p === undefined ? {} : { top_p: opts.top_p }),
        ...(opts.top_k === undefined ? {} : { top_k: opts.top_k }),
        ...(opts.seed === undefined ? {} : { seed: opts.seed }),
        ...(opts.policy === undefined ? {} : { policy: opts.policy }),
      };
      const tenant = opts.tenant ?? LOCAL_TENANT;
      turn = await this.planTurn(body, opts, tenant, signal);
      this.metrics.placed(turn.placement.where, turn.placement.cause);
      this.metrics.sessionReused(turn.session?.reused ?? 0);
      const own: OwnRequest = {
        tenant,
        onKvFailure: opts.onKvFailure ?? "fail",
        plan: turn.plan,
        sequencePlan: (prefilled) => {
          const maxTokens = this.maxTokensFor(prefilled.prompt_tokens, opts);
          return { capacity: prefilled.prompt_tokens + maxTokens, policy: this.decodePolicy(prefilled, opts, true, maxTokens) };
        },
      };
      handover = turn.local
        ? await prefillLocally(
            this.rt,
            this.instanceId,
            (seq, tokens, sig) => this.scheduler.prefill(seq, tokens, sig),
            turn.local,
            signal,
            log,
          )
        : await this.handoff.prefill(body, own, signal, log);
    } catch (e) {
      const err = kvLoadFailed(e);
      this.metrics.requestFailed(err); // run() counts its own outcomes from here on
      throw err;
    }
    yield* this.run(handover, opts, signal, log, { owned: true, t0, turn });
  }

  /**
   * Where the prompt is computed and what a session holds of it. The prompt is tokenized here only
   * when that matters: a session is named (its parked sequence is matched against the prompt's
   * tokens), or prefill instances could be skipped (conditional disaggregation, placePrefill). A
   * prompt computed in this process is planned here, once; a prefill instance plans its own.
   */
  private async planTurn(body: PrefillRequest, opts: DecodeOptions, tenant: string, signal: AbortSignal): Promise<TurnPlan> {
    const c = this.rt.config;
    const sessionId = this.sessions && opts.session ? opts.session : undefined;
    if (!sessionId && (this.colocated || c.localPrefillTokens === 0)) {
      return {
        placement: this.colocated
          ? { where: "in_process", cause: "colocated", reason: "prefill and decode run in this process" }
          : { where: "remote", cause: "off", reason: "local prefill is off" },
      };
    }
    const chat = body.messages !== undefined;
    const sampling = checkBeforeWork(this.rt, body);
    const prompt = await encodePrompt(this.rt, body, { rounds: chat, tenant, signal });
    const { ids: tokens, roundStarts } = prompt;
    const maxTokens = this.maxTokensFor(tokens.length, opts);
    // A parked sequence continues under full attention only: a sparse policy's state (selections,
    // prompt pools) was built for the old prompt, so such a turn computes its prompt afresh.
    const resumed =
      sessionId && policyKind(body.policy ?? c.policy) === "full"
        ? await this.sessions!.resume(tenant, sessionId, tokens, tokens.length + maxTokens)
        : undefined;
    const reused = resumed?.reused ?? 0;
    const session = sessionId
      ? { id: sessionId, reused, turns: resumed?.turns ?? 0, tokens, roundStarts: roundStarts ?? [0], messages: promptMessages(body) }
      : undefined;
    const calls = this.handoff.prefillCalls;
    const placement: Placement = this.colocated
      ? resumed
        ? { where: "local", cause: "session", reason: `the session holds ${reused} of the prompt's ${tokens.length} tokens` }
        : { where: "in_process", cause: "colocated", reason: "prefill and decode run in this process" }
      : placePrefill({
          uncached: tokens.length - reused,
          promptTokens: tokens.length,
          maxTokens: c.localPrefillTokens,
          maxFraction: c.localPrefillFraction,
          poolFull: calls.running >= calls.options.limit,
        });
    if (placement.where !== "local") {
      resumed?.seq.release(); // the prompt is computed elsewhere; this turn parks its own sequence
      const plan = placement.where === "in_process" ? { plan: planPrompt(this.rt, body, prompt, sampling) } : {};
      return { placement, ...plan, ...(session ? { session: { ...session, reused: 0 } } : {}) };
    }
    const plan = planPrompt(this.rt, body, prompt, sampling);
    let seq = resumed?.seq;
    if (!seq) {
      seq = this.rt.engine.createSequence(tokens.length + maxTokens);
      try {
        applyPolicy(this.rt, seq, plan.policy); // the engine's one validation of this request's policy
      } catch (e) {
        seq.release();
        throw e;
      }
    }
    return { placement, local: { tenant, plan, seq, reused, sessionId: sessionId ?? null }, ...(session ? { session } : {}) };
  }

  /** Decodes a client's handle (POST /v1/decode): its KV comes through the prefill's shard. */
  decode(handle: Handle, opts: DecodeOptions, signal: AbortSignal, log: Logger): AsyncGenerator<DecodeEvent> {
    return this.counted(this.run(this.handoff.accept(handle, opts.onKvFailure ?? "fail"), opts, signal, log));
  }

  /**
   * The policy the decode's sequence attends with. Our own request's came resolved in its handle
   * (the prefill's plan; resolved here only from an older prefill's handle, which lacks it); a
   * client's handle is decoded under the policy its request names, else the handle's, resolved
   * for this decode's own length (SCOPE's planned output is its max_tokens).
   */
  private decodePolicy(
    prefilled: Pick<Handle, "prompt_tokens" | "policy" | "resolved_policy">,
    opts: DecodeOptions,
    owned: boolean,
    maxTokens: number,
  ): ResolvedPolicy {
    if (owned && prefilled.resolved_policy) return policyFromWire(prefilled.resolved_policy);
    return resolveRequestPolicy(
      this.rt,
      owned ? (prefilled.policy ?? opts.policy) : (opts.policy ?? prefilled.policy),
      prefilled.prompt_tokens,
      maxTokens,
    );
  }

  /** The answer's length for a prompt of `promptTokens`: max_tokens or the default, checked against the context. */
  private maxTokensFor(promptTokens: number, opts: DecodeOptions): number {
    const maxTokens = opts.maxTokens ?? defaultMaxTokens(this.rt.engine.maxContext, promptTokens);
    checkContext(this.rt.engine.maxContext, promptTokens, maxTokens);
    return maxTokens;
  }

  /**
   * Decodes a prompt handed over. `owned`: it came from our own prefill call, so on any failure its
   * chunks are released; a client's handle is left alone when it was not ours to take (404/409/429).
   */
  private async *run(
    handover: Handover,
    opts: DecodeOptions,
    outer: AbortSignal,
    log: Logger,
    how: { owned?: boolean; t0?: number; turn?: TurnPlan } = {},
  ): AsyncGenerator<DecodeEvent> {
    const { model } = this.rt;
    const handle = handover.handle;
    const t0 = how.t0 ?? opts.arrivedAt ?? performance.now();
    const clock = new RequestClock(t0);
    const requestId = handle.request_id;
    const ac = new AbortController();
    const onAbort = () => ac.abort(new ApiError(499, "client_closed", "the client closed the request"));
    outer.addEventListener("abort", onAbort, { once: true });
    if (outer.aborted) onAbort();
    const signal = ac.signal;
    this.active.add(ac);
    let claimed = how.owned ?? false;
    let outcome: "done" | "cancelled" | "failed" = "failed";
    let errorText: string | undefined;
    let failure: unknown;
    let reservation: ReturnType<DecodeScheduler["admit"]> | undefined;
    let seq: NativeSequence | undefined;
    let slot: Slot | undefined;
    let text: TokenTextStream | undefined;
    try {
      this.assertReady();
      if (handle.model_fingerprint !== model.fingerprint) {
        throw new ApiError(
          400,
          "model_mismatch",
          `the handle was made by model ${handle.model_fingerprint.slice(0, 12)}…, this decode runs ${model.fingerprint.slice(0, 12)}…`,
          "handle.model_fingerprint",
        );
      }
      if (handle.prompt_token_ids.length !== handle.prompt_tokens) {
        throw new ApiError(400, "invalid_request", "handle.prompt_token_ids must hold prompt_tokens ids", "handle.prompt_token_ids");
      }
      const n = handle.prompt_tokens;
      const maxTokens = this.maxTokensFor(n, opts);
      // A client's handle is input like any other: ids outside the vocabulary are its fault (400), not ours.
      checkTokenIds(handle.prompt_token_ids, model.config.nVocab, "handle.prompt_token_ids");
      const nFirst = Math.min(model.config.nVocab, this.rt.tokenizer.vocabSize); // it is detokenized too
      if (handle.first_token >= nFirst) {
        throw new ApiError(
          400,
          "invalid_request",
          `handle.first_token = ${handle.first_token} is not a token id in [0, ${nFirst})`,
          "handle.first_token",
        );
      }
      // The policy the handed-over sequence runs already (set before the prompt in process, at the
      // start of a streamed load), else the one decodePolicy picks.
      const policy = handover.policy ?? this.decodePolicy(handle, opts, how.owned ?? false, maxTokens);
      const ran = resolvedSpec(policy);
      checkPickedRounds(policy, handle); // a client's handle: refused before it is taken
      const sampler = newSampler(opts, handle.sampling);
      // Another key's handle is answered exactly like an unknown one: its existence is not told.
      if (!ownsRequest(opts.tenant ?? LOCAL_TENANT, requestId)) throw unknownHandle(requestId);
      // What the sequence will hold: its sliding layers' rings as the handover makes them, and a
      // reclaiming policy's bound in each global layer, not prompt + max_tokens.
      const globalRows = reclaimedRows(policy, n);
      reservation = this.scheduler.admit(this.rt.engine.kvBytes(n + maxTokens, { ringBatch: handover.ringBatch, globalRows }));
      seq = this.scheduler.adopt(handover.sequence({ capacity: n + maxTokens, policy }));
      // Our own prefill's handle is ours already; record that this decode holds it (should we
      // die, the sweep ends the row) without keeping the first token waiting.
      const adopting = claimed ? this.adopt(requestId, log) : this.claim(requestId);
      if (!claimed) await adopting;
      claimed = true;
      this.totals.requests++;

      // The first token came with the handle: stream it before the KV is even read.
      text = new TokenTextStream(this.rt.tokenizer, maxTokens, opts.stop ?? []);
      const first = text.push(handle.first_token);
      clock.token();
      const firstTokenAt = performance.now();
      yield { type: "token", id: handle.first_token, text: first.text, index: 0, policy: ran };
      let kv: KvSummary = { transport: "none", chunks: 0, bytes: 0, ms: 0, recomputed: false };
      let warnings: string[] = [];
      let wholeTokens: number | undefined;
      let finish = first.finish;
      if (!finish) {
        try {
          ({ kv, warnings, wholeTokens } = await handover.load(signal, log));
        } catch (e) {
          throw kvLoadFailed(e);
        }
        slot = new Slot(seq, handle.first_token, sampler, text, firstTokenAt);
        slot.tenant = opts.tenant ?? "local";
        slot.keep = how.turn?.session !== undefined; // parked for the session's next turn
        seq = undefined; // the scheduler owns it from here
        this.scheduler.start(slot);
        for (;;) {
          const ev = await slot.next(signal);
          if (ev.type === "error") throw ev.error;
          if (ev.type === "done") {
            finish = ev.finish;
            break;
          }
          clock.token();
          yield ev;
        }
      }
      outcome = "done";
      const session = how.turn?.session;
      if (session && slot?.kept) {
        // Round Attention may have left earlier rounds' upper layers behind: keep only what is whole.
        if (wholeTokens !== undefined && wholeTokens < slot.seq.nPast) slot.seq.truncate(wholeTokens);
        await this.park(opts.tenant ?? LOCAL_TENANT, session, slot.seq, handle.prompt_token_ids, text, log);
        slot.kept = false; // the store owns it now
      }
      const endedAt = performance.now();
      // Waiting for a place: the prefill's queue (from the handle) and the decode batch queue.
      const timings = clock.finish(endedAt, (handle.queue_ms ?? 0) + (slot?.batchWaitMs(endedAt) ?? 0));
      const verdict = this.metrics.requestFinished(finish, timings);
      yield {
        type: "done",
        requestId,
        finish,
        promptTokens: n,
        completionTokens: text.count,
        tokenIds: text.ids,
        kv,
        ttftMs: timings.ttftMs,
        totalMs: timings.e2eMs,
        ctxbank: {
          ...ctxbankExtension(timings, verdict),
          policy: ran,
          handoff: {
            path: handover.path,
            ...(warnings.length > 0 ? { warnings } : {}),
            ...(handover.path === "shard" && !kv.recomputed ? { bytes: kv.bytes } : {}),
            ...(kv.prompt_bytes !== undefined ? { prompt_bytes: kv.prompt_bytes } : {}),
          },
          ...(how.turn ? { prefill: how.turn.placement } : {}),
          ...(session ? { session: { id: session.id, reused_tokens: session.reused, turns: session.turns + 1 } } : {}),
        },
      };
    } catch (e) {
      if (signal.aborted) {
        outcome = "cancelled";
        errorText = "cancelled by the client";
        failure = signal.reason;
        throw signal.reason;
      }
      errorText = safeErrorMessage(e, 4000);
      failure = e;
      throw e;
    } finally {
      await handover.dispose();
      outer.removeEventListener("abort", onAbort);
      this.active.delete(ac);
      if (outcome === "failed" && errorText === undefined) {
        outcome = "cancelled"; // the consumer stopped reading (its client went away)
        errorText = "the client stopped reading";
        failure = new ApiError(499, "client_closed", errorText);
      }
      if (outcome !== "done") this.metrics.requestFailed(failure);
      if (reservation) this.metrics.tokens(handle.prompt_tokens, text?.count ?? 0);
      if (slot) this.scheduler.cancel(slot);
      if (slot?.kept) slot.seq.release(); // kept for a session that was not parked (an error on the way)
      if (seq) this.scheduler.release(seq);
      reservation?.release();
      this.totals[outcome]++;
      if (claimed)
        await this.outcomes.record(
          requestId,
          { state: outcome, ...(errorText ? { error: errorText.slice(0, 4000) } : {}), outputTokens: text?.count ?? 0 },
          log,
        );
      log.info(
        { requestId, outcome, handoff: handover.path, tokens: text?.count ?? 0, ms: Math.round(performance.now() - t0) },
        "decode finished",
      );
    }
  }

  /**
   * Parks a finished turn's sequence for the session's next turn: it holds the prompt and the
   * answer but its last token (sampled, never fed). The registry learns where the session is (the
   * router sends its next turn here).
   */
  private async park(
    tenant: string,
    session: NonNullable<TurnPlan["session"]>,
    seq: NativeSequence,
    prompt: readonly number[],
    answer: TokenTextStream,
    log: Logger,
  ): Promise<void> {
    const tokens = [...prompt, ...answer.ids].slice(0, seq.nPast);
    const roundStarts = [...session.roundStarts, prompt.length].filter((s, i, all) => s < tokens.length && (i === 0 || s > all[i - 1]!));
    try {
      await this.sessions!.park(tenant, session.id, seq, tokens, roundStarts, session.turns + 1);
      const summary = this.sessions!.summary(tenant, session.id);
      if (!summary) return; // too large to keep
      await this.rt.registry.sessions.upsert({
        id: `${tenant}:${session.id}`,
        tenant,
        holderInstanceId: this.instanceId,
        tier: summary.tier,
        tokens: summary.tokens,
        bytes: summary.bytes,
        roundHashes: summary.roundHashes,
        // What the client sends next time: these messages, then the answer as it read it.
        messageHashes: messageHashes([...session.messages, { role: "assistant", content: answer.text }]),
        turns: summary.turns,
        createdAt: new Date(summary.createdAt),
        lastUsedAt: new Date(summary.lastUsedAt),
        expiresAt: new Date(summary.expiresAt),
      });
    } catch (err) {
      log.warn({ err, session: session.id }, "could not keep the session"); // the next turn computes its prompt
    }
  }

  /** Takes the handle for this decode: exactly one decode may consume a request. */
  private async claim(requestId: string): Promise<void> {
    if (await this.rt.registry.requests.claimDecode(requestId, this.instanceId)) return;
    const row = await this.rt.registry.requests.get(requestId);
    if (!row) throw unknownHandle(requestId);
    if (row.state === "failed" && row.firstTokenAt === null && row.decodeInstanceId === null && row.prefillEndAt !== null) {
      // The sweep ended it: nobody took the handle while its chunks were kept.
      throw new ApiError(
        409,
        "handle_expired",
        `request ${requestId} was never decoded and has expired (${row.error ?? "abandoned"})`,
        "handle.request_id",
      );
    }
    const why = (OPEN as readonly string[]).includes(row.state) ? "is already being decoded" : `already ended (${row.state})`;
    throw new ApiError(409, "handle_released", `request ${requestId} ${why}; a handle is decoded once`, "handle.request_id");
  }

  /** Records this decode on a request it started itself (a failure only costs the sweep's help). */
  private adopt(requestId: string, log: Logger): Promise<void> {
    return this.rt.registry.requests.recordDecoder(requestId, this.instanceId).then(
      () => undefined,
      (err: unknown) => log.warn({ err }, "could not record the decode on its request"),
    );
  }

  /** Graceful stop, part one: refuse new work and let running generations finish. */
  async drain(deadline: number): Promise<void> {
    if (this.state === "stopped") return;
    this.state = "draining";
    await this.membership?.drain();
    while (Date.now() < deadline && this.active.size > 0) await new Promise((r) => setTimeout(r, 50));
  }

  /** Part two: cancel what is left (freeing its KV and leases), leave the registry. */
  async stop(): Promise<void> {
    if (this.state === "stopped") return;
    this.state = "stopped";
    for (const ac of this.active) ac.abort(new ApiError(503, "draining", "the decode service is shutting down"));
    while (this.active.size > 0) await new Promise((r) => setTimeout(r, 10));
    this.outcomes.stop();
    clearInterval(this.sessionSweep);
    this.sessions?.close();
    await this.membership?.leave();
    await this.handoff.close();
  }
}

/** A KV load that failed, as the request's answer (on_kv_failure: fail); any other failure as it is. */
function kvLoadFailed(e: unknown): unknown {
  if (e instanceof ApiError || !(e instanceof KvLoadError)) return e;
  return new ApiError(
    502,
    "kv_load_failed",
    `${e.message}. Retry, or set on_kv_failure: "recompute" to prefill locally`,
    null,
    { reason: e.reason },
    { cause: e },
  );
}

function unknownHandle(requestId: string): ApiError {
  return new ApiError(
    404,
    "unknown_handle",
    `no request ${requestId}: the handle is unknown (or its prefill never finished)`,
    "handle.request_id",
  );
}

/** The decode's sampler, continuing the one that sampled the handle's first token. */
function newSampler(opts: DecodeOptions, handleSampling: Handle["sampling"]): Sampler {
  const sampler = new Sampler(validateSampling(samplingOptions(opts, handleSampling)));
  // The prefill drew once from the same seeded generator for the first token; draw once too, so
  // the stream is the one a single process would have produced. (Greedy draws nothing.)
  if (sampler.options.temperature > 0) sampler.sample(Float32Array.of(0));
  return sampler;
}
