// The prefill's chunk route with a leaner send path than services/handoff/transport/chunk-server.ts: the
// same URL, validation and error answers (it delegates everything but a successful read to that
// route), but the bytes go to the Node response in place: one write of a view of the shard's
// mapping, which the socket copies straight out of the shard's pages (no read into a buffer
// first, no web-stream bridge; the owner's CPU per GB is in bench/handoff's results). Without a
// Node response (app.request in tests) it is exactly the shared route.
import type { HttpBindings } from "@hono/node-server";
import { RESPONSE_ALREADY_SENT } from "@hono/node-server/utils/response";
import { Hono } from "hono";
import { chunkRoutes, type ChunkRoutesOptions, type ChunkSource } from "./transport/chunk-server.ts";
import { CHUNK_ROUTE } from "./transport/types.ts";

const DIGITS = /^(0|[1-9][0-9]{0,15})$/;

/** A chunk source whose bytes can be viewed in place (Shard.view: a mapping of the shard file). */
export interface InPlaceChunkSource extends ChunkSource {
  /** [offset, offset + length), readable while the view is referenced. */
  view(offset: number, length: number): Uint8Array;
}

export function fastChunkRoutes(
  lookup: (shardId: string) => InPlaceChunkSource | undefined,
  options: ChunkRoutesOptions = {},
): Hono<{ Bindings: Partial<HttpBindings> }> {
  const maxLength = options.maxLength ?? 1 << 30;
  const shared = chunkRoutes(lookup, { ...options, maxLength });
  const app = new Hono<{ Bindings: Partial<HttpBindings> }>();

  app.get(CHUNK_ROUTE, (c) => {
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
    let view: Uint8Array;
    try {
      view = shard.view(offset, length);
    } catch {
      return shared.fetch(c.req.raw, c.env); // closed meanwhile: the shared route answers
    }
    res.writeHead(200, { "content-type": "application/octet-stream", "content-length": String(length) });
    res.end(view); // the socket holds the view (and so the mapping) until it has sent every byte
    return RESPONSE_ALREADY_SENT;
  });
  return app;
}
