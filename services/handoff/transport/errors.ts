import { CtxbankError } from "../../../shared/inference/errors.ts";
import type { ChunkLocation } from "./types.ts";

export const TRANSPORT_ERROR_CODES = [
  "invalid_request", // the caller's location, buffer or options are malformed
  "deadline_exceeded",
  "aborted", // the caller's signal fired
  "unreachable", // no connection to the owner (refused, reset, unknown host)
  "unauthorized", // the owner refused the capability (none, wrong secret, or no live lease on exactly this range)
  "not_found", // the owner does not have that shard, or that range is no longer allocated
  "stale_epoch", // the shard was restarted: the chunk's epoch is gone
  "file_mismatch", // the file at the shard's path is not the one its owner registered (planted or replaced)
  "out_of_range", // the range lies outside the shard
  "short_read", // fewer bytes arrived than asked for
  "bad_response", // the owner answered something unexpected
  "io_error",
] as const;
export type TransportErrorCode = (typeof TRANSPORT_ERROR_CODES)[number];

/** A chunk read failed; `status`: the owner's HTTP status, when it answered one. */
export class TransportError extends CtxbankError<TransportErrorCode> {
  static override readonly codes = TRANSPORT_ERROR_CODES;
  override readonly name = "TransportError";
  constructor(
    code: TransportErrorCode,
    message: string,
    readonly status?: number,
    options?: ErrorOptions,
  ) {
    super(code, message, options);
  }
}

/** "chunk shard@epoch[offset+length]", for error messages. */
export function chunkLabel(loc: ChunkLocation): string {
  return `chunk ${loc.shardId}@${loc.epoch}[${loc.offset}+${loc.length}]`;
}

/**
 * The sentence in an owner's error body: the shared shape's `error.message` (or an older owner's
 * top-level `message`), else the start of the text.
 */
export function ownerErrorMessage(body: string): string {
  try {
    const parsed = JSON.parse(body) as { error?: { message?: unknown }; message?: unknown };
    const message = typeof parsed.error === "object" && parsed.error !== null ? parsed.error.message : parsed.message;
    if (typeof message === "string") return message.slice(0, 300);
  } catch {
    // not JSON: keep the text
  }
  return body.slice(0, 300);
}
