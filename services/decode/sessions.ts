// GET and DELETE /v1/sessions/{id}: a conversation whose KV this decode keeps between turns
// (services/sessions/), as its API key sees it. Another key's session is answered as unknown.
import { createRoute, z } from "@hono/zod-openapi";
import { newApp, type ServiceApp } from "../../shared/platform/http/app.ts";
import { ApiError, errorResponses } from "../../shared/platform/http/errors.ts";
import { requestTenant } from "../../shared/platform/http/tenant.ts";
import { SessionId } from "../../shared/platform/http/wire.ts";
import type { Runtime } from "../runtime.ts";
import type { DecodeService } from "./service.ts";

const SessionSchema = z
  .object({
    id: z.string(),
    object: z.literal("session"),
    tokens: z.number().int().openapi({ description: "Tokens whose KV is kept: the last turn's prompt and answer" }),
    bytes: z.number().int(),
    tier: z.enum(["memory", "disk"]),
    turns: z.number().int(),
    round_starts: z.array(z.number().int()),
    created_at: z.number(),
    last_used_at: z.number(),
    expires_at: z.number(),
  })
  .openapi("Session");

const IdParam = z.object({ id: SessionId });
const getRoute = createRoute({
  method: "get",
  path: "/v1/sessions/{id}",
  tags: ["decode"],
  summary: "A conversation kept between turns: its size, tier and rounds",
  request: { params: IdParam },
  responses: {
    200: { description: "The session", content: { "application/json": { schema: SessionSchema } } },
    ...errorResponses(400, 404),
  },
});
const deleteRoute = createRoute({
  method: "delete",
  path: "/v1/sessions/{id}",
  tags: ["decode"],
  summary: "Ends a conversation: its KV is freed; its next turn computes the whole prompt",
  request: { params: IdParam },
  responses: {
    200: {
      description: "Ended",
      content: { "application/json": { schema: z.object({ id: z.string(), object: z.literal("session.deleted"), deleted: z.boolean() }) } },
    },
    ...errorResponses(400, 404),
  },
});

const unknownSession = (id: string) => new ApiError(404, "unknown_session", `no session ${JSON.stringify(id)} is kept here`, "id");
const seconds = (ms: number) => Math.floor(ms / 1000);

export function sessionRoutes(rt: Runtime, svc: DecodeService): ServiceApp {
  const app = newApp();
  app.openapi(getRoute, (c) => {
    const { id } = c.req.valid("param");
    const s = svc.sessions?.summary(requestTenant(c), id);
    if (!s) throw unknownSession(id);
    return c.json(
      {
        id,
        object: "session" as const,
        tokens: s.tokens,
        bytes: s.bytes,
        tier: s.tier,
        turns: s.turns,
        round_starts: s.roundStarts,
        created_at: seconds(s.createdAt),
        last_used_at: seconds(s.lastUsedAt),
        expires_at: seconds(s.expiresAt),
      },
      200,
    );
  });
  app.openapi(deleteRoute, async (c) => {
    const { id } = c.req.valid("param");
    const tenant = requestTenant(c);
    if (!svc.sessions || !(await svc.sessions.remove(tenant, id))) throw unknownSession(id);
    await rt.registry.sessions.remove(`${tenant}:${id}`, svc.instanceId).catch(() => false); // the row expires anyway
    return c.json({ id, object: "session.deleted" as const, deleted: true }, 200);
  });
  return app;
}
