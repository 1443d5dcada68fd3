// A request's attention policy, made concrete for this model and prompt: the spec (the request's,
// else the handle's, else the server's --policy) resolved with the model's calibrated defaults,
// validated by the engine, and the layer groups the prefill packs its chunks by.
import type { AttentionPolicy } from "../shared/engine/native.ts";
import { ApiError } from "../shared/http/errors.ts";
import { policyDefaultsFor } from "../shared/policy/defaults.ts";
import { PolicyError, layerGroupsFromRoles, resolvePolicy, type PolicySpec } from "../shared/policy/request.ts";
import type { ChatMessage } from "../shared/tokenizer/chat-template.ts";
import { encodePrompt, type Runtime } from "./runtime.ts";

export interface PlannedPolicy {
  spec: PolicySpec;
  policy: AttentionPolicy;
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
  } catch (e) {
    if (e instanceof PolicyError) throw new ApiError(400, "invalid_policy", e.message, "policy");
    throw e;
  }
}

/**
 * Round Attention's rounds of a chat prompt: round 0 from token 0, then one round per later user
 * message, starting at the first token of that message's turn. Found by tokenizing the rendered
 * conversation up to each user message; null when that is not a prefix of the whole prompt's
 * tokens (a template that rewrites earlier turns), in which case the request must give starts.
 */
export function chatRoundStarts(rt: Pick<Runtime, "tokenizer" | "chat" | "model">, messages: ChatMessage[], tokens: readonly number[]): number[] | null {
  const starts = [0];
  for (let i = 1; i < messages.length; i++) {
    if (messages[i]!.role !== "user") continue;
    const before = encodePrompt(rt, { messages: messages.slice(0, i) }, { addGenerationPrompt: false });
    if (before.length >= tokens.length || before.some((t, j) => t !== tokens[j])) return null;
    starts.push(before.length);
  }
  return starts;
}
