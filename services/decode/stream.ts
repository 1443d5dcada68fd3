// Running a decode generator behind an HTTP response. The first event is awaited before the
// response starts, so admission, prefill and handle errors are plain JSON errors with their
// status; after that, errors go into the stream as an error event, and the stream still ends
// normally (OpenAI's: `data: [DONE]` after the error chunk, as vLLM does). A client that goes
// away aborts the generator, which frees the sequence, its KV and its leases.
import type { Context } from "hono";
import type { Logger } from "pino";
import { streamSSE, type SSEStreamingApi } from "hono/streaming";
import { ApiError, errorAnswer } from "../../shared/platform/http/errors.ts";
import type { DecodeEvent } from "./service.ts";

/** An abort controller that fires when the HTTP client goes away. */
export function clientSignal(c: Context): AbortController {
  const ac = new AbortController();
  const raw = c.req.raw.signal;
  const abort = () => ac.abort(new ApiError(499, "client_closed", "the client closed the request"));
  if (raw.aborted) abort();
  else raw.addEventListener("abort", abort, { once: true });
  return ac;
}

/** Drains a generator, returning its events. */
export async function collect(events: AsyncGenerator<DecodeEvent>): Promise<DecodeEvent[]> {
  const out: DecodeEvent[] = [];
  for await (const ev of events) out.push(ev);
  return out;
}

export interface SseWriter {
  event(stream: SSEStreamingApi, ev: DecodeEvent): Promise<void>;
  /** Writes the error event of a request that failed mid-stream; `end` follows it. */
  error(stream: SSEStreamingApi, err: unknown): Promise<void>;
  /** The stream's last event, after the result or after an error event (OpenAI: data: [DONE]). */
  end?(stream: SSEStreamingApi): Promise<void>;
}

/** Awaits the first event (errors throw: the caller answers them as JSON), then streams the rest. */
export async function sse(c: Context, ac: AbortController, events: AsyncGenerator<DecodeEvent>, writer: SseWriter): Promise<Response> {
  let first: IteratorResult<DecodeEvent>;
  try {
    first = await events.next();
  } catch (e) {
    await events.return(undefined).catch((err: unknown) => logOf(c)?.warn({ err }, "a failed generation did not close cleanly"));
    throw e;
  }
  return streamSSE(c, async (stream) => {
    stream.onAbort(() => ac.abort(new ApiError(499, "client_closed", "the client closed the stream")));
    try {
      for (let r = first; !r.done; r = await events.next()) {
        if (stream.aborted || stream.closed) break;
        await writer.event(stream, r.value);
      }
      if (!stream.aborted && !stream.closed) await writer.end?.(stream);
    } catch (e) {
      if (errorAnswer(e).unexpected) logOf(c)?.error({ err: e }, "a stream failed");
      // The client learns why, and the stream still ends the way the protocol ends one.
      if (!ac.signal.aborted && !stream.closed) {
        await writer.error(stream, e).catch((err: unknown) => logOf(c)?.warn({ err }, "could not write a stream's error event"));
        await writer.end?.(stream).catch((err: unknown) => logOf(c)?.warn({ err }, "could not end a failed stream"));
      }
    } finally {
      await events.return(undefined).catch((err: unknown) => logOf(c)?.warn({ err }, "a generation did not close cleanly"));
    }
  });
}

function logOf(c: Context): Logger | undefined {
  return c.get("log") as Logger | undefined;
}
