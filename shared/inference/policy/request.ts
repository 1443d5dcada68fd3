// The attention policy a request asks for, on the wire (snake_case, as the HTTP APIs take it),
// and its resolution into the engine's AttentionPolicy: the model's calibrated filter layers
// (model-defaults.json) fill in what the request leaves out, and a fractional budget becomes a
// token count once the prompt length is known. The engine validates the result (setPolicy).
import { z } from "@hono/zod-openapi";
import type { AttentionPolicy } from "../engine/native.ts";
import { CtxbankError } from "../errors.ts";

export const POLICY_KINDS = ["full", "omnikv", "scope", "omnikv+scope", "streaming", "h2o", "rounds"] as const;
export type PolicyKind = (typeof POLICY_KINDS)[number];

const Count = z.number().int().min(1).max(1 << 22);
/** A token count, or a fraction of the prompt in (0, 1). */
const Budget = z
  .number()
  .gt(0)
  .max(1 << 22)
  .refine((b) => b < 1 || Number.isInteger(b), "a budget is a whole number of tokens, or a fraction of the prompt in (0, 1)");

/** What resolvePolicy fills in when a request leaves a field out. */
export const POLICY_DEFAULTS = { omnikvBudget: 1024, scopeBeta: 256, streamingSinks: 4, streamingWindow: 1020, h2oBudget: 1024, h2oRecent: 256 } as const;

const OmniKvSpec = z
  .object({
    filter_layers: z
      .array(z.number().int().min(0).max(4096))
      .min(1)
      .max(8)
      .optional()
      .openapi({ description: "1 to 8 layers, increasing. Default: the model's calibrated filter layers" }),
    budget: Budget.optional().openapi({ description: "Prompt tokens each filter layer keeps (default 1024), or a fraction of the prompt", example: 1024 }),
    selector: z.enum(["last", "last_softmax", "uniform", "exp"]).optional().openapi({ description: "How the filter layers score tokens: last (default, OmniKV's), last_softmax, or the window selectors uniform and exp" }),
    window: z.number().int().min(1).max(64).optional().openapi({ description: "Queries the uniform and exp selectors combine, the current one included (default 16)" }),
    guard: z.boolean().optional().openapi({ description: "The layer after each filter layer stays dense (default true)" }),
    lazy_iou: z.number().min(0).lt(1).optional().openapi({ description: "Reuse the previous selection when the new one overlaps it more than this (0 = off)" }),
    offload: z.boolean().optional().openapi({ description: "Keep the sparse layers' KV in the host bank; each selection is one packed gather per filter layer (default false)" }),
  })
  .strict();

const ScopeSpec = z
  .object({
    mode: z.enum(["slide", "adaptive", "discontinuous"]).optional(),
    beta1: Count.optional().openapi({ description: "Selected earlier generated tokens (default 256)" }),
    beta2: Count.optional().openapi({ description: "Most recent generated tokens, always kept (default 256)" }),
    max_output: Count.optional().openapi({ description: "T, the planned output length (default: the request's max_tokens)" }),
    alpha1: z.number().int().min(0).max(1 << 22).optional().openapi({ description: "Prompt pool (kind scope): 0 (default) keeps the whole prompt; else the alpha1 prompt tokens the last alpha2 attend to most, per layer and KV head. Needs the prompt's queries: after a KV handoff the prompt is kept whole" }),
    alpha2: z.number().int().min(1).max(64).optional().openapi({ description: "The prompt pool's observation window (default 8)" }),
  })
  .strict();

export const PolicySpecSchema = z
  .union([
    z.enum(POLICY_KINDS),
    z
      .object({
        kind: z.enum(POLICY_KINDS),
        omnikv: OmniKvSpec.optional(),
        scope: ScopeSpec.optional(),
        streaming: z.object({ sinks: z.number().int().min(0).max(1 << 22).optional(), window: Count.optional() }).strict().optional(),
        h2o: z
          .object({ budget: Count.optional(), recent: Count.optional().openapi({ description: "Most recent tokens always kept, at least 1 (default 256)" }) })
          .strict()
          .optional(),
        rounds: z
          .object({
            watershed_layer: z.number().int().min(0).max(4096).optional().openapi({ description: "L_w; default: the model's calibrated watershed (none is known for SmolLM2-135M)" }),
            starts: z
              .array(z.number().int().min(0).max(1 << 22))
              .min(1)
              .max(4096)
              .optional()
              .openapi({ description: "First token of each round, from 0; the last is the current round. Default: one round per user message of a chat request" }),
            top_k: z.number().int().min(0).max(4096).optional().openapi({ description: "Earlier rounds kept; 0 (default) = adaptive, those above mean + std" }),
          })
          .strict()
          .optional(),
      })
      .strict(),
  ], {
    // Without this an unknown kind reads "Invalid input".
    error: (iss) =>
      iss.code === "invalid_union" ? `unknown policy: give one of ${POLICY_KINDS.join(", ")}, or an object { kind, ... } with one of those kinds` : undefined,
  })
  .openapi("AttentionPolicy", {
    description:
      "How decode steps attend (prefill is always full): a kind with the model's defaults, or an object. omnikv: filter layers pick prompt tokens; scope: generated-token budget; rounds: Round Attention picks whole earlier conversation rounds; streaming and h2o are baselines.",
    example: { kind: "omnikv", omnikv: { budget: 1024 } },
  });
