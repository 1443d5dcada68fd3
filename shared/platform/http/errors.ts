// One error shape for every service and route, the one OpenAI clients parse:
//   { "error": { "message": "...", "type": "invalid_request_error", "code": "unknown_handle", "param": null } }
// `code` is the machine-readable part; `message` is a sentence a person understands.
import { z } from "@hono/zod-openapi";

export type ApiStatus = 400 | 401 | 403 | 404 | 409 | 413 | 421 | 422 | 429 | 499 | 500 | 502 | 503 | 504;

export type ApiErrorCode =
  | "invalid_request" // the body or a parameter is malformed
  | "unknown_field" // the body has a key the route does not take (ctxbank's own routes refuse rather than ignore)
  | "unauthorized" // no API key / capability, or a wrong one
  | "forbidden" // a valid capability that does not allow this (another range, an expired lease)
  | "misdirected_request" // the Host header names no host this server answers for
  | "rate_limited" // the API key's request rate is spent
  | "concurrency_limited" // the API key has its maximum of requests in flight
  | "invalid_policy" // the attention policy cannot run on this model (bad filter layer, budget, ...)
  | "context_length_exceeded" // prompt (+ max tokens) does not fit the model's context
  | "model_mismatch" // the handle was made with another model
  | "unknown_handle" // no such request / chunks
  | "unknown_model"
  | "not_found"
  | "handle_expired" // its chunks' lease ran out (or were reclaimed)
  | "handle_released" // the request already finished, was cancelled, or is being decoded elsewhere
  | "request_id_conflict"
  | "payload_too_large"
  | "request_timeout" // the request body stalled, or the whole request took too long (408)
  | "queue_full"
  | "kv_memory_full"
  | "shard_full"
  | "slo_unattainable" // SLO admission: the predicted TTFT misses the TTFT objective
  | "client_closed"
  | "kv_load_failed" // the KV could not be read, or failed its checksum/fingerprint check
  | "prefill_failed" // the prefill instance answered with an error, or was declared dead during the call
  | "prefill_timeout" // the prefill call ran past its deadline
  | "no_prefill_instance"
  | "not_ready"
  | "draining"
  | "internal_error";

const TYPES: Record<number, string> = {
  400: "invalid_request_error",
  401: "authentication_error",
  403: "permission_error",
  404: "not_found_error",
  421: "invalid_request_error",
  409: "conflict_error",
  408: "timeout_error",
  410: "not_found_error",
  413: "invalid_request_error",
  429: "rate_limit_error",
  499: "client_closed",
  502: "upstream_error",
  503: "service_unavailable",
  504: "timeout_error",
};

export class ApiError extends Error {
  override readonly name = "ApiError";
  /** Response headers the answer carries (e.g. retry-after on a 429). */
  readonly headers: Record<string, string> = {};
  constructor(
    readonly status: ApiStatus,
    readonly code: ApiErrorCode,
    message: string,
    readonly param: string | null = null,
    readonly details?: unknown,
    options?: ErrorOptions,
  ) {
    super(message, options);
  }

  toJSON(): ErrorBody {
    return errorBody(this.status, this.code, this.message, this.param, this.details);
  }
}

/** Sets the Retry-After (seconds) a 429 or 503 answer carries; returns the error. */
export function retryAfter(seconds: number, err: ApiError): ApiError {
  err.headers["retry-after"] = String(Math.max(1, Math.ceil(seconds)));
  return err;
}

export interface ErrorBody {
  error: { message: string; type: string; code: string; param: string | null; details?: unknown };
}

export function errorBody(status: number, code: string, message: string, param: string | null = null, details?: unknown): ErrorBody {
  return {
    error: { message, type: TYPES[status] ?? (status >= 500 ? "server_error" : "invalid_request_error"), code, param, ...(details === undefined ? {} : { details }) },
  };
}

export const ErrorSchema = z
  .object({
    error: z.object({
      message: z.string().openapi({ example: "no request with id req-123 (unknown or already reclaimed)" }),
      type: z.string().openapi({ example: "not_found_error" }),
      code: z.string().openapi({ example: "unknown_handle" }),
      param: z.string().nullable(),
      details: z.unknown().optional(),
    }),
  })
  .openapi("Error");

/** OpenAPI response entries for the error statuses a route can answer. */
export function errorResponses(...statuses: ApiStatus[]) {
  const descriptions: Record<number, string> = {
    400: "Malformed request (code invalid_request, context_length_exceeded, model_mismatch)",
    401: "No API key, or an unknown one (code unauthorized)",
    404: "Unknown handle or resource",
    409: "The handle expired, was released, or is already being decoded",
    413: "Body or prompt too large",
    429: "Queue or KV memory full, or the API key's rate or concurrency limit reached; retry after Retry-After",
    499: "The client went away",
    500: "Internal error",
    502: "KV load or upstream prefill failed",
    503: "Not ready, draining, or no prefill instance alive",
    504: "Timed out",
  };
  return Object.fromEntries(
    statuses.map((s) => [s, { description: descriptions[s] ?? "Error", content: { "application/json": { schema: ErrorSchema } } }]),
  );
}
