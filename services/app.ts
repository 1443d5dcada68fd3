// One HTTP app over whichever services this process runs: their routes, GET /health (liveness),
// GET /ready (503 until registered, and while draining), the OpenAPI document and a docs page.
import { swaggerUI } from "@hono/swagger-ui";
import { createRoute, z } from "@hono/zod-openapi";
import { createApp, type ServiceApp } from "../shared/http/app.ts";
import { decodeRoutes } from "./decode/routes.ts";
import { openaiRoutes } from "./decode/openai.ts";
import type { DecodeService } from "./decode/service.ts";
import { prefillRoutes } from "./prefill/routes.ts";
import type { PrefillService } from "./prefill/service.ts";
import type { Runtime } from "./runtime.ts";

export interface Services {
  prefill?: PrefillService;
  decode?: DecodeService;
}

const Health = z.object({ status: z.string(), services: z.record(z.string(), z.string()).optional() }).openapi("Health");

export function buildApp(rt: Runtime, services: Services): ServiceApp {
  const app = createApp({ log: rt.log, maxBodyBytes: rt.config.maxBodyBytes });
  const states = () => ({
    ...(services.prefill ? { prefill: services.prefill.ready ? "ready" : "not ready" } : {}),
    ...(services.decode ? { decode: services.decode.ready ? "ready" : "not ready" } : {}),
  });
  app.openapi(
    createRoute({ method: "get", path: "/health", tags: ["ops"], summary: "Liveness", responses: { 200: { content: { "application/json": { schema: Health } }, description: "Alive" } } }),
    (c) => c.json({ status: "ok" }, 200),
  );
  app.openapi(
    createRoute({
      method: "get",
      path: "/ready",
      tags: ["ops"],
      summary: "Readiness: every service in this process is registered and not draining",
      responses: {
        200: { content: { "application/json": { schema: Health } }, description: "Ready" },
        503: { content: { "application/json": { schema: Health } }, description: "Starting or draining" },
      },
    }),
    (c) => {
      const s = states();
      const ready = Object.values(s).every((v) => v === "ready");
      return ready ? c.json({ status: "ready", services: s }, 200) : c.json({ status: "not ready", services: s }, 503);
    },
  );
  if (services.prefill) app.route("/", prefillRoutes(services.prefill));
  if (services.decode) {
    app.route("/", decodeRoutes(services.decode));
    app.route("/", openaiRoutes(rt, services.decode));
  }
  app.doc31("/openapi.json", {
    openapi: "3.1.0",
    info: {
      title: "ctxbank",
      version: "0.1.0",
      description:
        "Disaggregated prefill and decode over a native engine. Errors are `{ error: { message, type, code, param } }` with a machine-readable `code`.",
    },
    tags: [
      { name: "openai", description: "OpenAI-compatible routes (decode service)" },
      { name: "decode", description: "Decode service" },
      { name: "prefill", description: "Prefill service" },
      { name: "ops", description: "Health and readiness" },
    ],
  });
  app.get("/docs", swaggerUI({ url: "/openapi.json", title: "ctxbank API" }));
  app.get("/", (c) => c.redirect("/docs"));
  return app;
}
