// The attention policy's one schema. Everything else follows from it: the wire shape the HTTP
// APIs take (snake_case; shared/platform/http registers it in the OpenAPI document), the
// defaults a request leaves out (shared/inference/defaults.ts, written in with .default), the
// engine's TypeScript types (the same fields, camelCase and complete) and the object the
// binding hands the native addon. The addon parses exactly these fields (native/src/addon_policy.cc;
// test/engine/policy-schema.test.ts checks its list against this one), so a new field is one edit here
// plus the kernel that uses it. Plain zod (no HTTP library): the OpenAPI text is zod metadata.
import { z } from "zod";

import { POLICY_DEFAULTS as D } from "../defaults.ts";

export const POLICY_KINDS = ["full", "omnikv", "scope", "omnikv+scope", "streaming", "h2o", "rounds"] as const;
export type PolicyKind = (typeof POLICY_KINDS)[number];

/** The sub-objects each kind reads; any other is refused (it would be silently ignored). */
export const POLICY_PARTS = {
  full: [],
  omnikv: ["omnikv"],
  scope: ["scope"],
  "omnikv+scope": ["omnikv", "scope"],
  streaming: ["streaming"],
  h2o: ["h2o"],
  rounds: ["rounds"],
} as const satisfies Record<PolicyKind, readonly string[]>;

const MAX_TOKENS = 1 << 22;
const MAX_LAYER = 4096;
const Count = z.number().int().min(1).max(MAX_TOKENS);
/** Physical reclamation (scope, streaming, h2o: their evictions are final). */
const reclaim = (dflt: boolean) =>
  z.boolean().default(dflt).meta({
    description:
      "Free evicted tokens' KV rows for reuse, so the sequence holds the policy's bound, not its whole output: the same tokens; the sequence then takes no further prompt (a session's next turn recomputes its prompt)",
  });
/** A token count, or a fraction of the prompt in (0, 1). */
const Budget = z
  .number()
  .gt(0)
  .max(MAX_TOKENS)
  .refine((b) => b < 1 || Number.isInteger(b), "a budget is a whole number of tokens, or a fraction of the prompt in (0, 1)");

export const OmniKvSpec = z
  .strictObject({
    filter_layers: z
      .array(z.number().int().min(0).max(MAX_LAYER))
      .min(1)
      .max(8)
      .optional()
      .meta({ description: "1 to 8 layers, increasing. Default: the model's calibrated filter layers" }),
    budget: Budget.default(D.omnikv.budget).meta({
      description: "Prompt tokens each filter layer keeps, or a fraction of the prompt",
      example: 512,
    }),
    selector: z
      .enum(["last", "last_softmax", "uniform", "exp"])
      .default(D.omnikv.selector)
      .meta({ description: "How the filter layers score tokens: last (OmniKV's), last_softmax, or the window selectors uniform and exp" }),
    window: z
      .number()
      .int()
      .min(1)
      .max(64)
      .default(D.omnikv.window)
      .meta({ description: "Queries the uniform and exp selectors combine, the current one included" }),
    guard: z.boolean().default(D.omnikv.guard).meta({ description: "The layer after each filter layer stays dense" }),
    lazy_iou: z
      .number()
      .min(0)
      .lt(1)
      .default(D.omnikv.lazy_iou)
      .meta({ description: "Reuse the previous selection when the new one overlaps it more than this (0 = off)" }),
    offload: z
      .boolean()
      .default(D.omnikv.offload)
      .meta({ description: "Keep the sparse layers' KV in the host bank; each selection is one packed gather per filter layer" }),
  })
  .meta({ description: "OmniKV: filter layers pick the prompt tokens the sparse layers after them attend to" });

export const ScopeSpec = z
  .strictObject({
    mode: z.enum(["slide", "adaptive", "discontinuous"]).default(D.scope.mode).meta({
      description:
        "slide: the whole budget from the start; adaptive: grows over max_output; discontinuous: adaptive, re-selecting less often",
    }),
    beta1: Count.default(D.scope.beta1).meta({ description: "Selected earlier generated tokens" }),
    beta2: Count.default(D.scope.beta2).meta({ description: "Most recent generated tokens, always kept" }),
    max_output: Count.optional().meta({ description: "T, the planned output length. Default: the request's max_tokens" }),
    alpha1: z.number().int().min(0).max(MAX_TOKENS).default(D.scope.alpha1).meta({
      description:
        "Prompt pool (kind scope): 0 keeps the whole prompt; else the alpha1 prompt tokens the last alpha2 attend to most, per layer and KV head. Needs the prompt's queries: after a KV handoff the prompt is kept whole",
    }),
    alpha2: z.number().int().min(1).max(64).default(D.scope.alpha2).meta({ description: "The prompt pool's observation window" }),
    reclaim: reclaim(D.scope.reclaim),
  })
  .meta({ description: "SCOPE: a budget of generated tokens per layer and KV head" });

