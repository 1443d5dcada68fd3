// One error shape for every service and route, the one OpenAI clients parse:
//   { "error": { "message": "...", "type": "invalid_request_error", "code": "unknown_handle", "param": null } }
// `code` is the machine-readable part; `message` is a sentence a person understands. Every code
// has one status, in the table below; errorAnswer() turns anything thrown into its answer.
import { z } from "@hono/zod-openapi";
import { CtxbankError } from "../../inference/errors.ts";

export type ApiStatus = 400 | 401 | 403 | 404 | 408 | 409 | 410 | 413 | 416 | 421 | 429 | 499 | 500 | 502 | 503 | 504;

/**
 * The one table from error code to HTTP status: every code any CtxbankError may carry, the
 * library's and the services' (test/unit/errors.test.ts finds every error class and checks each of its
 * codes is here). A code means the same thing wherever it is thrown. docs/errors.md lists them.
 */
export const HTTP_STATUS = {
  // The public API's own codes (ApiError).
  invalid_request: 400, // the body or a parameter is malformed (`param` names it)
  unknown_field: 400, // the body has a field the route does not take
  invalid_policy: 400, // the attention policy is malformed or cannot run on this model
  context_length_exceeded: 400, // prompt (+ max tokens) does not fit the model's context (OpenAI answers it with 400 too)
  model_mismatch: 400, // the handle was made with another model
  unauthorized: 401, // no API key / capability, or a wrong one
  forbidden: 403, // a valid capability that does not allow this (another range, an expired lease)
  unknown_handle: 404, // no such request / chunks
  unknown_model: 404,
  unknown_response: 404, // no stored response with that id (for this key)
  unknown_session: 404, // no session with that id (for this key)
  not_found: 404,
  request_timeout: 408, // the request body stalled
  handle_expired: 409, // its chunks' lease ran out (or were reclaimed)
  handle_released: 409, // the request already finished, was cancelled, or is being decoded elsewhere
  request_id_conflict: 409,
  payload_too_large: 413,
  misdirected_request: 421, // the Host header names no host this server answers for
  rate_limited: 429, // the API key's request rate is spent
  concurrency_limited: 429, // the API key has its maximum of requests in flight
  queue_full: 429,
  kv_memory_full: 429,
  shard_full: 429,
  slo_unattainable: 429, // SLO admission: the predicted TTFT misses the TTFT objective
  client_closed: 499,
  internal_error: 500,
  kv_load_failed: 502, // the KV could not be read, or failed its checksum/fingerprint check
  prefill_failed: 502, // the prefill instance answered with an error, or was declared dead during the call
  no_prefill_instance: 503,
  not_ready: 503,
  draining: 503,
  prefill_timeout: 504, // the prefill call ran past its deadline
  decode_timeout: 504, // the router: the decode did not start its answer within --router-timeout-ms
  // The inference library (shared/inference).
  empty_prompt: 400,
  invalid_prompt: 400, // a prompt token id outside the vocabulary
  invalid_token_id: 400,
  invalid_messages: 400,
  no_chat_template: 400, // a chat request to a model without a chat template
  chat_template_failed: 400, // the template refused the messages (raise_exception)
  chat_template_syntax: 500,
  tokenizer_unsupported_model: 500,
  tokenizer_unsupported_pre: 500,
  tokenizer_bad_metadata: 500,
  model_explicit_path_missing: 500,
  model_explicit_path_invalid: 500,
  model_not_cached: 500,
  model_index_unreachable: 502,
  model_project_not_found: 502,
  model_http_error: 502,
  model_wheel_not_in_index: 502,
  model_download_failed: 502,
  model_truncated: 502,
  model_wheel_checksum: 502,
  model_corrupt_zip: 502,
  model_member_missing: 502,
  model_member_size: 502,
  model_member_checksum: 502,
  model_lock_timeout: 503,
  model_aborted: 499,
  invalid_usage: 400, // a command line the CLI cannot run
  // Service infrastructure (shared/platform): configuration is read at start, so its errors only
  // reach HTTP through a bug; the registry's are the database's view of a row.
  invalid_config: 500,
  invalid_input: 400,
  conflict: 409,
  wrong_state: 409,
  chunk_unavailable: 409,
  key_mismatch: 409,
  stale_epoch: 409,
  instance_dead: 503,
  // The KV handoff (services/handoff): a chunk read's outcome as its owner answered it, and a
  // chunk's verification. A decode answers a failed load as kv_load_failed; these only say why.
  deadline_exceeded: 504,
  aborted: 499,
  unreachable: 502,
  file_mismatch: 502,
  out_of_range: 416,
  short_read: 502,
  bad_response: 502,
  io_error: 500,
  unknown_shard: 404,
  not_allocated: 410,
  bad_magic: 502,
  bad_version: 502,
  bad_header: 502,
  size_mismatch: 502,
  truncated: 502,
  length_mismatch: 502,
  checksum_mismatch: 502,
  fingerprint_mismatch: 502,
  metadata_mismatch: 502,
  buffer_too_small: 500,
  invalid_meta: 500,
  unsafe_shard_dir: 500,
  peer_dead: 502,
} as const satisfies Record<string, ApiStatus>;

