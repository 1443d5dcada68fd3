// A request's attention policy, made concrete for this model and prompt: the spec (the request's,
// else the handle's, else the server's --policy) resolved with the model's calibrated defaults,
// validated by the engine once — on the sequence that will attend with it (applyPolicy), or, for
// a prefill that writes chunks, once for the layer groups it packs them by (planPolicy).
import type { NativeSequence } from "../shared/inference/engine/engine.ts";
import type { AttentionPolicy } from "../shared/inference/engine/native.ts";
import { policyDefaultsFor } from "../shared/inference/policy/defaults.ts";
import { checkPolicyLimits, PolicySpecSchema, layerGroupsFromRoles, resolvePolicy, resolvedSpec, type ParsedPolicySpec, type PolicySpec } from "../shared/inference/policy/request.ts";
import { MAX_TOKENS_DEFAULTS } from "../shared/inference/defaults.ts";
import { ApiError } from "../shared/platform/http/errors.ts";
import type { Runtime } from "./runtime.ts";

export interface ResolvedPolicy {
  /** The spec to hand on (the request's, defaults written in; rounds with its resolved rounds). */
  spec: ParsedPolicySpec;
  policy: AttentionPolicy;
  /** What runs, in the wire's shape: every default, calibrated layer and budget written in (responses report it). */
  resolved: Exclude<ParsedPolicySpec, string>;
}

export interface PlannedPolicy extends ResolvedPolicy {
  /** Layer groups for KV chunks: one group under dense policies, dense + one per filter layer under OmniKV. */
  layerGroups: number[][];
}

/**
 * The policy resolved for this prompt, without the engine: PolicyError (invalid_policy, a 400) for what
 * the spec alone shows (limits, missing defaults). `roundStarts`: the rounds of a chat prompt, for
 * `rounds` requests that give none.
 */
export function resolveRequestPolicy(
  rt: Pick<Runtime, "engine" | "model" | "config">,
  spec: PolicySpec | undefined,
  promptTokens: number,
  maxTokens: number,
  roundStarts?: readonly number[],
): ResolvedPolicy {
  const chosen = spec ?? rt.config.policy;
  checkPolicyLimits(chosen, { maxContext: rt.engine.maxContext, nLayer: rt.model.config.nLayer });
  const defaults = policyDefaultsFor(rt.model.fingerprint);
  const policy = resolvePolicy(chosen, {
    ...(defaults ? { filterLayers: defaults.filterLayers, watershedLayer: defaults.watershedLayer } : {}),
    ...(roundStarts ? { roundStarts } : {}),
    promptTokens,
    maxTokens,
  });
  const handOn: PolicySpec =
    policy.kind === "rounds" ? { kind: "rounds", rounds: { watershed_layer: policy.rounds.watershedLayer, starts: policy.rounds.starts, top_k: policy.rounds.topK } } : chosen;
  return { spec: PolicySpecSchema.parse(handOn), policy, resolved: resolvedSpec(policy) };
}

/** Resolves the policy and has the engine validate it once, for the layer groups a chunk-writing prefill packs by. */
export function planPolicy(
  rt: Pick<Runtime, "engine" | "model" | "config">,
  spec: PolicySpec | undefined,
  promptTokens: number,
  maxTokens: number,
  roundStarts?: readonly number[],
): PlannedPolicy {
  const resolved = resolveRequestPolicy(rt, spec, promptTokens, maxTokens, roundStarts);
  const roles = rt.engine.checkPolicy(resolved.policy);
  return { ...resolved, layerGroups: layerGroupsFromRoles(roles.layerRoles, roles.layerGroups, rt.model.config.nLayer) };
}

/** Sets the policy on the sequence that attends with it (the engine's one validation); PolicyError (invalid_policy) when refused. */
export function applyPolicy(rt: Pick<Runtime, "engine">, seq: NativeSequence, policy: AttentionPolicy): void {
  rt.engine.applyPolicy(seq, policy);
}

/**
 * The policy checked before a prompt is tokenized, with what the prompt cannot make worse (a
 * one-token prompt, the longest default answer, a chat's rounds still to be found). The engine
 * sees it once, with the prompt's own length (planPolicy or applyPolicy).
 */
export function checkPolicyBeforeWork(rt: Pick<Runtime, "engine" | "model" | "config">, spec: PolicySpec | undefined, opts: { maxTokens?: number | undefined; chat: boolean }): void {
  resolveRequestPolicy(rt, spec, 1, opts.maxTokens ?? MAX_TOKENS_DEFAULTS.generate, opts.chat ? [0] : undefined);
}

/**
 * The policy a prefill that writes chunks sets on its own sequence before the prompt, so that the
 * engine derives what the decode policy needs of the prompt (exported with the handle,
 * loadPromptState). Prefill attention is full either way; offload would only move the KV tiers.
 */
export function prefillObserverPolicy(policy: AttentionPolicy): AttentionPolicy {
  if ((policy.kind !== "omnikv" && policy.kind !== "omnikv+scope") || !policy.omnikv.offload) return policy;
  const { offload, ...omnikv } = policy.omnikv; // on here: the prefill's sequence keeps its KV in one tier
  return { ...policy, omnikv: { ...omnikv, offload: !offload } };
}

/**
 * Loads the prompt state a handle carries (base64, from the prefill's exportPromptState) into
 * `seq`, after its KV import. Undefined when the decode has what its policy needs of the prompt;
 * else why not, a warning for the answer. ApiError 400 when the state is malformed.
 */
export function loadPromptState(seq: NativeSequence, policy: AttentionPolicy, promptState: string | undefined): string | undefined {
  const missing = promptQueriesMissing(policy);
  if (promptState === undefined) return missing;
  let loaded: boolean;
  try {
    loaded = seq.importPromptState(Buffer.from(promptState, "base64"));
  } catch (e) {
    if (e instanceof RangeError) throw new ApiError(400, "invalid_request", `handle.prompt_state: ${e.message}`, "handle.prompt_state");
    throw e;
  }
  if (loaded || !missing) return undefined;
  return `${missing} (the handle's prompt state was made under a policy that derives other state from the prompt)`;
}

/**
 * Why a decode that imported its prompt's KV without the prompt state (a handle that carries none,
 * or one made under a policy deriving other state) attends differently from one that computed
 * it: what the policy keeps of the prompt's queries is missing. Undefined when nothing is.
 */
export function promptQueriesMissing(policy: AttentionPolicy): string | undefined {
  if (policy.kind === "scope" && policy.scope.alpha1 > 0) {
    return "scope.alpha1: the prompt pool needs the prompt's last queries, which the handle does not carry; the decode kept the whole prompt";
  }
  if ((policy.kind === "omnikv" || policy.kind === "omnikv+scope") && (policy.omnikv.selector === "uniform" || policy.omnikv.selector === "exp")) {
    return `omnikv.selector ${policy.omnikv.selector}: the prompt's last queries, part of the selection window, did not come with the handle; the window starts with the generated tokens' queries only`;
  }
  return undefined;
}