export const StreamingSpec = z
  .strictObject({
    sinks: z
      .number()
      .int()
      .min(0)
      .max(MAX_TOKENS)
      .default(D.streaming.sinks)
      .meta({ description: "First tokens always kept (attention sinks)" }),
    window: Count.default(D.streaming.window).meta({ description: "Most recent tokens kept" }),
    reclaim: reclaim(D.streaming.reclaim),
  })
  .meta({ description: "StreamingLLM baseline: the first sinks tokens plus the most recent window" });

export const H2oSpec = z
  .strictObject({
    budget: z
      .number()
      .int()
      .min(2)
      .max(MAX_TOKENS)
      .default(D.h2o.budget)
      .meta({ description: "Tokens kept per layer and KV head, more than recent" }),
    recent: Count.default(D.h2o.recent).meta({ description: "Most recent tokens always kept, at least 1" }),
    reclaim: reclaim(D.h2o.reclaim),
  })
  .refine((h) => h.budget > h.recent, { message: "h2o: recent must be >= 1 and budget larger than recent", path: ["budget"] })
  .meta({
    description: "Heavy-Hitter Oracle baseline: per layer and KV head, the recent newest tokens plus the heavy hitters, budget in all",
  });

export const RoundsSpec = z
  .strictObject({
    watershed_layer: z
      .number()
      .int()
      .min(0)
      .max(MAX_LAYER)
      .optional()
      .meta({ description: "L_w. Default: the model's calibrated watershed (none is known for SmolLM2-135M)" }),
    starts: z.array(z.number().int().min(0).max(MAX_TOKENS)).min(1).max(4096).optional().meta({
      description:
        "First token of each round, from 0; the last is the current round. Default for a chat request: the template's system part, then one round per user message",
    }),
    top_k: z.number().int().min(0).max(4096).default(D.rounds.top_k).meta({
      description: "Earlier rounds kept besides round 0 (always kept, as is the current round); 0 = adaptive, those above mean + std",
    }),
  })
  .meta({
    description:
      "Round Attention: whole earlier conversation rounds, picked at the watershed layer by the question's attention; round 0 (a chat's system part) and the current round always",
  });

/** Each sub-object's schema, by its key (the key is also the kind that reads it alone). */
export const POLICY_PART_SCHEMAS = {
  omnikv: OmniKvSpec,
  scope: ScopeSpec,
  streaming: StreamingSpec,
  h2o: H2oSpec,
  rounds: RoundsSpec,
} as const;
export type PolicyPart = keyof typeof POLICY_PART_SCHEMAS;

const unknownKind = `unknown policy: give one of ${POLICY_KINDS.join(", ")}, or an object { kind, ... } with one of those kinds`;

const PolicyObject = z
  .strictObject({
    kind: z.enum(POLICY_KINDS, { error: unknownKind }),
    omnikv: OmniKvSpec.optional(),
    scope: ScopeSpec.optional(),
    streaming: StreamingSpec.optional(),
    h2o: H2oSpec.optional(),
    rounds: RoundsSpec.optional(),
  })
  .superRefine((o, ctx) => {
    const parts: readonly string[] = POLICY_PARTS[o.kind] ?? [];
    for (const key of Object.keys(POLICY_PART_SCHEMAS)) {
      if (o[key as PolicyPart] !== undefined && !parts.includes(key)) {
        ctx.addIssue({
          code: "custom",
          path: [key],
          message: `policy.${key} does not apply to kind ${o.kind}${parts.length ? ` (it reads ${parts.join(", ")})` : ""}`,
        });
      }
    }
    if (o.kind === "omnikv+scope" && o.scope?.reclaim) {
      ctx.addIssue({
        code: "custom",
        path: ["scope", "reclaim"],
        message: "scope.reclaim is for kind scope: omnikv+scope's selectors score evicted generated tokens, so their rows stay",
      });
    }
  });

export const PolicySpecSchema = z
  .union([z.enum(POLICY_KINDS), PolicyObject], {
    // Without this an unknown kind reads "Invalid input".
    error: (iss) => (iss.code === "invalid_union" ? unknownKind : undefined),
  })
  .meta({
    description:
      "How decode steps attend (prefill is always full): a kind with the model's defaults, or an object { kind, <sub-object of that kind> }. omnikv: filter layers pick prompt tokens; scope: generated-token budget; rounds: Round Attention picks whole earlier conversation rounds; streaming and h2o are baselines.",
    example: { kind: "omnikv", omnikv: { budget: 512 } },
  });

// A policy has three forms, one type each: the spec a request gives (PolicySpec, the wire's
// snake_case), the policy resolved for a model and a prompt (ResolvedPolicy: camelCase, every field
// present; what the addon runs) and what a caller of the engine gives it (AttentionPolicy: a
// resolved policy, or one with the defaulted fields left out for the binding to fill in).

