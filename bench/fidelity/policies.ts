// The decode policies the fidelity bench compares. `budget` is what the chart puts on the x axis:
// prompt tokens kept for omnikv (generated tokens are always attended on top), tokens attended
// in all for streaming and h2o, beta1 + beta2 generated tokens for scope (the prompt is kept whole).
import type { AttentionPolicy } from "../../shared/inference/engine/native.ts";

export interface BenchPolicy {
  id: string;
  family: "full" | "omnikv" | "streaming" | "h2o" | "scope" | "omnikv+scope";
  budget: number | null;
  policy: AttentionPolicy;
}

export const BUDGETS = [256, 1024] as const;
/** maxOutput (SCOPE's T) only shapes the adaptive and discontinuous budgets: slide mode ignores it. */
export const SCOPE = { mode: "slide", beta1: 256, beta2: 256, maxOutput: 1024 } as const;
/** omnikv+scope: OmniKV at this prompt budget, SCOPE as above over the generated tokens. */
export const OMNIKV_SCOPE_BUDGET = 1024;

/** `guard` unset: the default (the first layer after each filter layer stays dense). */
export function fidelityPolicies(filterLayers: number[], budgets: readonly number[] = BUDGETS, guard?: boolean): BenchPolicy[] {
  const omnikv = (budget: number) => ({ filterLayers, budget, ...(guard === undefined ? {} : { guard }) });
  const out: BenchPolicy[] = [{ id: "full", family: "full", budget: null, policy: { kind: "full" } }];
  for (const k of budgets) out.push({ id: `omnikv k=${k}`, family: "omnikv", budget: k, policy: { kind: "omnikv", omnikv: omnikv(k) } });
  for (const k of budgets)
    out.push({
      id: `streaming k=${k}`,
      family: "streaming",
      budget: k,
      policy: { kind: "streaming", streaming: { sinks: 4, window: k - 4 } },
    });
  for (const k of budgets)
    out.push({ id: `h2o k=${k}`, family: "h2o", budget: k, policy: { kind: "h2o", h2o: { budget: k, recent: k / 4 } } });
  const scope = { ...SCOPE };
  out.push({
    id: `scope ${scope.beta1}+${scope.beta2}`,
    family: "scope",
    budget: scope.beta1 + scope.beta2,
    policy: { kind: "scope", scope },
  });
  out.push({
    id: `omnikv k=${OMNIKV_SCOPE_BUDGET}+scope ${scope.beta1}+${scope.beta2}`,
    family: "omnikv+scope",
    budget: OMNIKV_SCOPE_BUDGET,
    policy: { kind: "omnikv+scope", omnikv: omnikv(OMNIKV_SCOPE_BUDGET), scope },
  });
  return out;
}
