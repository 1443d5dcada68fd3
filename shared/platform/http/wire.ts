// Wire schemas shared by the prefill and decode services: the prefill request, the handle it
// answers with (what decode needs to find, verify and load the KV), and sampling options.
import { z } from "@hono/zod-openapi";
import { PolicySpecSchema as PolicySpec } from "../../inference/policy/schema.ts";
import { MAX_HANDLE_CHUNKS } from "../registry/errors.ts";
import { MAX_TOKENS_DEFAULTS, SAMPLING_DEFAULTS } from "../../inference/defaults.ts";
import { PLACEMENT_CAUSES } from "../metrics/definitions.ts";
import { MAX_TOP_K } from "../../inference/engine/sampler.ts";

const ID = /^[A-Za-z0-9][A-Za-z0-9._:-]{0,127}$/;
export const Identifier = z.string().regex(ID, "1-128 chars of letters, digits and . _ : - (not starting with a symbol)");
/** A client's own request id: no ':' (that separates the API key's namespace from it, see shared/platform/auth/tenant.ts). */
export const ClientRequestId = z
  .string()
  .regex(/^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$/, "1-64 chars of letters, digits and . _ - (not starting with a symbol)");
/**
 * Caps on arrays, checked before their elements (zod sizes an array first), so a 4 MiB body of
 * ids or messages costs no per-element validation: the largest context the wire carries (the
 * model's own context is checked after), and messages well past what any context holds.
 */
export const MAX_WIRE_TOKENS = 1 << 17;
export const MAX_WIRE_MESSAGES = 1 << 16;
export const TokenIds = z.array(z.number().int().min(0).max(0x7fff_ffff)).min(1).max(MAX_WIRE_TOKENS);

/** A session id as clients send it (x-session-id, session_id): namespaced by the key in the registry. */
export const SessionId = z
  .string()
  .regex(/^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$/, "1-128 chars of letters, digits and . _ - (not starting with a symbol)");

export const ChatMessageSchema = z
  .object({
    role: z.enum(["system", "user", "assistant"]),
    content: z.string(),
  })
  .openapi("ChatMessage");

/** Sampling options, in OpenAI's names, with ctxbank's own routes' defaults. top_k is an extension (0 = off). */
export const SamplingFields = {
  temperature: z
    .number()
    .min(0)
    .max(10)
    .optional()
    .openapi({ description: "0 = greedy", example: 0.7, default: SAMPLING_DEFAULTS.api.temperature }),
  top_p: z.number().gt(0).max(1).optional().openapi({ default: SAMPLING_DEFAULTS.api.topP }),
  top_k: z
    .number()
    .int()
    .min(0)
    .max(MAX_TOP_K)
    .optional()
    .openapi({ description: "extension; 0 = no limit", default: SAMPLING_DEFAULTS.api.topK }),
  seed: z
    .number()
    .int()
    .min(0)
    .max(2 ** 32 - 1)
    .optional(),
};

export const SamplingSchema = z.object({
  temperature: z.number(),
  top_p: z.number(),
  top_k: z.number().int().min(0).max(MAX_TOP_K),
  seed: z.number().int(),
});
export type WireSampling = z.infer<typeof SamplingSchema>;

/**
 * The attention policy in the OpenAPI document: the inference library's plain-zod schema
 * (descriptions and defaults are its metadata), registered here as the AttentionPolicy component.
 * Each use describes itself with a wrapper, so no route's text overwrites the component's.
 */
// (zod v4 copies .openapi onto a schema when it is made; the inference library may have made this
// one before @hono/zod-openapi added the method, so it is called from the prototype.)
export const PolicySpecSchema = z.ZodType.prototype.openapi.call(PolicySpec, "AttentionPolicy") as typeof PolicySpec;
/**
 * An optional policy field with its own description. The field carries the component's id, so
 * whichever use the document meets first would give the AttentionPolicy component its text:
 * newApp() (app.ts) registers the component itself first, and each field then adds its own.
 */
export const policyField = (description: string) => PolicySpecSchema.optional().openapi({ description });
/** The policy a request ran under: every default, calibrated layer and budget written in. */
export const ResolvedPolicySchema = z.record(z.string(), z.unknown()).openapi("ResolvedPolicy", {
  description:
    "The policy that ran, after defaults and calibration: { kind, <its sub-objects with every field> }, in the shape AttentionPolicy takes",
  example: { kind: "h2o", h2o: { budget: 512, recent: 128 } },
});

