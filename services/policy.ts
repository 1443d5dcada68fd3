// A request's attention policy, made concrete for this model and prompt: the spec (the request's,
// else the handle's, else the server's --policy) resolved with the model's calibrated defaults,
// validated by the engine, and the layer groups the prefill packs its chunks by.
import type { AttentionPolicy } from "../shared/engine/native.ts";
import { ApiError } from "../shared/http/errors.ts";
import { policyDefaultsFor } from "../shared/policy/defaults.ts";
import { PolicyError, layerGroupsFromRoles, resolvePolicy, type PolicySpec } from "../shared/policy/request.ts";
import type { Runtime } from "./runtime.ts";

export interface PlannedPolicy {
  spec: PolicySpec;
  policy: AttentionPolicy;
  /** Layer groups for KV chunks: one group under dense policies, dense + one per filter layer under OmniKV. */
  layerGroups: number[][];
}

/** Throws ApiError 400 invalid_policy, naming the reason, when the policy cannot run on this model. */
export function planPolicy(rt: Pick<Runtime, "engine" | "model" | "config">, spec: PolicySpec | undefined, promptTokens: number, maxTokens: number): PlannedPolicy {
  const chosen = spec ?? rt.config.policy;
  try {
    const filterLayers = policyDefaultsFor(rt.model.fingerprint)?.filterLayers;
    const policy = resolvePolicy(chosen, { ...(filterLayers ? { filterLayers } : {}), promptTokens, maxTokens });
    const roles = rt.engine.checkPolicy(policy);
    return { spec: chosen, policy, layerGroups: layerGroupsFromRoles(roles.layerRoles, roles.layerGroups, rt.model.config.nLayer) };
  } catch (e) {
    if (e instanceof PolicyError) throw new ApiError(400, "invalid_policy", e.message, "policy");
    throw e;
  }
}
