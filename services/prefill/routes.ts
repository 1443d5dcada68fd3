// HTTP surface of the prefill service: POST /v1/prefill, the chunk byte route decode instances
// read from, and GET /v1/prefill/status.
import { createRoute, z } from "@hono/zod-openapi";
import { newApp, type ServiceApp } from "../../shared/http/app.ts";
import { errorResponses } from "../../shared/http/errors.ts";
import { forwardedTenant } from "../../shared/http/tenant.ts";
import { HandleSchema, PrefillRequestSchema } from "../../shared/http/wire.ts";
import { fastChunkRoutes } from "./chunk-route.ts";
import type { PrefillService } from "./service.ts";

const prefillRoute = createRoute({
  method: "post",
  path: "/v1/prefill",
  tags: ["prefill"],
  summary: "Prefill a prompt; its KV goes to this instance's shard and the answer is a handle for decode",
  request: { body: { content: { "application/json": { schema: PrefillRequestSchema } }, required: true } },
  responses: {
    200: { content: { "application/json": { schema: HandleSchema } }, description: "Handle: request id, first token, chunk ids, shard and epoch, model fingerprint" },
    ...errorResponses(400, 409, 413, 429, 499, 500, 503),
  },
});

const statusRoute = createRoute({
  method: "get",
  path: "/v1/prefill/status",
  tags: ["prefill"],
  summary: "Shard occupancy, prefills running and queued, totals",
  responses: { 200: { content: { "application/json": { schema: z.record(z.string(), z.unknown()) } }, description: "Status" } },
});

export function prefillRoutes(svc: PrefillService): ServiceApp {
  const app = newApp();
  app.openapi(prefillRoute, async (c) => c.json(await svc.prefill(c.req.valid("json"), c.req.raw.signal, c.get("log"), forwardedTenant(c)), 200));
  app.openapi(statusRoute, (c) => c.json(svc.status() as unknown as Record<string, unknown>, 200));
  app.route("/", fastChunkRoutes((id) => svc.chunkSource(id)));
  app.openAPIRegistry.registerPath({
    method: "get",
    path: "/v1/chunks/{shardId}/{epoch}",
    tags: ["prefill"],
    summary: "Bytes of one chunk (a range of a shard), for decode instances on other hosts",
    request: {
      params: z.object({ shardId: z.string(), epoch: z.string() }),
      query: z.object({ offset: z.string(), length: z.string() }),
    },
    responses: {
      200: { description: "The chunk's bytes", content: { "application/octet-stream": { schema: z.string().openapi({ format: "binary" }) } } },
      400: { description: "Malformed query" },
      404: { description: "No such shard here" },
      409: { description: "Stale epoch: the shard restarted" },
      410: { description: "The range is not allocated (freed or never written)" },
      416: { description: "Range outside the shard" },
    },
  });
  return app;
}
