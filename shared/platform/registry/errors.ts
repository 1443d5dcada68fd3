import { z } from "zod";
import { CtxbankError } from "../../inference/errors.ts";

export const REGISTRY_ERROR_CODES = [
  "invalid_input", // the caller passed something malformed
  "not_found", // no such row
  "conflict", // a row with that identity already exists
  "wrong_state", // the row exists but the operation does not apply to its state
  "chunk_unavailable", // some chunks of an acquireRead/extendLease cannot be leased (see details)
  "key_mismatch", // a live chunk has this key but different contents metadata
  "stale_epoch", // the shard epoch is not the active one
  "instance_dead", // the instance was declared dead and must register again
] as const;
export type RegistryErrorCode = (typeof REGISTRY_ERROR_CODES)[number];

export class RegistryError extends CtxbankError<RegistryErrorCode> {
  static override readonly codes = REGISTRY_ERROR_CODES;
  override readonly name = "RegistryError";
  constructor(code: RegistryErrorCode, message: string, details?: unknown) {
    super(code, message, { details });
  }
}

/** Validates an outside input, turning zod's report into a RegistryError the caller can match on. */
export function parseInput<T extends z.ZodType>(schema: T, input: unknown, what: string): z.output<T> {
  const result = schema.safeParse(input);
  if (!result.success) {
    throw new RegistryError("invalid_input", `invalid ${what}: ${z.prettifyError(result.error)}`, result.error.issues);
  }
  return result.data;
}

// Shared field schemas.
/** Instance, shard, request and session ids; shard ids also name files (see kv/shard.ts). */
export const identifier = z
  .string()
  .regex(/^[A-Za-z0-9][A-Za-z0-9._:-]{0,127}$/, "1-128 chars of letters, digits and . _ : - (not starting with a symbol)");
export const int32 = z
  .number()
  .int()
  .min(0)
  .max(2 ** 31 - 1);
export const positiveMs = z
  .number()
  .int()
  .min(1)
  .max(7 * 24 * 3600 * 1000);
export const chunkId = z.uuid();
/**
 * The most chunks one handle may name: 1,024 token blocks x 16 layer groups covers a 512K-token
 * prompt in 512-token blocks. It also keeps a lease query far below PostgreSQL's 65,535 bind
 * parameters (100,000 ids used to reach the database and fail there with a 500).
 */
export const MAX_HANDLE_CHUNKS = 16_384;
export const chunkIds = z
  .array(chunkId)
  .min(1)
  .max(MAX_HANDLE_CHUNKS)
  .refine((ids) => new Set(ids).size === ids.length, "chunk ids must be distinct");
