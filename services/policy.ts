// A request's attention policy, made concrete for this model and prompt: the spec (the request's,
// else the handle's, else the server's --policy) resolved with the model's calibrated defaults,
// validated by the engine, and the layer groups the prefill packs its chunks by.
import type { AttentionPolicy } from "../shared/inference/engine/native.ts";
import { policyDefaultsFor } from "../shared/inference/policy/defaults.ts";
import { checkPolicyLimits, layerGroupsFromRoles, resolvePolicy, type PolicySpec } from "../shared/inference/policy/request.ts";
import { DEFAULT_MAX_TOKENS, type Runtime } from "./runtime.ts";

export interface PlannedPolicy {
  spec: PolicySpec;
  policy: AttentionPolicy;
  /** Layer groups for KV chunks: one group under dense policies, dense + one per filter layer under OmniKV. */
  layerGroups: number[][];
}

/**
 * Throws PolicyError (invalid_policy, a 400), naming the reason, when the policy cannot run on this model.
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
  checkPolicyLimits(chosen, { maxContext: rt.engine.maxContext, nLayer: rt.model.config.nLayer });
  const defaults = policyDefaultsFor(rt.model.fingerprint);
  const policy = resolvePolicy(chosen, {
    ...(defaults ? { filterLayers: defaults.filterLayers, watershedLayer: defaults.watershedLayer } : {}),
    ...(roundStarts ? { roundStarts } : {}),
    promptTokens,
    maxTokens,
  });
  const roles = rt.engine.checkPolicy(policy);
  const resolved: PolicySpec =
    policy.kind === "rounds" ? { kind: "rounds", rounds: { watershed_layer: policy.rounds.watershedLayer, starts: policy.rounds.starts, top_k: policy.rounds.topK ?? 0 } } : chosen;
  return { spec: resolved, policy, layerGroups: layerGroupsFromRoles(roles.layerRoles, roles.layerGroups, rt.model.config.nLayer) };
}

/**
 * The policy checked before a prompt is tokenized: its limits, and the engine's own checks with
 * what the prompt cannot make worse (a one-token prompt, the longest default answer, a chat's
 * rounds still to be found). What depends on the prompt is checked again by planPolicy.
 */
export function checkPolicyBeforeWork(rt: Pick<Runtime, "engine" | "model" | "config">, spec: PolicySpec | undefined, opts: { maxTokens?: number | undefined; chat: boolean }): void {
  planPolicy(rt, spec, 1, opts.maxTokens ?? DEFAULT_MAX_TOKENS, opts.chat ? [0] : undefined);
}
