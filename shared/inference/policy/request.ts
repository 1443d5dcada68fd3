// The attention policy a request asks for (its schema: ./schema.ts) resolved into the engine's
// complete ResolvedPolicy: the schema's defaults, the model's calibrated layers
// (model-defaults.json) and the request's length fill in what the request leaves out, and a
// fractional budget becomes a token count once the prompt length is known. The engine validates
// the result against the model (setPolicy).
import { PolicyError } from "./errors.ts";
import { engineFields, type PolicyKind, type PolicySpec, type ResolvedPolicy } from "./schema.ts";

export { PolicyError } from "./errors.ts";
export { POLICY_KINDS, PolicySpecSchema, policyFromWire, type PolicyKind, type PolicySpec, type ResolvedPolicy } from "./schema.ts";

export interface PolicyLimits {
  /** The model's context in tokens: no budget, window or round start may exceed it. */
  maxContext: number;
  nLayer: number;
}

/**
 * Refuses (PolicyError naming the field) token counts beyond the model's context and layers it does
 * not have: the checks a spec needs before any work, which the schema cannot make without the model.
 */
export function checkPolicyLimits(spec: PolicySpec | undefined, { maxContext, nLayer }: PolicyLimits): void {
  if (typeof spec !== "object") return;
  const tokens: [string, number | undefined][] = [
    ["omnikv.budget", spec.omnikv?.budget],
    ["scope.beta1", spec.scope?.beta1],
    ["scope.beta2", spec.scope?.beta2],
    ["scope.max_output", spec.scope?.max_output],
    ["scope.alpha1", spec.scope?.alpha1],
    ["streaming.sinks", spec.streaming?.sinks],
    ["streaming.window", spec.streaming?.window],
    ["h2o.budget", spec.h2o?.budget],
    ["h2o.recent", spec.h2o?.recent],
    ["rounds.starts", spec.rounds?.starts === undefined ? undefined : Math.max(...spec.rounds.starts)],
  ];
  for (const [field, v] of tokens) {
    if (v !== undefined && v > maxContext) {
      throw new PolicyError(`policy.${field} is ${v}, beyond the model's context of ${maxContext} tokens`, `policy.${field}`);
    }
  }
  const layers: [string, string, number | undefined][] = [
    ["omnikv.filter_layers", "filter layer", spec.omnikv?.filter_layers === undefined ? undefined : Math.max(...spec.omnikv.filter_layers)],
    ["rounds.watershed_layer", "watershed layer", spec.rounds?.watershed_layer],
  ];
  for (const [field, what, v] of layers) {
    if (v !== undefined && v >= nLayer)
      throw new PolicyError(`policy.${field}: ${what} ${v} is not a layer of this model (0 to ${nLayer - 1})`, `policy.${field}`);
  }
}

/** What the model gives a policy that leaves them out: its calibrated layers (model-defaults.json). */
export interface PolicyCalibration {
  /** The model's calibrated OmniKV filter layers, if it has any. */
  filterLayers?: readonly number[];
  /** The model's calibrated Round Attention watershed layer, if one was found. */
  watershedLayer?: number | null;
}

export interface PolicyContext extends PolicyCalibration {
  /** First token of each round of a chat prompt (one per user message), for `rounds`. */
  roundStarts?: readonly number[];
  promptTokens: number;
  maxTokens: number;
}

export function policyKind(spec: PolicySpec | undefined): PolicyKind {
  return spec === undefined ? "full" : typeof spec === "string" ? spec : spec.kind;
}

// What a spec leaves to the model or the prompt, or PolicyError when neither has it.
function filterLayersOf(given: readonly number[] | undefined, cal: PolicyCalibration): readonly number[] {
  const layers = given ?? cal.filterLayers;
  if (!layers)
    throw new PolicyError("this model has no calibrated OmniKV filter layers: give omnikv.filter_layers (npm run calibrate measures them)");
  return layers;
}
function watershedOf(given: number | undefined, cal: PolicyCalibration): number {
  const layer = given ?? cal.watershedLayer ?? undefined;
  if (layer === undefined)
    throw new PolicyError("this model has no calibrated watershed layer (npm run calibrate found none): give rounds.watershed_layer");
  return layer;
}
function roundStartsOf(given: readonly number[] | undefined, prompt: readonly number[] | undefined): readonly number[] {
  const starts = given ?? prompt;
  if (!starts)
    throw new PolicyError(
      "rounds needs rounds.starts (the first token of each round) or a chat request, whose user messages start the rounds",
    );
  return starts;
}