/** A policy as a request gives it (fields left out take their defaults). */
export type PolicySpec = z.input<typeof PolicySpecSchema>;

// The engine's shapes: the schema's output with camelCase keys, every field present.
type Camel<S extends string> = S extends `${infer H}_${infer T}` ? `${H}${Capitalize<Camel<T>>}` : S;
type EngineShape<T> = { [K in keyof T as Camel<K & string>]-?: Exclude<T[K], undefined> };
/** Fields without a default (they depend on the model or the request): a caller of the engine gives them. */
type NoDefault<T> = { [K in keyof T]-?: object extends Pick<T, K> ? K : never }[keyof T];
/** What a caller of the engine gives: the fields without a default, any of the others. */
type EngineInput<T> = Partial<EngineShape<T>> & EngineShape<Pick<T, NoDefault<T>>>;

type Out<P extends PolicyPart> = z.output<(typeof POLICY_PART_SCHEMAS)[P]>;
export type OmniKvOptions = EngineShape<Out<"omnikv">>;
export type ScopeOptions = EngineShape<Out<"scope">>;
export type StreamingOptions = EngineShape<Out<"streaming">>;
export type H2oOptions = EngineShape<Out<"h2o">>;
export type RoundsOptions = EngineShape<Out<"rounds">>;

type Policy<Parts extends { [P in PolicyPart]?: unknown }> = {
  [K in PolicyKind]: { kind: K } & { [P in (typeof POLICY_PARTS)[K][number]]: Parts[P] };
}[PolicyKind];

/** A policy resolved for a model and a prompt, every field present: what the native addon takes (it fills in nothing). */
export type ResolvedPolicy = Policy<{
  omnikv: OmniKvOptions;
  scope: ScopeOptions;
  streaming: StreamingOptions;
  h2o: H2oOptions;
  rounds: RoundsOptions;
}>;
/** A policy as a caller of the engine gives it: the defaulted fields may be left out (completePolicy fills them in). */
export type AttentionPolicy = Policy<{
  omnikv: EngineInput<Out<"omnikv">>;
  scope: EngineInput<Out<"scope">>;
  streaming: EngineInput<Out<"streaming">>;
  h2o: EngineInput<Out<"h2o">>;
  rounds: EngineInput<Out<"rounds">>;
}>;

const camel = (k: string) => k.replace(/_([a-z])/g, (_, c: string) => c.toUpperCase());
const snake = (k: string) => k.replace(/[A-Z]/g, (c) => `_${c.toLowerCase()}`);
const mapKeys = (o: object, f: (k: string) => string) => Object.fromEntries(Object.entries(o).map(([k, v]) => [f(k), v]));

/** A sub-object parsed by its schema (defaults written in), with the engine's camelCase keys. */
export function engineFields<P extends PolicyPart>(
  part: P,
  wire: z.input<(typeof POLICY_PART_SCHEMAS)[P]> | undefined,
): EngineShape<Out<P>> {
  return mapKeys(POLICY_PART_SCHEMAS[part].parse(wire ?? {}), camel) as EngineShape<Out<P>>;
}

/** The engine's field names of each sub-object, as the native addon must parse them. */
export function engineFieldNames(): Record<PolicyPart, string[]> {
  return Object.fromEntries(Object.entries(POLICY_PART_SCHEMAS).map(([part, s]) => [part, Object.keys(s.shape).map(camel)])) as Record<
    PolicyPart,
    string[]
  >;
}

/**
 * An engine policy with every default written in, validated by the schema; TypeError naming the
 * field when a value is out of range or a key unknown (the same error class the addon throws).
 */
export function completePolicy(p: AttentionPolicy): ResolvedPolicy {
  const wire: Record<string, unknown> = { kind: p.kind };
  for (const [key, value] of Object.entries(p)) {
    if (key !== "kind") wire[key] = value !== null && typeof value === "object" ? mapKeys(value, snake) : value;
  }
  return policyFromWire(wire);
}

/**
 * A resolved policy in the wire's shape (snake_case: a handle's resolved_policy) in the engine's,
 * validated by the schema as completePolicy validates; a field without a default that it lacks
 * (filter_layers, max_output, a rounds' watershed_layer or starts) is the addon's to refuse.
 */
export function policyFromWire(wire: Record<string, unknown>): ResolvedPolicy {
  const parsed = PolicyObject.safeParse(wire);
  if (!parsed.success) {
    const issue = parsed.error.issues[0]!;
    throw new TypeError(`policy.${issue.path.map((k) => (typeof k === "string" ? camel(k) : String(k))).join(".")}: ${issue.message}`);
  }
  const out: Record<string, unknown> = { kind: parsed.data.kind };
  for (const part of POLICY_PARTS[parsed.data.kind]) out[part] = mapKeys(parsed.data[part] ?? POLICY_PART_SCHEMAS[part].parse({}), camel);
  return out as ResolvedPolicy;
}