export type ErrorCode = keyof typeof HTTP_STATUS;

/** The codes the HTTP layer answers with directly (ApiError), apart from the domain errors'. */
export const API_ERROR_CODES = [
  "invalid_request",
  "unknown_field",
  "invalid_policy",
  "context_length_exceeded",
  "model_mismatch",
  "unauthorized",
  "forbidden",
  "unknown_handle",
  "unknown_model",
  "unknown_response",
  "unknown_session",
  "not_found",
  "request_timeout",
  "handle_expired",
  "handle_released",
  "request_id_conflict",
  "payload_too_large",
  "misdirected_request",
  "rate_limited",
  "concurrency_limited",
  "queue_full",
  "kv_memory_full",
  "shard_full",
  "slo_unattainable",
  "client_closed",
  "internal_error",
  "kv_load_failed",
  "prefill_failed",
  "no_prefill_instance",
  "not_ready",
  "draining",
  "prefill_timeout",
  "decode_timeout",
  "unknown_shard",
  "stale_epoch",
  "out_of_range",
  "not_allocated",
] as const satisfies readonly ErrorCode[];
export type ApiErrorCode = (typeof API_ERROR_CODES)[number];

/** The status of `code`; 500 for a code the table does not know (a relayed or foreign one). */
export function statusOf(code: string): ApiStatus {
  return (HTTP_STATUS as Record<string, ApiStatus>)[code] ?? 500;
}

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
  416: "invalid_request_error",
  429: "rate_limit_error",
  499: "client_closed",
  502: "upstream_error",
  503: "service_unavailable",
  504: "timeout_error",
};

/**
 * An error answered as it is: its message is written for the client. `status` is the table's for
 * `code` (the compiler checks it), except for an answer relayed from another service.
 */
export class ApiError<C extends ApiErrorCode = ApiErrorCode> extends CtxbankError<C> {
  static override readonly codes = API_ERROR_CODES;
  override readonly name = "ApiError";
  /** Response headers the answer carries (e.g. retry-after on a 429). */
  readonly headers: Record<string, string> = {};
  constructor(
    readonly status: (typeof HTTP_STATUS)[C],
    code: C,
    message: string,
    param: string | null = null,
    details?: unknown,
    options?: ErrorOptions,
  ) {
    super(code, message, { param, details, cause: options?.cause });
  }

  toJSON(): ErrorBody {
    return errorBody(this.status, this.code, this.message, this.param, this.details);
  }
}

/** Adds response headers the error's answer carries (a challenge on a 401, say); returns the error. */
export function withHeaders<E extends ApiError>(err: E, headers: Record<string, string>): E {
  Object.assign(err.headers, headers);
  return err;
}

/** Sets the Retry-After (seconds) a 429 or 503 answer carries; returns the error. */
export function retryAfter(seconds: number, err: ApiError): ApiError {
  err.headers["retry-after"] = String(Math.max(1, Math.ceil(seconds)));
  return err;
}

/** What a thrown error is answered with; `unexpected`: the service log should have it in full, at error. */
export interface ErrorAnswer {
  status: ApiStatus;
  body: ErrorBody;
  headers: Record<string, string>;
  unexpected: boolean;
}

/**
 * The answer to anything thrown: an ApiError as it is (its message is written for the client); any
 * other CtxbankError by its code's status, with its message, `param` and `details` below 500 and
 * only its code at 500 and above (those messages are written for the operator and may name files
 * and hosts; the log has them); anything else a 500 internal_error.
 */
export function errorAnswer(err: unknown): ErrorAnswer {
  if (err instanceof ApiError) {
    // Every 429 says when to come back; a stage that cannot estimate it says one second.
    const headers = err.status === 429 && !err.headers["retry-after"] ? { ...err.headers, "retry-after": "1" } : err.headers;
    return { status: err.status, body: err.toJSON(), headers, unexpected: false };
  }
  if (err instanceof CtxbankError) {
    const status = statusOf(err.code);
    const body =
      status < 500
        ? errorBody(status, err.code, err.message, err.param, err.details)
        : errorBody(status, err.code, `the server could not complete the request (${err.code}); see the service log`);
    return { status, body, headers: {}, unexpected: status >= 500 };
  }
  return { status: 500, body: errorBody(500, "internal_error", "internal error; see the service log"), headers: {}, unexpected: true };
}

export interface ErrorBody {
  error: { message: string; type: string; code: string; param: string | null; details?: unknown };
}

export function errorBody(status: number, code: string, message: string, param: string | null = null, details?: unknown): ErrorBody {
  return {
    error: {
      message,
      type: TYPES[status] ?? (status >= 500 ? "server_error" : "invalid_request_error"),
      code,
      param,
      ...(details === undefined ? {} : { details }),
    },
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
    413: "Body too large (code payload_too_large)",
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
