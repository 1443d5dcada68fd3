// HTTP surface of the prefill service: POST /v1/prefill (public behind an API key, and on the
// internal listener for decodes), the chunk byte route decode instances read from and
// GET /v1/prefill/status (internal listener only).
import { createRoute, z } from "@hono/zod-openapi";
import { newApp, type ServiceApp } from "../../shared/platform/http/app.ts";
import { errorResponses } from "../../shared/platform/http/errors.ts";
import { HandleSchema, PrefillRequestSchema } from "../../shared/platform/http/wire.ts";
import { fastChunkRoutes, handleStreamResponse } from "../handoff/index.ts";
import type { PrefillService } from "./service.ts";

const prefillRoute = createRoute({
  method: "post",
  path: "/v1/prefill",
  tags: ["prefill"],
  summary: "Prefill a prompt; its KV goes to this instance's shard and the answer is a handle for decode",
  request: { body: { content: { "application/json": { schema: PrefillRequestSchema } }, required: true } },
  responses: {
    200: {
      content: { "application/json": { schema: HandleSchema }, "application/x-ndjson": { schema: z.string() } },
      description:
        "Handle: request id, first token, chunk ids, shard and epoch, model fingerprint; with stream: NDJSON lines (services/handoff/handle-stream.ts)",
    },
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
  app.openapi(prefillRoute, async (c) => {
    const body = c.req.valid("json");
    if (body.stream)
      return (await handleStreamResponse(c.req.raw.signal, (progress, signal) =>
        svc.prefill(body, signal, c.get("log"), c.get("tenant"), progress),
      )) as never;
    return c.json(await svc.prefill(body, c.req.raw.signal, c.get("log"), c.get("tenant")), 200);
  });
  return app;
}

/** GET /v1/prefill/status: on the internal listener only (it names the shard, its epoch and reuse counters). */
export function prefillStatusRoutes(svc: PrefillService): ServiceApp {
  const app = newApp();
  app.openapi(statusRoute, (c) => c.json(svc.status() as unknown as Record<string, unknown>, 200));
  return app;
}

/** The chunk byte route over the prefill's shard, on the internal listener behind chunkReadAuth (services/handoff/chunk-auth.ts). */
export function chunkRoutes(svc: PrefillService) {
  return fastChunkRoutes((id) => svc.owner.chunkSource(id));
}