/** ctxbank's own request bodies are strict: a key it does not know is refused (400 unknown_field) rather than ignored. */
export const PrefillRequestSchema = z
  .strictObject({
    prompt: z
      .string()
      .min(1)
      .optional()
      .openapi({ description: "Plain text, tokenized as is (no chat template)", example: "Once upon a time" }),
    messages: z
      .array(ChatMessageSchema)
      .min(1)
      .max(MAX_WIRE_MESSAGES)
      .optional()
      .openapi({ description: "A conversation, rendered with the model's chat template" }),
    prompt_token_ids: TokenIds.optional().openapi({ description: "Token ids, used as they are" }),
    request_id: ClientRequestId.optional().openapi({
      description:
        "Default: a fresh id. Kept in the API key's namespace: the handle's request_id is `<key id>:<request_id>` (unchanged on a keyless server)",
    }),
    session_id: Identifier.optional(),
    round_id: z.number().int().min(0).max(0x7fff_ffff).optional(),
    max_tokens: z
      .number()
      .int()
      .min(1)
      .max(1 << 22)
      .optional()
      .openapi({
        description: "Tokens the decode will generate; checked against the context before computing",
      }),
    policy: policyField("How the decode will attend; the KV chunks are grouped by its layer roles. Default: the server's --policy"),
    stream: z.boolean().optional().openapi({
      description: "Answer NDJSON: the handle's start once the first chunk is committed, each chunk id as it commits, then the handle",
    }),
    ...SamplingFields,
  })
  .refine((b) => [b.prompt, b.messages, b.prompt_token_ids].filter((x) => x !== undefined).length === 1, {
    message: "give exactly one of prompt, messages or prompt_token_ids",
    path: ["prompt"],
  })
  .openapi("PrefillRequest");
export type PrefillRequest = z.input<typeof PrefillRequestSchema>;

/**
 * The largest prompt state a handle carries (decoded bytes; base64 adds a third): with the largest
 * prompt_token_ids it still fits a 4 MiB request body and a streamed handle's line. A larger one
 * is left out, and the decode's answer warns of what its policy misses.
 */
export const MAX_PROMPT_STATE_BYTES = 2 << 20;

export const HandleSchema = z
  .object({
    request_id: Identifier,
    first_token: z.number().int().min(0).openapi({ description: "Sampled from the prefill's last logits" }),
    chunk_ids: z
      .array(z.uuid())
      .min(1)
      .max(MAX_HANDLE_CHUNKS)
      .openapi({ description: `At most ${MAX_HANDLE_CHUNKS} (layer groups x token blocks)` }),
    shard_id: Identifier,
    shard_epoch: z.number().int().min(1),
    model_fingerprint: z.string().regex(/^[0-9a-f]{64}$/),
    prompt_tokens: z.number().int().min(1),
    prompt_token_ids: TokenIds.openapi({ description: "For a local recompute when the KV cannot be loaded" }),
    layer_groups: z.array(z.array(z.number().int().min(0))).min(1),
    policy: policyField("The policy the chunks were grouped for; decode uses it unless its request names another"),
    resolved_policy: ResolvedPolicySchema.optional().openapi({
      description: "What that policy resolved to for this prompt (defaults, calibrated layers, budgets)",
    }),
    prompt_state: z
      .base64()
      .max(Math.ceil(MAX_PROMPT_STATE_BYTES / 3) * 4)
      .optional()
      .openapi({
        description:
          "What the policy remembers of the prompt's queries (SCOPE's prompt pool, the OmniKV window selectors), base64; absent when it remembers none. The decode loads it after the KV",
      }),
    block_tokens: z.number().int().min(1),
    rounds_picked: z.array(z.number().int().min(0)).max(4096).optional().openapi({
      description:
        "Round Attention: the earlier rounds the prefill's pick keeps (indices into the policy's starts). A decode that runs the very policy of resolved_policy reads, above the watershed layer, only these rounds' chunks and the current round's",
    }),
    sampling: SamplingSchema,
    prefill_ms: z.number().min(0),
    queue_ms: z
      .number()
      .min(0)
      .max(86_400_000)
      .optional()
      .openapi({ description: "How long the prefill waited for a place before computing" }),
    expires_at: z.string().openapi({ description: "When unread chunks may be reclaimed (ISO 8601)" }),
  })
  .openapi("Handle");
export type Handle = z.infer<typeof HandleSchema>;

export const StopSchema = z.union([z.string().min(1), z.array(z.string().min(1)).max(16)]).optional();

export const DecodeRequestSchema = z
  .strictObject({
    handle: HandleSchema,
    max_tokens: z
      .number()
      .int()
      .min(1)
      .max(1 << 22)
      .optional()
      .openapi({ description: `Default ${MAX_TOKENS_DEFAULTS.generate} (less if the context is short)` }),
    ...SamplingFields,
    stop: StopSchema,
    stream: z.boolean().optional(),
    policy: policyField("How decode steps attend. Default: the handle's policy"),
    on_kv_failure: z.enum(["fail", "recompute"]).optional().openapi({
      description: "fail (default): answer 502 kv_load_failed at once; recompute: prefill the handle's prompt locally",
    }),
  })
  .openapi("DecodeRequest");
export type DecodeRequest = z.infer<typeof DecodeRequestSchema>;

export const UsageSchema = z.object({
  prompt_tokens: z.number().int(),
  completion_tokens: z.number().int(),
  total_tokens: z.number().int(),
});

