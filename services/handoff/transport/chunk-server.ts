// The owner's side of HttpTransport: serves byte ranges of its shards, validating every part of
// the request. Mount it on the prefill service's Hono app (`app.route("/", chunkRoutes(...))`).
import { Hono, type Context } from "hono";
import type { ContentfulStatusCode } from "hono/utils/http-status";
import { errorBody, type ErrorCode, type HTTP_STATUS } from "../../../shared/platform/http/errors.ts";
import { SHARD_ID_PATTERN } from "../shard/shard.ts";
import { CHUNK_ROUTE } from "./types.ts";

/** What the route needs from a shard; kv/shard.ts's Shard is one. */
export interface ChunkSource {
  readonly shardId: string;
  readonly epoch: number;
  readonly sizeBytes: number;
  holds(offset: number, length: number): boolean;
  read(offset: number, into: Uint8Array): Promise<void>;
}

export interface ChunkRoutesOptions {
  maxLength?: number; // largest range served in one response; default 1 GiB
  pieceBytes?: number; // bytes read from the shard per streamed piece; default 4 MiB (2x faster than 1 MiB here)
}

const DIGITS = /^(0|[1-9][0-9]{0,15})$/;

export function chunkRoutes(lookup: (shardId: string) => ChunkSource | undefined, options: ChunkRoutesOptions = {}): Hono {
  const maxLength = options.maxLength ?? 1 << 30;
  const pieceBytes = options.pieceBytes ?? 4 << 20;
  const app = new Hono();

  app.get(CHUNK_ROUTE, (c) => {
    const { shardId, epoch: epochText } = c.req.param();
    const offsetText = c.req.query("offset") ?? "";
    const lengthText = c.req.query("length") ?? "";
    if (!SHARD_ID_PATTERN.test(shardId)) return fail(c, 400, "invalid_request", "shard id has invalid characters");
    if (!DIGITS.test(epochText) || !DIGITS.test(offsetText) || !DIGITS.test(lengthText)) {
      return fail(c, 400, "invalid_request", "epoch, offset and length must be non-negative integers");
    }
    const [epoch, offset, length] = [Number(epochText), Number(offsetText), Number(lengthText)];
    if (length < 1 || length > maxLength) return fail(c, 400, "invalid_request", `length must be in 1..${maxLength}`);

    const shard = lookup(shardId);
    if (!shard) return fail(c, 404, "unknown_shard", `no shard ${shardId} here`);
    if (epoch !== shard.epoch) {
      return fail(c, 409, "stale_epoch", `shard ${shardId} is at epoch ${shard.epoch}, not ${epoch}`, { epoch: shard.epoch });
    }
    if (offset + length > shard.sizeBytes) {
      c.header("content-range", `bytes */${shard.sizeBytes}`);
      return fail(c, 416, "out_of_range", `range ${offset}+${length} exceeds the ${shard.sizeBytes}-byte shard`);
    }
    if (!shard.holds(offset, length)) {
      return fail(c, 410, "not_allocated", `range ${offset}+${length} is not an allocated chunk (freed or never written)`);
    }

    let sent = 0;
    const body = new ReadableStream<Uint8Array>({
      async pull(controller) {
        const n = Math.min(pieceBytes, length - sent);
        const piece = Buffer.allocUnsafe(n);
        await shard.read(offset + sent, piece);
        sent += n;
        controller.enqueue(piece);
        if (sent === length) controller.close();
      },
    });
    return c.body(body, 200, { "content-type": "application/octet-stream", "content-length": String(length) });
  });
  return app;
}

/**
 * The services' error shape, `{error: {message, type, code, param}}`; `details` carries extras (the
 * current epoch). Answered here, not thrown: the route also runs on its own (the socket transport's
 * tests); `status` is the table's for `code` (the compiler checks it).
 */
function fail<C extends ErrorCode>(c: Context, status: (typeof HTTP_STATUS)[C], code: C, message: string, details?: object) {
  return c.json(errorBody(status, code, message, null, details), status as ContentfulStatusCode);
}