export type PolicySpec = z.infer<typeof PolicySpecSchema>;

/** The policy cannot run on this model (code invalid_policy; param: the field at fault, e.g. "policy.omnikv.budget"). */
export class PolicyError extends CtxbankError<"invalid_policy"> {
  static override readonly codes = ["invalid_policy"] as const;
  override readonly name = "PolicyError";
  constructor(message: string, param = "policy") {
    super("invalid_policy", message, { param });
  }
}

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
    if (v !== undefined && v >= nLayer) throw new PolicyError(`policy.${field}: ${what} ${v} is not a layer of this model (0 to ${nLayer - 1})`, `policy.${field}`);
  }
}

export interface PolicyContext {
  /** The model's calibrated OmniKV filter layers, if it has any. */
  filterLayers?: readonly number[];
  /** The model's calibrated Round Attention watershed layer, if one was found. */
  watershedLayer?: number | null;
  /** First token of each round of a chat prompt (one per user message), for `rounds`. */
  roundStarts?: readonly number[];
  promptTokens: number;
  maxTokens: number;
}

export function policyKind(spec: PolicySpec | undefined): PolicyKind {
  return spec === undefined ? "full" : typeof spec === "string" ? spec : spec.kind;
}

/** The engine policy a request's spec means for this model and prompt; PolicyError when it cannot be made. */
export function resolvePolicy(spec: PolicySpec | undefined, ctx: PolicyContext): AttentionPolicy {
  const o = typeof spec === "object" ? spec : { kind: policyKind(spec) };
  const omnikv = () => {
    const filterLayers = o.omnikv?.filter_layers ?? ctx.filterLayers;
    if (!filterLayers) throw new PolicyError("this model has no calibrated OmniKV filter layers: give omnikv.filter_layers (npm run calibrate measures them)");
    const b = o.omnikv?.budget ?? POLICY_DEFAULTS.omnikvBudget;
    return {
      filterLayers: [...filterLayers],
      budget: b < 1 ? Math.max(1, Math.round(b * ctx.promptTokens)) : b,
      ...(o.omnikv?.selector ? { selector: o.omnikv.selector } : {}),
      ...(o.omnikv?.window === undefined ? {} : { window: o.omnikv.window }),
      ...(o.omnikv?.guard === undefined ? {} : { guard: o.omnikv.guard }),
      ...(o.omnikv?.lazy_iou === undefined ? {} : { lazyIou: o.omnikv.lazy_iou }),
      ...(o.omnikv?.offload === undefined ? {} : { offload: o.omnikv.offload }),
    };
  };
  const scope = () => ({
    mode: o.scope?.mode ?? "slide",
    beta1: o.scope?.beta1 ?? POLICY_DEFAULTS.scopeBeta,
    beta2: o.scope?.beta2 ?? POLICY_DEFAULTS.scopeBeta,
    maxOutput: o.scope?.max_output ?? ctx.maxTokens,
    ...(o.scope?.alpha1 === undefined ? {} : { alpha1: o.scope.alpha1 }),
    ...(o.scope?.alpha2 === undefined ? {} : { alpha2: o.scope.alpha2 }),
  });
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
      return { kind: "streaming", streaming: { sinks: o.streaming?.sinks ?? POLICY_DEFAULTS.streamingSinks, window: o.streaming?.window ?? POLICY_DEFAULTS.streamingWindow } };
    case "h2o":
      return { kind: "h2o", h2o: { budget: o.h2o?.budget ?? POLICY_DEFAULTS.h2oBudget, recent: o.h2o?.recent ?? POLICY_DEFAULTS.h2oRecent } };
    case "rounds": {
      const watershedLayer = o.rounds?.watershed_layer ?? ctx.watershedLayer ?? undefined;
      if (watershedLayer === undefined) throw new PolicyError("this model has no calibrated watershed layer (npm run calibrate found none): give rounds.watershed_layer");
      const starts = o.rounds?.starts ?? ctx.roundStarts;
      if (!starts) throw new PolicyError("rounds needs rounds.starts (the first token of each round) or a chat request, whose user messages start the rounds");
      return { kind: "rounds", rounds: { watershedLayer, starts: [...starts], topK: o.rounds?.top_k ?? 0 } };
    }
  }
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
