// Readiness's view of the registry database: a `select 1` with a short deadline, its answer kept
// for a moment so frequent probes cost at most one query per interval, and never a second query
// while one is still unanswered (a hung server does not pile up probes).
import { safeErrorMessage } from "../http/error-log.ts";
import type { OpenedDatabase } from "./db.ts";

export interface DbProbeOptions {
  /** How long the database may take to answer (default 1000 ms). */
  timeoutMs?: number;
  /** How long an answer is reused (default 2000 ms). */
  cacheMs?: number;
}

export interface DbHealth {
  ok: boolean;
  error?: string;
}

export class DbProbe {
  private last: { at: number; health: DbHealth } | undefined;
  private checking: Promise<DbHealth> | undefined;
  private unanswered = false;
  private readonly timeoutMs: number;
  private readonly cacheMs: number;

  constructor(
    private readonly db: Pick<OpenedDatabase, "ping">,
    options: DbProbeOptions = {},
  ) {
    this.timeoutMs = options.timeoutMs ?? 1_000;
    this.cacheMs = options.cacheMs ?? 2_000;
  }

  check(): Promise<DbHealth> {
    if (this.last && performance.now() - this.last.at < this.cacheMs) return Promise.resolve(this.last.health);
    this.checking ??= this.probe().then((health) => {
      this.last = { at: performance.now(), health };
      this.checking = undefined;
      return health;
    });
    return this.checking;
  }

  private probe(): Promise<DbHealth> {
    if (this.unanswered) return Promise.resolve({ ok: false, error: "the previous probe is still unanswered" });
    this.unanswered = true;
    const ping = this.db.ping().finally(() => (this.unanswered = false));
    let timer: NodeJS.Timeout | undefined;
    const deadline = new Promise<never>((_, reject) => {
      timer = setTimeout(() => reject(new Error(`the database did not answer within ${this.timeoutMs} ms`)), this.timeoutMs);
    });
    return Promise.race([ping, deadline])
      .then(
        (): DbHealth => ({ ok: true }),
        (err: unknown): DbHealth => ({ ok: false, error: safeErrorMessage(err, 200) }),
      )
      .finally(() => clearTimeout(timer));
  }
}

const NETWORK_CODES = new Set([
  "ECONNREFUSED",
  "ECONNRESET",
  "ETIMEDOUT",
  "EHOSTUNREACH",
  "ENETUNREACH",
  "ENOTFOUND",
  "EPIPE",
  "EAI_AGAIN",
]);

/**
 * Whether an error (or one it wraps: drizzle wraps the driver's) says the database cannot be
 * reached: a refused or broken connection, a connect or query deadline that ran out, or
 * PostgreSQL's connection-exception (08xxx) and shutting-down (57P01-57P03) codes. Such a failure
 * is a 503, not a bug (500).
 */
export function isDatabaseUnavailable(err: unknown): boolean {
  for (let e = err, depth = 0; e instanceof Error && depth < 5; e = e.cause, depth++) {
    const code = (e as { code?: unknown }).code;
    if (typeof code === "string" && (NETWORK_CODES.has(code) || code.startsWith("08") || /^57P0[123]$/.test(code))) return true;
    // pg's messages for a broken connection, a connect deadline and the client-side query deadline
    // (a stopped or hung server).
    if (
      /^Connection terminated|connection timeout|Client has encountered a connection error|timeout exceeded when trying to connect|^Query read timeout/i.test(
        e.message,
      )
    )
      return true;
  }
  return false;
}