export const KvLoadStatsSchema = z
  .object({
    transport: z.enum(["http", "shm", "ucx", "recompute", "in_process", "local", "none"]).openapi({
      description:
        "in_process: `serve` handed the prefill's sequence to the decode (nothing copied); local: the decode computed the prompt itself (or its part a session did not hold)",
    }),
    chunks: z.number().int(),
    bytes: z.number().int(),
    ms: z.number(),
    recomputed: z.boolean(),
    error: z.string().optional(),
    prompt_bytes: z.number().int().optional().openapi({
      description:
        "The prompt's chunks, every layer and round: what the load would have moved without Round Attention's pick (bytes < prompt_bytes when it left rounds behind)",
    }),
  })
  .openapi("KvLoadStats");

/** Per-request latency figures and SLO verdicts, on every finished generation (an extension to OpenAI's shapes). */
export const CtxbankExtensionSchema = z
  .object({
    timings: z.object({
      ttft_ms: z.number().openapi({ description: "Arrival at the route to the first token emitted" }),
      tpot_ms: z.number().nullable().openapi({ description: "(e2e - ttft) / (tokens - 1); null with one token" }),
      e2e_ms: z.number().openapi({ description: "Arrival to the last token" }),
      queue_ms: z.number().openapi({ description: "Waiting for a place: prefill queue + decode batch queue" }),
      itl_ms_mean: z.number().nullable().openapi({ description: "Inter-token gaps (tokens - 1 of them); null with one token" }),
      itl_ms_p50: z.number().nullable(),
      itl_ms_p90: z.number().nullable(),
      itl_ms_max: z.number().nullable(),
      output_tokens: z.number().int(),
    }),
    slo: z
      .object({
        ttft: z.boolean().optional(),
        tpot: z.boolean().optional(),
        e2e: z.boolean().optional(),
        all: z.boolean().openapi({ description: "Every configured SLO met (what goodput counts)" }),
      })
      .openapi({ description: "Verdict per configured SLO: true = met. A one-token answer cannot miss the TPOT objective." }),
    handoff: z
      .object({
        path: z.enum(["in_process", "shard", "local"]).openapi({
          description:
            "in_process: prefill and decode in one process (`serve`), the sequence handed over; shard: the KV written by the prefill and read by the decode; local: the decode prefilled the prompt itself (see prefill)",
        }),
        warnings: z.array(z.string()).optional().openapi({
          description:
            "What the decode could not have from the prompt across processes (e.g. SCOPE's prompt pool), and what it did instead",
        }),
        bytes: z.number().int().optional().openapi({ description: "KV bytes the decode read (shard path)" }),
        prompt_bytes: z.number().int().optional().openapi({
          description:
            "Under Round Attention: the prompt's KV in chunks of every layer and round, what the read would have been without the prefill's pick",
        }),
      })
      .optional(),
    policy: ResolvedPolicySchema.optional().openapi({ description: "The attention policy that ran, every default and budget written in" }),
    prefill: z
      .object({
        where: z.enum(["in_process", "remote", "local"]),
        cause: z.enum(PLACEMENT_CAUSES).openapi({ description: "The reason's kind (the label of ctxbank:prefill_placements_total)" }),
        reason: z
          .string()
          .openapi({ description: "Why there (conditional disaggregation: the uncached part's size, the prefill pool's load, a session)" }),
      })
      .optional(),
    session: z
      .object({
        id: z.string(),
        reused_tokens: z.number().int().openapi({ description: "Prompt tokens whose KV the session held (not computed again)" }),
        turns: z.number().int(),
      })
      .optional()
      .openapi({ description: "The conversation this request was a turn of (x-session-id, session_id, or a Responses API chain)" }),
  })
  .openapi("CtxbankExtension");
export type CtxbankExtension = z.infer<typeof CtxbankExtensionSchema>;

export const DecodeResultSchema = z
  .object({
    request_id: z.string(),
    text: z.string(),
    token_ids: z.array(z.number().int()),
    finish_reason: z.enum(["stop", "length", "stop_string"]),
    usage: UsageSchema,
    kv: KvLoadStatsSchema,
    ttft_ms: z.number(),
    total_ms: z.number(),
    ctxbank: CtxbankExtensionSchema,
  })
  .openapi("DecodeResult");
export type DecodeResult = z.infer<typeof DecodeResultSchema>;

/** Sampling options as the engine's Sampler takes them, from wire fields over defaults. */
export function samplingOptions(
  o: { temperature?: number | undefined; top_p?: number | undefined; top_k?: number | undefined; seed?: number | undefined },
  defaults: WireSampling,
): { temperature: number; topP: number; topK: number; seed: number } {
  return {
    temperature: o.temperature ?? defaults.temperature,
    topP: o.top_p ?? defaults.top_p,
    topK: o.top_k ?? defaults.top_k,
    seed: o.seed ?? defaults.seed,
  };
}
