// The handle and what comes of it: what a prefill tells the decode about a prompt it computed, and
// how the prompt's KV then reached the decode. The handle's wire form (HandleSchema: the
// /v1/prefill answer, the /v1/decode body) stays with the other wire schemas in
// shared/platform/http/wire.ts; the streamed handle's lines are in handle-stream.ts.
import type { z } from "@hono/zod-openapi";
import type { Handle, KvLoadStatsSchema } from "../../shared/platform/http/wire.ts";

export type { Handle };

/** What a handle says of a prefill, less where its chunks are (an in-process prefill writes none). */
export type PromptHandle = Pick<
  Handle,
  | "request_id"
  | "first_token"
  | "model_fingerprint"
  | "prompt_tokens"
  | "prompt_token_ids"
  | "policy"
  | "resolved_policy"
  | "sampling"
  | "prefill_ms"
  | "queue_ms"
>;

/** How a request's KV reached the decode (the answer's `kv`): the transport, what moved, and whether it was recomputed. */
export type KvSummary = z.infer<typeof KvLoadStatsSchema>;
