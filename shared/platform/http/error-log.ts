// Errors as they may be logged or shown: bounded in size and without SQL parameters. drizzle's
// DrizzleQueryError carries the whole query and every bound parameter in its message, its stack
// and its own `query`/`params` fields (100,000 chunk ids once made a 13.7 MB log line); pino's
// standard serializer copies all of that. This one keeps the type, a bounded message with the
// parameters cut off, a few stack frames, a short code, and the cause chain, bounded the same way.

const MAX_MESSAGE = 1_000;
const MAX_FRAMES = 12;
const MAX_DEPTH = 3;

export interface LoggedError {
  type: string;
  message: string;
  code?: string | number;
  stack?: string;
  cause?: LoggedError | string;
}

/** An error's message without SQL parameters, at most `max` characters. */
export function safeErrorMessage(err: unknown, max = MAX_MESSAGE): string {
  const text = err instanceof Error ? err.message : String(err);
  const params = text.search(/\n\s*params:/);
  const cut = params >= 0 ? `${text.slice(0, params)} (parameters not logged)` : text;
  return cut.length > max ? `${cut.slice(0, max)}… (${cut.length - max} more characters)` : cut;
}

/** pino `err` serializer: see the file comment. */
export function boundedError(err: unknown, depth = 0): LoggedError | string {
  if (!(err instanceof Error)) return safeErrorMessage(err, 200);
  const message = safeErrorMessage(err);
  const out: LoggedError = { type: err.name, message };
  const code = (err as { code?: unknown }).code;
  if ((typeof code === "string" && code.length <= 64) || typeof code === "number") out.code = code;
  const frames = (err.stack ?? "").split("\n").filter((l) => /^\s+at /.test(l));
  if (frames.length > 0) out.stack = [`${err.name}: ${message}`, ...frames.slice(0, MAX_FRAMES).map((f) => f.slice(0, 300))].join("\n");
  if (err.cause !== undefined && depth < MAX_DEPTH) out.cause = boundedError(err.cause, depth + 1);
  return out;
}
