// The prefill's chunk route with a leaner send path than services/handoff/transport/chunk-server.ts: the
// same URL, validation and error answers (it delegates everything but a successful read to that
// route), but the bytes go to the Node response in place: one write of a view of the shard's
// mapping, which the socket copies straight out of the shard's pages (no read into a buffer
// first, no web-stream bridge; the owner's CPU per GB is in bench/handoff's results). A source
// without a mapping sends through a small ring of reused buffers instead. Without a Node response
// (app.request in tests) it is exactly the shared route.
import type { HttpBindings } from "@hono/node-server";
import { RESPONSE_ALREADY_SENT } from "@hono/node-server/utils/response";
import { Hono } from "hono";
import { chunkRoutes, type ChunkSource } from "./transport/chunk-server.ts";
import { CHUNK_ROUTE } from "./transport/types.ts";

const DIGITS = /^(0|[1-9][0-9]{0,15})$/;

export interface FastChunkRouteOptions {
  maxLength?: number;
  /** Bytes per piece (default 1 MiB) and pieces in flight per response (default 4). */
  pieceBytes?: number;
  ring?: number;
}

export function fastChunkRoutes(lookup: (shardId: string) => ChunkSource | undefined, options: FastChunkRouteOptions = {}): Hono<{ Bindings: Partial<HttpBindings> }> {
  const maxLength = options.maxLength ?? 1 << 30;
  const pieceBytes = options.pieceBytes ?? 1 << 20;
  const ring = options.ring ?? 4;
  const shared = chunkRoutes(lookup, { maxLength, pieceBytes });
  const free: Buffer[] = [];
  const app = new Hono<{ Bindings: Partial<HttpBindings> }>();

  app.get(CHUNK_ROUTE, async (c) => {
    const outgoing = c.env?.outgoing;
    const { shardId, epoch } = c.req.param();
    const offsetText = c.req.query("offset") ?? "";
    const lengthText = c.req.query("length") ?? "";
    const shard = lookup(shardId);
    const ok =
      outgoing !== undefined &&
      "writeHead" in outgoing &&
      shard !== undefined &&
      DIGITS.test(epoch) &&
      DIGITS.test(offsetText) &&
      DIGITS.test(lengthText) &&
      Number(epoch) === shard.epoch;
    const offset = Number(offsetText);
    const length = Number(lengthText);
    // Anything but a servable range: the shared route answers it (400/404/409/410/416).
    if (!ok || length < 1 || length > maxLength || offset + length > shard.sizeBytes || !shard.holds(offset, length)) {
      return shared.fetch(c.req.raw, c.env);
    }
    const res = outgoing as HttpBindings["outgoing"];
    let inPlace: Uint8Array | undefined;
    try {
      inPlace = shard.view?.(offset, length);
    } catch {
      return shared.fetch(c.req.raw, c.env); // closed meanwhile: the shared route answers
    }
    res.writeHead(200, { "content-type": "application/octet-stream", "content-length": String(length) });
    if (inPlace) {
      // The socket holds the view (and so the mapping) until it has sent every byte.
      res.end(inPlace);
      return RESPONSE_ALREADY_SENT;
    }
    let sent = 0;
    let inFlight = 0;
    let wake: (() => void) | undefined;
    let gone = false;
    res.once("close", () => {
      gone = true;
      wake?.();
    });
    try {
      while (sent < length && !gone) {
        while (inFlight >= ring && !gone) await new Promise<void>((r) => (wake = r));
        if (gone) break;
        const buf = free.pop() ?? Buffer.allocUnsafe(pieceBytes);
        const n = Math.min(pieceBytes, length - sent);
        await shard.read(offset + sent, buf.subarray(0, n));
        sent += n;
        inFlight++;
        res.write(n === pieceBytes ? buf : buf.subarray(0, n), () => {
          inFlight--;
          if (free.length < 4 * ring) free.push(buf);
          const w = wake;
          wake = undefined;
          w?.();
        });
      }
      res.end();
    } catch (err) {
      res.destroy(err as Error); // the client sees a short body, never wrong bytes
    }
    return RESPONSE_ALREADY_SENT;
  });
  return app;
}
