// The decode computing a prompt itself: the part of a session's next turn its parked sequence does
// not hold, or (conditional disaggregation) a whole prompt too short to be worth a prefill
// instance, or one that would wait for every call to them to come free. It goes through the decode's
// own batched steps (the scheduler computes prompts in chunks beside the running decodes), and
// hands the result to the decode like the KV handoff would: a Handover whose sequence holds the
// prompt and whose first token is sampled.
import { randomUUID } from "node:crypto";
import type { Logger } from "pino";
import type { NativeSequence } from "../../shared/inference/engine/engine.ts";
import { Sampler } from "../../shared/inference/engine/sampler.ts";
import { namespacedRequestId } from "../../shared/platform/auth/tenant.ts";
import { resolvedSpec, type ResolvedPolicy } from "../../shared/inference/policy/request.ts";
import type { Handover, LoadedKv, PromptCompute, PromptHandle, SequencePlan } from "../handoff/index.ts";
import type { RequestPlan } from "../request-plan.ts";
import type { Runtime } from "../runtime.ts";
import type { PlacementCause } from "../../shared/platform/metrics/definitions.ts";

/** Where a prompt is computed, and why (the answer's `ctxbank.prefill`; the metrics count `cause`). */
export interface Placement {
  where: "in_process" | "remote" | "local";
  cause: PlacementCause;
  reason: string;
}

/**
 * Conditional disaggregation: local when the part to compute is short (at most `maxTokens`), or a
 * small part of the prompt (at most `maxFraction`: the rest is a session's), or when every call to
 * the prefill instances is taken (`poolFull`); else a prefill instance computes it.
 */
export function placePrefill(o: {
  uncached: number;
  promptTokens: number;
  maxTokens: number;
  maxFraction: number;
  poolFull: boolean;
}): Placement {
  if (o.uncached <= o.maxTokens)
    return { where: "local", cause: "short", reason: `${o.uncached} tokens to compute, at most ${o.maxTokens} are computed here` };
  if (o.uncached <= o.maxFraction * o.promptTokens) {
    return {
      where: "local",
      cause: "fraction",
      reason: `${o.uncached} of ${o.promptTokens} tokens to compute, at most ${Math.round(o.maxFraction * 100)}% are computed here`,
    };
  }
  if (o.poolFull) return { where: "local", cause: "pool_full", reason: "every call to the prefill instances is taken" };
  return { where: "remote", cause: "long", reason: `${o.uncached} tokens to compute: a prefill instance computes them` };
}

export interface LocalPrompt {
  tenant: string;
  plan: RequestPlan;
  /** A session's sequence holding the first `reused` tokens (its policy runs full attention), or a new one with the plan's policy. */
  seq: NativeSequence;
  reused: number;
  sessionId: string | null;
}

/**
 * Computes the plan's tokens from `p.reused` into `p.seq` and samples the first token: the request's
 * registry row first (as a prefill would make it), its milestones, then the Handover. On failure
 * the sequence is released and the error thrown.
 */
export async function prefillLocally(
  rt: Runtime,
  instanceId: string,
  compute: PromptCompute,
  p: LocalPrompt,
  signal: AbortSignal,
  log: Logger,
): Promise<Handover> {
  const t0 = performance.now();
  const { tokens, sampling, policy } = p.plan;
  const requestId = namespacedRequestId(p.tenant, `req-${randomUUID()}`);
  try {
    await rt.registry.requests.create({
      id: requestId,
      sessionId: p.sessionId,
      promptTokens: tokens.length,
      prefillInstanceId: instanceId,
    });
    await rt.registry.requests.mark(requestId, { event: "prefill_start" });
    const logits = await compute(p.seq, tokens.slice(p.reused), signal);
    const firstToken = new Sampler(sampling).sample(logits);
    await rt.registry.requests.mark(requestId, { event: "prefill_end" });
    const { temperature, topP, topK, seed } = sampling;
    const handle: PromptHandle = {
      request_id: requestId,
      first_token: firstToken,
      model_fingerprint: rt.model.fingerprint,
      prompt_tokens: tokens.length,
      prompt_token_ids: tokens,
      policy: p.plan.spec,
      resolved_policy: resolvedSpec(policy),
      sampling: { temperature, top_p: topP, top_k: topK, seed },
      prefill_ms: performance.now() - t0,
      queue_ms: 0,
    };
    log.info({ requestId, promptTokens: tokens.length, reused: p.reused, ms: Math.round(handle.prefill_ms) }, "prefilled locally");
    return new LocalHandover(handle, policy, p.seq, tokens.length - p.reused);
  } catch (e) {
    p.seq.release();
    throw e;
  }
}

class LocalHandover implements Handover {
  readonly path = "local";
  readonly ringBatch = undefined; // the engine's, as the prompt was computed
  private seq: NativeSequence | undefined;

  constructor(
    readonly handle: PromptHandle,
    readonly policy: ResolvedPolicy,
    seq: NativeSequence,
    private readonly computed: number,
  ) {
    this.seq = seq;
  }

  sequence(plan: SequencePlan): NativeSequence {
    const seq = this.seq!;
    this.seq = undefined;
    if (seq.capacity < plan.capacity) {
      seq.release();
      throw new Error(`the local prefill's sequence has room for ${seq.capacity} tokens, the plan needs ${plan.capacity}`);
    }
    return seq;
  }

  /** The KV is in the sequence already: computed here. */
  async load(): Promise<LoadedKv> {
    return { kv: { transport: "local", chunks: 0, bytes: 0, ms: 0, recomputed: this.computed > 0 }, warnings: [] };
  }

  async dispose(): Promise<void> {
    this.seq?.release();
    this.seq = undefined;
  }
}
