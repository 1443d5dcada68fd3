// Validation and deadline handling shared by the transports.
import { SHARD_ID_PATTERN } from "../shard/shard.ts";
import { TransportError, chunkLabel } from "./errors.ts";
import { CAPABILITY_TOKEN, type ChunkLocation, type ReadChunkOptions } from "./types.ts";

// Any real wall-clock deadline is after 2001; a smaller number is a duration passed by mistake.
const EARLIEST_DEADLINE = 1e12;

const bad = (what: string) => new TransportError("invalid_request", `cannot read chunk: ${what}`);

export function checkLocation(loc: ChunkLocation): void {
  if (typeof loc !== "object" || loc === null) throw bad("no location");
  if (typeof loc.shardId !== "string" || !SHARD_ID_PATTERN.test(loc.shardId)) throw bad(`bad shard id ${JSON.stringify(loc.shardId)}`);
  if (!Number.isInteger(loc.epoch) || loc.epoch < 1) throw bad(`bad epoch ${loc.epoch}`);
  if (!Number.isSafeInteger(loc.offset) || loc.offset < 0) throw bad(`bad offset ${loc.offset}`);
  if (!Number.isSafeInteger(loc.length) || loc.length < 1) throw bad(`bad length ${loc.length}`);
  if (loc.capability !== undefined && !CAPABILITY_TOKEN.test(loc.capability)) throw bad("malformed capability");
}

export function checkReadArgs(loc: ChunkLocation, into: Uint8Array, opts: ReadChunkOptions): void {
  checkLocation(loc);
  if (!(into instanceof Uint8Array)) throw bad("the target must be a Uint8Array");
  if (into.byteLength < loc.length) throw bad(`${chunkLabel(loc)} does not fit a ${into.byteLength}-byte buffer`);
  if (!Number.isFinite(opts?.deadlineMs)) throw bad("deadlineMs is required");
  if (opts.deadlineMs < EARLIEST_DEADLINE) {
    throw bad(`deadlineMs ${opts.deadlineMs} looks like a duration; pass Date.now() + ms`);
  }
}

/**
 * Runs `read` with a signal that fires at the deadline or when the caller aborts; the promise
 * then rejects with deadline_exceeded or aborted. `read` must stop writing once the signal fires.
 */
export async function withDeadline<T>(loc: ChunkLocation, opts: ReadChunkOptions, read: (signal: AbortSignal) => Promise<T>): Promise<T> {
  const deadlineError = () => new TransportError("deadline_exceeded", `${chunkLabel(loc)}: deadline exceeded`);
  const abortError = () => new TransportError("aborted", `${chunkLabel(loc)}: aborted by the caller`);
  if (opts.signal?.aborted) throw abortError();
  const remaining = opts.deadlineMs - Date.now();
  if (remaining <= 0) throw deadlineError();

  const controller = new AbortController();
  const timer = setTimeout(() => controller.abort(deadlineError()), remaining);
  const onAbort = () => controller.abort(abortError());
  opts.signal?.addEventListener("abort", onAbort, { once: true });
  try {
    const result = await read(controller.signal);
    if (controller.signal.aborted) throw controller.signal.reason;
    return result;
  } catch (err) {
    throw controller.signal.aborted ? controller.signal.reason : err;
  } finally {
    clearTimeout(timer);
    opts.signal?.removeEventListener("abort", onAbort);
  }
}
