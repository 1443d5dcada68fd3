// The decode policies bench/longctx compares, at the settings the issue names.
import type { AttentionPolicy } from "../../shared/inference/engine/native.ts";

export function benchPolicies(filterLayers: number[], steps: number): Array<{ id: string; policy: AttentionPolicy }> {
  const omnikv = (budget: number): AttentionPolicy => ({ kind: "omnikv", omnikv: { filterLayers, budget } });
  return [
    { id: "full", policy: { kind: "full" } },
    { id: "omnikv k=256", policy: omnikv(256) },
    { id: "omnikv k=1024", policy: omnikv(1024) },
    { id: "omnikv k=2048", policy: omnikv(2048) },
    // Without the guard layer every global layer after the filter layer is sparse (few-global-layer models: Gemma 3).
    { id: "omnikv k=1024 no guard", policy: { kind: "omnikv", omnikv: { filterLayers, budget: 1024, guard: false } } },
    { id: "scope 256+256", policy: { kind: "scope", scope: { mode: "slide", beta1: 256, beta2: 256, maxOutput: steps } } },
  ];
}
