// One request, planned once from its wire body: the prompt's tokens, the sampling options, the
// answer's length and the attention policy resolved for this model and prompt. The prefill plans a
// request (in process it may take the plan the decode made for a session's turn), the handle
// carries what the decode needs of the plan (the tokens, the sampling, the policy as resolved and
// the layer groups its chunks are packed by), and no later step derives any of it again: a
// request's policy is resolved once, and validated by the engine once per sequence that attends
// with it (services/policy.ts applyPolicy).
import { validateSampling } from "../shared/inference/engine/sampler.ts";
import { policyKind, type ResolvedPolicy } from "../shared/inference/policy/request.ts";
import type { Handle, PrefillRequest } from "../shared/platform/http/wire.ts";
import { checkPolicyBeforeWork, handedOnSpec, resolveRequestPolicy } from "./policy.ts";
import { checkContext, defaultMaxTokens, encodePrompt, type EncodedPrompt, type Runtime } from "./runtime.ts";

/** Sampling options with every default written in (the seed drawn, when the request gave none). */
export type PlannedSampling = ReturnType<typeof validateSampling>;

export interface RequestPlan {
  /** The prompt's token ids. */
  tokens: number[];
  sampling: PlannedSampling;
  /** The answer's planned length: max_tokens, or the default the context leaves room for. */
  maxTokens: number;
  /** The policy the handle hands on (handedOnSpec): what a decode resolves again for another length. */
  spec: Handle["policy"];
  /** What the decode attends with: resolved once, for this model and prompt. */
  policy: ResolvedPolicy;
}

/**
 * What a body shows wrong before any work: its sampling options (returned, validated: a seed
 * left out is drawn here, once) and its policy (checkPolicyBeforeWork).
 */
export function checkBeforeWork(rt: Runtime, body: PrefillRequest): PlannedSampling {
  const sampling = validateSampling({
    temperature: body.temperature,
    topK: body.top_k,
    topP: body.top_p,
    ...(body.seed === undefined ? {} : { seed: body.seed }),
  });
  checkPolicyBeforeWork(rt, body.policy, { chat: body.messages !== undefined });
  return sampling;
}

/**
 * Plans `body`: what it shows wrong is refused before any work, then the prompt is tokenized (off
 * the event loop, in the tenant's turn, stopping past the context), a chat's rounds found in the
 * same pass when a `rounds` policy needs them; then planPrompt.
 */
export async function planRequest(rt: Runtime, body: PrefillRequest, opts: { tenant: string; signal: AbortSignal }): Promise<RequestPlan> {
  const sampling = checkBeforeWork(rt, body);
  const rounds = body.messages !== undefined && policyKind(body.policy ?? rt.config.policy) === "rounds";
  const prompt = await encodePrompt(rt, body, { rounds, tenant: opts.tenant, signal: opts.signal });
  return planPrompt(rt, body, prompt, sampling);
}

/**
 * The plan of `body` once its prompt is tokenized and its `sampling` checked (checkBeforeWork): the
 * prompt against the context, the answer's length, and the one resolution of its policy.
 */
export function planPrompt(rt: Runtime, body: PrefillRequest, prompt: EncodedPrompt, sampling: PlannedSampling): RequestPlan {
  const n = prompt.ids.length;
  checkContext(rt.engine.maxContext, n, body.max_tokens);
  // The length the decode plans for (SCOPE's T is max_tokens, or the decode's default).
  const maxTokens = body.max_tokens ?? defaultMaxTokens(rt.engine.maxContext, n);
  const spec = body.policy ?? rt.config.policy;
  const policy = resolveRequestPolicy(rt, spec, n, maxTokens, prompt.roundStarts ?? undefined);
  return { tokens: prompt.ids, sampling, maxTokens, spec: handedOnSpec(spec, policy), policy };
}
