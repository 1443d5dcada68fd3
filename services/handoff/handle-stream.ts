// The streamed handle (docs/architecture.md, "Streaming handoff"): with `stream: true` a prefill
// answers NDJSON lines instead of one handle, so a decode can load block i while block i+1
// computes. Lines, in order:
//   {"started": HandleStart}   once, when the first chunk is committed: where the KV will be
//   {"chunk": "<uuid>"}        each chunk as it is committed (or taken from a live prefix)
//   {"handle": Handle}         last: the full handle, first token included
//   {"error": {code, message}} instead of the handle when the prefill fails after it started
import { z } from "@hono/zod-openapi";
import { ApiError } from "../../shared/platform/http/errors.ts";
import { HandleSchema, type Handle } from "../../shared/platform/http/wire.ts";
import type { WriteResult } from "./writer.ts";

export const HandleStartSchema = HandleSchema.omit({
  first_token: true,
  chunk_ids: true,
  prefill_ms: true,
  queue_ms: true,
  expires_at: true,
  rounds_picked: true, // made where the prompt ends
})
  .extend({ total_chunks: z.number().int().min(1).openapi({ description: "Chunks the prefill will announce (ids may repeat)" }) })
  .openapi("HandleStart");
export type HandleStart = z.infer<typeof HandleStartSchema>;

export const HandleLineSchema = z.union([
  z.object({ started: HandleStartSchema }).strict(),
  z.object({ chunk: z.uuid() }).strict(),
  z.object({ handle: HandleSchema }).strict(),
  z
    .object({ error: z.object({ status: z.number().int().min(400).max(599), code: z.string().max(64), message: z.string().max(4000) }) })
    .strict(),
]);
export type HandleLine = z.infer<typeof HandleLineSchema>;

/** What a prefill tells its caller while it runs (the NDJSON lines before the handle). */
export interface HandleProgress {
  started(start: HandleStart): void;
  chunk(id: string): void;
}

/**
 * Wraps chunk writes so each committed chunk is announced as soon as it is, the start first.
 * Returns the pass-through to chain on every write's promise.
 */
export function announceWrites(progress: HandleProgress | undefined, start: () => HandleStart): (r: WriteResult) => WriteResult {
  let started = false;
  return (r) => {
    if (!progress || "error" in r) return r;
    if (!started) {
      started = true;
      progress.started(start());
    }
    progress.chunk(r.id);
    return r;
  };
}

/** Longest NDJSON line a decode accepts (a handle carries the prompt's ids: 2^17 ids fit). */
export const MAX_HANDLE_LINE = 4 << 20;

/** Splits a byte stream into parsed, validated lines; throws on a malformed or oversized one. */
export async function* handleLines(body: AsyncIterable<Uint8Array>): AsyncGenerator<HandleLine> {
  const decoder = new TextDecoder();
  let buf = "";
  for await (const piece of body) {
    buf += decoder.decode(piece, { stream: true });
    let nl;
    while ((nl = buf.indexOf("\n")) >= 0) {
      const line = buf.slice(0, nl);
      buf = buf.slice(nl + 1);
      if (line.trim()) yield parseLine(line);
    }
    if (buf.length > MAX_HANDLE_LINE) throw new Error(`a line of the streamed handle exceeds ${MAX_HANDLE_LINE} bytes`);
  }
  buf += decoder.decode();
  if (buf.trim()) yield parseLine(buf);
}

function parseLine(line: string): HandleLine {
  let json: unknown;
  try {
    json = JSON.parse(line);
  } catch {
    throw new Error("a line of the streamed handle is not JSON");
  }
  const parsed = HandleLineSchema.safeParse(json);
  if (!parsed.success) throw new Error(`malformed line in the streamed handle: ${parsed.error.issues[0]?.message ?? "invalid"}`);
  return parsed.data;
}

export type { Handle };

/**
 * The prefill's streamed answer: `run` prefills and reports progress; errors before the first
 * line are thrown (an ordinary HTTP error), later ones end the stream with an error line. The
 * caller going away (`signal`, or the stream cancelled) aborts the prefill.
 */
export async function handleStreamResponse(
  signal: AbortSignal,
  run: (progress: HandleProgress, signal: AbortSignal) => Promise<Handle>,
): Promise<Response> {
  const cancelled = new AbortController();
  const enc = new TextEncoder();
  let controller!: ReadableStreamDefaultController<Uint8Array>;
  let open = true;
  const stream = new ReadableStream<Uint8Array>({
    start: (c) => void (controller = c),
    cancel: (reason) => {
      open = false;
      cancelled.abort(reason);
    },
  });
  const write = (line: HandleLine) => {
    if (open) controller.enqueue(enc.encode(JSON.stringify(line) + "\n"));
  };
  const end = () => {
    if (open) controller.close();
    open = false;
  };
  let onStart!: () => void;
  const started = new Promise<void>((r) => (onStart = r));
  const done = run(
    {
      started: (s) => {
        write({ started: s });
        onStart();
      },
      chunk: (id) => write({ chunk: id }),
    },
    AbortSignal.any([signal, cancelled.signal]),
  );
  await Promise.race([started, done]); // a rejection before the start: thrown, an ordinary error answer
  done.then(
    (handle) => {
      write({ handle });
      end();
    },
    (e: unknown) => {
      const err =
        e instanceof ApiError
          ? { status: e.status, code: e.code, message: e.message.slice(0, 4000) }
          : { status: 500, code: "internal_error", message: "internal error; see the service log" };
      write({ error: err });
      end();
    },
  );
  return new Response(stream, { status: 200, headers: { "content-type": "application/x-ndjson", "cache-control": "no-store" } });
}
