// What physical reclamation bounds (policy `reclaim`, native/src/kv_slots.h): a sequence under
// scope, streaming or h2o that frees its evicted tokens' rows holds at most this many rows in each
// global layer however long it generates, so admission reserves that, not prompt + max_tokens.
import type { AttentionPolicy, ResolvedPolicy } from "./schema.ts";

/** `policy` asking for reclamation (its kind's sub-object gets `reclaim: true`; meaningful for scope, streaming, h2o). */
export function withReclaim(policy: AttentionPolicy): AttentionPolicy {
  const part = (policy as unknown as Record<string, object>)[policy.kind];
  return { ...policy, [policy.kind]: { ...part, reclaim: true } } as AttentionPolicy;
}

/**
 * Rows each global layer of a reclaiming sequence holds at most, after a prompt of `promptTokens`
 * (the token being decoded included: it is written before its step's evictions); undefined when
 * the policy does not reclaim.
 */
export function reclaimedRows(policy: ResolvedPolicy, promptTokens: number): number | undefined {
  switch (policy.kind) {
    case "scope": // the prompt (a compressed prompt's freed rows are reused), the generated pool
      return policy.scope.reclaim ? promptTokens + policy.scope.beta1 + policy.scope.beta2 + 1 : undefined;
    case "streaming": // every prompt token until the window passes it, then sinks + window
      return policy.streaming.reclaim ? Math.max(promptTokens, policy.streaming.sinks + policy.streaming.window) + 1 : undefined;
    case "h2o": // every prompt token starts as a candidate, then the budget
      return policy.h2o.reclaim ? Math.max(promptTokens, policy.h2o.budget) + 1 : undefined;
    default:
      return undefined;
  }
}
