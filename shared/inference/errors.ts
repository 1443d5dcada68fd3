// The one base class of every error ctxbank throws on purpose. `code` is a snake_case word a
// program matches on, the same in every layer: the library throws it, the services log it, and
// the HTTP layer answers it (shared/platform/http/errors.ts maps each code to its status; the
// table of codes is docs/errors.md). `param` names the request field at fault, when there is one;
// `details` is structured data a client may use (validation issues, say).
// Each subclass lists its codes in a static `codes` array, so tests can check that every code
// has an HTTP status without a hand-kept list.

export interface CtxbankErrorOptions {
  param?: string | null;
  details?: unknown;
  cause?: unknown;
}

export class CtxbankError<C extends string = string> extends Error {
  /** Every code instances of this class may carry; subclasses override it. */
  static readonly codes: readonly string[] = [];
  override readonly name: string = "CtxbankError";
  readonly param: string | null;
  readonly details: unknown;

  constructor(
    readonly code: C,
    message: string,
    options: CtxbankErrorOptions = {},
  ) {
    super(message, options.cause === undefined ? undefined : { cause: options.cause });
    this.param = options.param ?? null;
    this.details = options.details;
  }
}

/** A command line the program cannot run (a bad flag or value): the CLIs print it with their help. */
export class UsageError extends CtxbankError<"invalid_usage"> {
  static override readonly codes = ["invalid_usage"] as const;
  override readonly name = "UsageError";
  constructor(message: string) {
    super("invalid_usage", message);
  }
}
