// Every default the project applies when a caller leaves a setting out, in one place: sampling,
// the length of an answer, the attention policies' budgets, and the service-level objectives.
// The CLI, the services and the policy schema (shared/inference/policy/schema.ts) read them from
// here; the engine (native/) holds none of its own and is always handed complete configurations.
// test/unit/defaults-single-source.test.ts fails when one of these numbers is written anywhere else.

/** Sampling when a request says nothing, per surface (each keeps its own convention). */
export const SAMPLING_DEFAULTS = {
  /** ctxbank's own routes (/v1/prefill, /v1/decode) and the engine's Sampler: greedy. */
  api: { temperature: 0, topP: 1, topK: 40 },
  /** The OpenAI-compatible routes: OpenAI's own defaults (temperature 1, top_p 1); top_k is an extension. */
  openai: { temperature: 1, topP: 1, topK: 40 },
  /** `ctxbank generate`: a little randomness, nucleus sampling. */
  cli: { temperature: 0.8, topP: 0.95, topK: 40 },
} as const;

/** Tokens generated when a request gives no max_tokens (always capped by the room left in the context). */
export const MAX_TOKENS_DEFAULTS = {
  /** /v1/decode, the CLI and /v1/chat/completions. */
  generate: 256,
  /** /v1/completions: OpenAI's default. */
  completions: 16,
} as const;

/** max_tokens when the request gives none: the default, less when the context has less room left. */
export function defaultMaxTokens(maxContext: number, promptTokens: number, want: number = MAX_TOKENS_DEFAULTS.generate): number {
  return Math.max(1, Math.min(want, maxContext - promptTokens));
}

/**
 * What each attention policy uses for a field the request leaves out (the wire's snake_case
 * names). Model-dependent fields are not here: OmniKV's filter layers and Round Attention's
 * watershed come from the model's calibration (shared/inference/policy/model-defaults.json),
 * SCOPE's max_output is the request's max_tokens, and rounds.starts the chat's user messages.
 */
export const POLICY_DEFAULTS = {
  omnikv: { budget: 1024, selector: "last", window: 16, guard: true, lazy_iou: 0, offload: false },
  scope: { mode: "slide", beta1: 256, beta2: 256, alpha1: 0, alpha2: 8, reclaim: false },
  streaming: { sinks: 4, window: 1020, reclaim: false },
  h2o: { budget: 1024, recent: 256, reclaim: false },
  rounds: { top_k: 0 },
} as const;

/** Service-level objectives (ms) and the SLO admission's margin, when the configuration gives none. */
export const SLO_DEFAULTS = { ttftMs: 2000, tpotMs: 100, admissionMargin: 0.5 } as const;
