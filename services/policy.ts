// A request's attention policy on this runtime's model: checked before any work, resolved with the
// model's calibrated defaults (once per request: services/request-plan.ts), validated by the engine
// once per sequence that attends with it (applyPolicy), and what a handle carries of it.
import type { NativeSequence } from "../shared/inference/engine/engine.ts";
import { policyDefaultsFor } from "../shared/inference/policy/defaults.ts";
import {
  checkPolicyLimits,
  checkPolicySpec,
  layerGroupsFromRoles,
  PolicySpecSchema,
  resolvePolicy,
  type PolicySpec,
  type ResolvedPolicy,
} from "../shared/inference/policy/request.ts";
import { ApiError } from "../shared/platform/http/errors.ts";
import type { Handle } from "../shared/platform/http/wire.ts";
import type { Runtime } from "./runtime.ts";

type PolicyRuntime = Pick<Runtime, "engine" | "model" | "config">;

/** What the model gives a policy: its context and layers (the limits) and its calibrated layers. */
function policyModel(rt: PolicyRuntime) {
  const calibrated = policyDefaultsFor(rt.model.fingerprint);
  return {
    maxContext: rt.engine.maxContext,
    nLayer: rt.model.config.nLayer,
    ...(calibrated ? { filterLayers: calibrated.filterLayers, watershedLayer: calibrated.watershedLayer } : {}),
  };
}

/**
 * Refuses (PolicyError: invalid_policy, a 400) before the prompt is tokenized what the spec (the
 * request's, else the server's --policy) shows it cannot run with on this model; `chat`: a chat
 * request's user messages will give a `rounds` policy its rounds.
 */
export function checkPolicyBeforeWork(rt: PolicyRuntime, spec: PolicySpec | undefined, opts: { chat: boolean }): void {
  checkPolicySpec(spec ?? rt.config.policy, policyModel(rt), opts);
}

/**
 * The spec (the request's, else the server's --policy) resolved for this model and prompt;
 * PolicyError for what the spec alone shows (limits, missing defaults). `roundStarts`: the rounds of
 * a chat prompt, for `rounds` requests that give none.
 */
export function resolveRequestPolicy(
  rt: PolicyRuntime,
  spec: PolicySpec | undefined,
  promptTokens: number,
  maxTokens: number,
  roundStarts?: readonly number[],
): ResolvedPolicy {
  const model = policyModel(rt);
  const chosen = spec ?? rt.config.policy;
  checkPolicyLimits(chosen, model);
  return resolvePolicy(chosen, { ...model, ...(roundStarts ? { roundStarts } : {}), promptTokens, maxTokens });
}

/**
 * The spec a handle hands on (`policy`): the request's, defaults written in, so a decode that
 * resolves it for its own length gets what the prefill planned; a `rounds` policy with its rounds
 * as resolved (a chat's, which the decode cannot find again from the prompt's ids).
 */
export function handedOnSpec(spec: PolicySpec, policy: ResolvedPolicy): Handle["policy"] {
  const handOn: PolicySpec =
    policy.kind === "rounds"
      ? {
          kind: "rounds",
          rounds: { watershed_layer: policy.rounds.watershedLayer, starts: policy.rounds.starts, top_k: policy.rounds.topK },
        }
      : spec;
  return PolicySpecSchema.parse(handOn);
}

/** Sets the policy on the sequence that attends with it (the engine's one validation); PolicyError (invalid_policy) when refused. */
export function applyPolicy(rt: Pick<Runtime, "engine">, seq: NativeSequence, policy: ResolvedPolicy): void {
  rt.engine.applyPolicy(seq, policy);
}

/** The layer groups a prefill packs the chunks of `seq` by, from the engine's roles of the policy set on it. */
export function layerGroupsOf(rt: Pick<Runtime, "model">, seq: NativeSequence): number[][] {
  const { layerRoles, layerGroups } = seq.policyStats;
  return layerGroupsFromRoles(layerRoles, layerGroups, rt.model.config.nLayer);
}

/**
 * The policy a prefill that writes chunks sets on its own sequence before the prompt, so that the
 * engine derives what the decode policy needs of the prompt (exported with the handle,
 * loadPromptState). Prefill attention is full either way; offload would only move the KV tiers.
 * The layer roles, and so the chunks' layer groups, are the decode policy's.
 */
export function prefillObserverPolicy(policy: ResolvedPolicy): ResolvedPolicy {
  if ((policy.kind !== "omnikv" && policy.kind !== "omnikv+scope") || !policy.omnikv.offload) return policy;
  const { offload, ...omnikv } = policy.omnikv; // on here: the prefill's sequence keeps its KV in one tier
  return { ...policy, omnikv: { ...omnikv, offload: !offload } };
}

/**
 * Loads the prompt state a handle carries (base64, from the prefill's exportPromptState) into
 * `seq`, after its KV import. Undefined when the decode has what its policy needs of the prompt;
 * else why not, a warning for the answer. ApiError 400 when the state is malformed.
 */
export function loadPromptState(seq: NativeSequence, policy: ResolvedPolicy, promptState: string | undefined): string | undefined {
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
export function promptQueriesMissing(policy: ResolvedPolicy): string | undefined {
  if (policy.kind === "scope" && policy.scope.alpha1 > 0) {
    return "scope.alpha1: the prompt pool needs the prompt's last queries, which the handle does not carry; the decode kept the whole prompt";
  }
  if (
    (policy.kind === "omnikv" || policy.kind === "omnikv+scope") &&
    (policy.omnikv.selector === "uniform" || policy.omnikv.selector === "exp")
  ) {
    return `omnikv.selector ${policy.omnikv.selector}: the prompt's last queries, part of the selection window, did not come with the handle; the window starts with the generated tokens' queries only`;
  }
  return undefined;
}
