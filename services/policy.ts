// A request's attention policy, made concrete for this model and prompt: the spec (the request's,
// else the handle's, else the server's --policy) resolved with the model's calibrated defaults,
// validated by the engine, and the layer groups the prefill packs its chunks by.
import type { AttentionPolicy } from "../shared/inference/engine/native.ts";
import { ApiError } from "../shared/platform/http/errors.ts";
import { policyDefaultsFor } from "../shared/inference/policy/defaults.ts";
import { checkPolicyLimits, PolicyError, PolicySpecSchema, layerGroupsFromRoles, resolvePolicy, resolvedSpec, type ParsedPolicySpec, type PolicySpec } from "../shared/inference/policy/request.ts";
import { MAX_TOKENS_DEFAULTS } from "../shared/inference/defaults.ts";
import type { Runtime } from "./runtime.ts";

export interface PlannedPolicy {
  /** The spec to hand on (the request's, defaults written in; rounds with its resolved rounds). */
  spec: ParsedPolicySpec;
  policy: AttentionPolicy;
  /** What runs, in the wire's shape: every default, calibrated layer and budget written in (responses report it). */
  resolved: Exclude<ParsedPolicySpec, string>;
  /** Layer groups for KV chunks: one group under dense policies, dense + one per filter layer under OmniKV. */
  layerGroups: number[][];
}

/**
 * Throws ApiError 400 invalid_policy, naming the reason, when the policy cannot run on this model.
 * `roundStarts`: the rounds of a chat prompt, for `rounds` requests that give none. The returned
 * spec has what was resolved here written in (a handle carries it to the decode).
 */
export function planPolicy(
  rt: Pick<Runtime, "engine" | "model" | "config">,
  spec: PolicySpec | undefined,
  promptTokens: number,
  maxTokens: number,
  roundStarts?: readonly number[],
): PlannedPolicy {
  const chosen = spec ?? rt.config.policy;
  try {
    checkPolicyLimits(chosen, { maxContext: rt.engine.maxContext, nLayer: rt.model.config.nLayer });
    const defaults = policyDefaultsFor(rt.model.fingerprint);
    const policy = resolvePolicy(chosen, {
      ...(defaults ? { filterLayers: defaults.filterLayers, watershedLayer: defaults.watershedLayer } : {}),
      ...(roundStarts ? { roundStarts } : {}),
      promptTokens,
      maxTokens,
    });
    const roles = rt.engine.checkPolicy(policy);
    const handOn: PolicySpec =
      policy.kind === "rounds" ? { kind: "rounds", rounds: { watershed_layer: policy.rounds.watershedLayer, starts: policy.rounds.starts, top_k: policy.rounds.topK } } : chosen;
    return {
      spec: PolicySpecSchema.parse(handOn),
      policy,
      resolved: resolvedSpec(policy),
      layerGroups: layerGroupsFromRoles(roles.layerRoles, roles.layerGroups, rt.model.config.nLayer),
    };
  } catch (e) {
    if (e instanceof PolicyError) throw new ApiError(400, "invalid_policy", e.message, e.param);
    throw e;
  }
}

/**
 * The policy checked before a prompt is tokenized: its limits, and the engine's own checks with
 * what the prompt cannot make worse (a one-token prompt, the longest default answer, a chat's
 * rounds still to be found). What depends on the prompt is checked again by planPolicy.
 */
export function checkPolicyBeforeWork(rt: Pick<Runtime, "engine" | "model" | "config">, spec: PolicySpec | undefined, opts: { maxTokens?: number | undefined; chat: boolean }): void {
  planPolicy(rt, spec, 1, opts.maxTokens ?? MAX_TOKENS_DEFAULTS.generate, opts.chat ? [0] : undefined);
}
