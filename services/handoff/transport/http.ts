// Cross-host transport: GET the byte range from the owner's chunk route over a keep-alive undici
// pool per origin, streaming the body straight into the caller's buffer.
import { Pool } from "undici";
import { TransportError, chunkLabel, ownerErrorMessage, type TransportErrorCode } from "./errors.ts";
import { checkReadArgs, withDeadline } from "./read-checks.ts";
import { chunkRequestPath, type ChunkLocation, type KvTransport, type ReadChunkOptions } from "./types.ts";

export interface HttpTransportOptions {
  connections?: number; // per owner; default 8
  keepAliveTimeoutMs?: number; // default 30 s
}

const STATUS_CODES: Record<number, TransportErrorCode> = {
  400: "invalid_request",
  401: "unauthorized",
  403: "unauthorized",
  404: "not_found",
  409: "stale_epoch",
  410: "not_found",
  416: "out_of_range",
};
const NETWORK_ERRORS = new Set([
  "ECONNREFUSED",
  "ECONNRESET",
  "EHOSTUNREACH",
  "ENETUNREACH",
  "ENOTFOUND",
  "EAI_AGAIN",
  "EPIPE",
  "UND_ERR_SOCKET",
  "UND_ERR_CONNECT_TIMEOUT",
  "UND_ERR_CLOSED",
]);

export class HttpTransport implements KvTransport {
  readonly name = "http";
  private readonly pools = new Map<string, Pool>();

  constructor(private readonly options: HttpTransportOptions = {}) {}

  async readChunk(loc: ChunkLocation, into: Uint8Array, opts: ReadChunkOptions): Promise<number> {
    checkReadArgs(loc, into, opts);
    const { pool, prefix } = this.poolFor(loc);
    return withDeadline(loc, opts, async (signal) => {
      let res;
      try {
        const headers = loc.capability === undefined ? {} : { authorization: `Bearer ${loc.capability}` };
        res = await pool.request({ method: "GET", path: prefix + chunkRequestPath(loc), headers, signal });
      } catch (err) {
        throw networkError(loc, err);
      }
      if (res.statusCode !== 200) {
        throw statusError(loc, res.statusCode, await readErrorBody(res.body));
      }
      const declared = Number(res.headers["content-length"]);
      if (res.headers["content-length"] !== undefined && declared !== loc.length) {
        res.body.destroy();
        throw new TransportError("bad_response", `${chunkLabel(loc)}: the owner announced ${declared} bytes`, 200);
      }
      let received = 0;
      try {
        for await (const piece of res.body as AsyncIterable<Buffer>) {
          if (signal.aborted) throw signal.reason; // a piece already queued when the deadline fired
          if (received + piece.byteLength > loc.length) {
            throw new TransportError("bad_response", `${chunkLabel(loc)}: the owner sent more than ${loc.length} bytes`, 200);
          }
          into.set(piece, received);
          received += piece.byteLength;
        }
      } catch (err) {
        res.body.destroy();
        if (err instanceof TransportError) throw err;
        throw new TransportError("short_read", `${chunkLabel(loc)}: the body broke off after ${received} of ${loc.length} bytes`, 200, {
          cause: err,
        });
      }
      if (received !== loc.length) {
        throw new TransportError("short_read", `${chunkLabel(loc)}: got ${received} of ${loc.length} bytes`, 200);
      }
      return received;
    });
  }

  async close(): Promise<void> {
    const pools = [...this.pools.values()];
    this.pools.clear();
    await Promise.all(pools.map((p) => p.close()));
  }

  private poolFor(loc: ChunkLocation): { pool: Pool; prefix: string } {
    let url: URL;
    try {
      url = new URL(loc.ownerBaseUrl);
    } catch {
      throw new TransportError("invalid_request", `${chunkLabel(loc)}: bad owner URL ${JSON.stringify(loc.ownerBaseUrl)}`);
    }
    if (url.protocol !== "http:" && url.protocol !== "https:") {
      throw new TransportError("invalid_request", `${chunkLabel(loc)}: owner URL must be http(s), got ${url.protocol}`);
    }
    let pool = this.pools.get(url.origin);
    if (!pool) {
      pool = new Pool(url.origin, {
        connections: this.options.connections ?? 8,
        pipelining: 1, // long streaming bodies: no head-of-line blocking behind a 64 MiB read
        keepAliveTimeout: this.options.keepAliveTimeoutMs ?? 30_000,
      });
      this.pools.set(url.origin, pool);
    }
    return { pool, prefix: url.pathname.replace(/\/+$/, "") };
  }
}

/** The start of an error response (an owner's JSON error is small); the rest is discarded. */
async function readErrorBody(body: AsyncIterable<Buffer> & { destroy(): void }): Promise<string> {
  const limit = 4096;
  let text = "";
  try {
    for await (const piece of body) {
      text += piece.toString("utf8", 0, Math.min(piece.byteLength, limit - text.length));
      if (text.length >= limit) break;
    }
  } catch {
    // a broken error body still leaves the status to report
  } finally {
    body.destroy();
  }
  return text;
}

function networkError(loc: ChunkLocation, err: unknown): TransportError {
  const e = err as { code?: string; cause?: { code?: string }; message?: string };
  const code = e.code ?? e.cause?.code;
  if (code && NETWORK_ERRORS.has(code)) {
    return new TransportError("unreachable", `${chunkLabel(loc)}: cannot reach ${loc.ownerBaseUrl} (${code})`, undefined, { cause: err });
  }
  return new TransportError("io_error", `${chunkLabel(loc)}: ${e.message ?? String(err)}`, undefined, { cause: err });
}

function statusError(loc: ChunkLocation, status: number, body: string): TransportError {
  const detail = ownerErrorMessage(body);
  return new TransportError(STATUS_CODES[status] ?? "bad_response", `${chunkLabel(loc)}: owner answered ${status}: ${detail}`, status);
}