/**
 * Refuses (PolicyError) before any work what a spec shows it cannot run with on this model, without
 * resolving it: its limits (checkPolicyLimits), a calibration the model lacks, rounds that neither
 * the spec nor a chat (`chat`: its user messages start them) gives.
 */
export function checkPolicySpec(spec: PolicySpec | undefined, model: PolicyLimits & PolicyCalibration, { chat }: { chat: boolean }): void {
  checkPolicyLimits(spec, model);
  const o = typeof spec === "object" ? spec : { kind: policyKind(spec) };
  if (o.kind === "omnikv" || o.kind === "omnikv+scope") filterLayersOf(o.omnikv?.filter_layers, model);
  if (o.kind === "rounds") {
    watershedOf(o.rounds?.watershed_layer, model);
    roundStartsOf(o.rounds?.starts, chat ? [0] : undefined);
  }
}

/**
 * The engine policy a request's spec means for this model and prompt, every field filled in (the
 * schema's defaults, the model's calibration, the request's length); PolicyError when it cannot be made.
 */
export function resolvePolicy(spec: PolicySpec | undefined, ctx: PolicyContext): ResolvedPolicy {
  const o = typeof spec === "object" ? spec : { kind: policyKind(spec) };
  const omnikv = () => {
    const fields = engineFields("omnikv", o.omnikv);
    const filterLayers = filterLayersOf(fields.filterLayers, ctx);
    const b = fields.budget;
    return { ...fields, filterLayers: [...filterLayers], budget: b < 1 ? Math.max(1, Math.round(b * ctx.promptTokens)) : b };
  };
  const scope = () => {
    const fields = engineFields("scope", o.scope);
    return { ...fields, maxOutput: fields.maxOutput ?? ctx.maxTokens };
  };
  switch (o.kind) {
    case "full":
      return { kind: "full" };
    case "omnikv":
      return { kind: "omnikv", omnikv: omnikv() };
    case "scope":
      return { kind: "scope", scope: scope() };
    case "omnikv+scope":
      return { kind: "omnikv+scope", omnikv: omnikv(), scope: scope() };
    case "streaming":
      return { kind: "streaming", streaming: engineFields("streaming", o.streaming) };
    case "h2o":
      return { kind: "h2o", h2o: engineFields("h2o", o.h2o) };
    case "rounds": {
      const fields = engineFields("rounds", o.rounds);
      const watershedLayer = watershedOf(fields.watershedLayer, ctx);
      const starts = roundStartsOf(fields.starts, ctx.roundStarts);
      return { kind: "rounds", rounds: { ...fields, watershedLayer, starts: [...starts] } };
    }
  }
}

/**
 * The spec that ran, in the wire's shape: the resolved engine policy with snake_case keys (every
 * default, calibrated layer and budget written in). Responses report it; a handle carries it
 * (policyFromWire reads it back).
 */
export function resolvedSpec(policy: ResolvedPolicy): Exclude<PolicySpec, string> {
  const out: Record<string, unknown> = { kind: policy.kind };
  for (const [key, value] of Object.entries(policy)) {
    if (key !== "kind")
      out[key] = Object.fromEntries(
        Object.entries(value as object).map(([k, v]) => [k.replace(/[A-Z]/g, (c) => `_${c.toLowerCase()}`), v]),
      );
  }
  return out as Exclude<PolicySpec, string>;
}

/**
 * The layer groups a prefill packs for a policy, from the engine's per-layer roles: under OmniKV
 * one group of the layers that stay dense (dense, filter, guard) and one per filter layer of the
 * sparse layers that follow it (what one packed gather per filter layer reads); otherwise one
 * group of every layer.
 */
export function layerGroupsFromRoles(roles: readonly string[], groups: readonly number[], nLayer: number): number[][] {
  const all = Array.from({ length: nLayer }, (_, i) => i);
  if (roles.length === 0) return [all];
  const dense = all.filter((l) => roles[l] !== "sparse");
  const sparse = new Map<number, number[]>();
  for (const l of all) {
    if (roles[l] === "sparse") sparse.set(groups[l]!, [...(sparse.get(groups[l]!) ?? []), l]);
  }
  return [dense, ...[...sparse.keys()].sort((a, b) => a - b).map((g) => sparse.get(g)!)].filter((g) => g.length > 0);
}
