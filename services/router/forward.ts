// Sends a client's request on to a decode and streams the answer back as it comes (SSE included).
// The client's headers go along (its API key too: the decode checks it again and sees the same
// tenant), less the hop-by-hop ones. A decode that cannot be reached, or that answers 503 because
// it is starting or draining, has done no work on the request: the router tries the next choice.
import { Readable } from "node:stream";
import { errors, request, type Dispatcher } from "undici";

import { CtxbankError } from "../../shared/inference/errors.ts";
import { ApiError } from "../../shared/platform/http/errors.ts";

/** Headers that describe one connection, not the request (RFC 9110 §7.6.1), and those undici sets itself. */
const HOP_BY_HOP = new Set([
  "connection",
  "keep-alive",
  "proxy-connection",
  "transfer-encoding",
  "te",
  "trailer",
  "upgrade",
  "host",
  "content-length",
  "expect",
]);

export interface Outgoing {
  method: string;
  /** Path and query, as the client sent them. */
  path: string;
  headers: Headers;
  body: string | undefined;
  signal: AbortSignal;
  /** Deadline for the decode's answer headers and for each gap between body bytes (a long prefill comes first). */
  timeoutMs: number;
}

/**
 * Why a forward did not reach a decode that would serve it: the next choice may take it. The
 * router catches it; were it ever answered, it would be a 503 not_ready.
 */
export class Unreachable extends CtxbankError<"not_ready"> {
  static override readonly codes = ["not_ready"] as const;
  override readonly name = "Unreachable";
  constructor(
    readonly kind: "connect" | "not_ready",
    message: string,
    cause?: unknown,
  ) {
    super("not_ready", message, { cause });
  }
}

/** Connection failures before any answer: the decode never got the request, or died under it. */
const CONNECT_CODES = new Set([
  "ECONNREFUSED",
  "ECONNRESET",
  "EHOSTUNREACH",
  "ENETUNREACH",
  "ENOTFOUND",
  "EPIPE",
  "UND_ERR_CONNECT_TIMEOUT",
  "UND_ERR_SOCKET",
  "UND_ERR_CLOSED",
]);

/** The decode took longer than --router-timeout-ms to start its answer: 504, not an internal error. */
function answerTimeout(timeoutMs: number, cause: unknown): ApiError {
  return new ApiError(
    504,
    "decode_timeout",
    `the decode did not start its answer within ${timeoutMs} ms (--router-timeout-ms); a long queue or prompt may need a longer deadline, or stream: true`,
    null,
    undefined,
    { cause },
  );
}

function errorCode(err: unknown): string | undefined {
  for (let e: unknown = err; e instanceof Error; e = e.cause) {
    const code = (e as { code?: unknown }).code;
    if (typeof code === "string" && CONNECT_CODES.has(code)) return code;
  }
  return undefined;
}

export async function forward(
  baseUrl: string,
  out: Outgoing,
  extraHeaders: Record<string, string> = {},
  dispatcher?: Dispatcher,
): Promise<Response> {
  const headers: Record<string, string> = {};
  out.headers.forEach((value, name) => {
    if (!HOP_BY_HOP.has(name)) headers[name] = value;
  });
  Object.assign(headers, extraHeaders);
  let res: Dispatcher.ResponseData;
  try {
    res = await request(`${baseUrl}${out.path}`, {
      method: out.method as Dispatcher.HttpMethod,
      headers,
      body: out.body,
      signal: out.signal,
      headersTimeout: out.timeoutMs,
      bodyTimeout: out.timeoutMs,
      ...(dispatcher ? { dispatcher } : {}),
    });
  } catch (err) {
    if (out.signal.aborted || err instanceof errors.RequestAbortedError) throw err;
    const code = errorCode(err);
    if (code) throw new Unreachable("connect", `${baseUrl}: ${code}`, err);
    // The decode has the request and may be working on it: no other decode is tried.
    if (err instanceof errors.HeadersTimeoutError) throw answerTimeout(out.timeoutMs, err);
    throw err;
  }
  if (res.statusCode === 503) {
    // Starting or draining (services/decode/service.ts assertReady): nothing was done.
    const text = await res.body.text();
    const code = (() => {
      try {
        return (JSON.parse(text) as { error?: { code?: unknown } }).error?.code;
      } catch {
        return undefined;
      }
    })();
    if (code === "draining" || code === "not_ready") throw new Unreachable("not_ready", `${baseUrl}: ${code}`);
    return new Response(text, { status: 503, headers: answerHeaders(res.headers) });
  }
  if (res.statusCode === 204 || out.method === "HEAD") {
    await res.body.dump();
    return new Response(null, { status: res.statusCode, headers: answerHeaders(res.headers) });
  }
  // A gap between body bytes past the deadline ends the stream with an error (the status is sent).
  const body = Readable.toWeb(res.body) as ReadableStream<Uint8Array>;
  return new Response(body, { status: res.statusCode, headers: answerHeaders(res.headers) });
}

function answerHeaders(from: Dispatcher.ResponseData["headers"]): Headers {
  const h = new Headers();
  for (const [name, value] of Object.entries(from)) {
    if (value === undefined || HOP_BY_HOP.has(name)) continue;
    for (const v of Array.isArray(value) ? value : [value]) h.append(name, v);
  }
  return h;
}
