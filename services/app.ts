// The two HTTP apps over whichever services this process runs. Public: the OpenAI routes,
// /v1/prefill and /v1/decode behind an API key, GET /health, /ready, /metrics, the OpenAPI
// document, the docs page and the dashboard. /ready is 503 until registered, while draining,
// and while the registry database does not answer. Internal (a separate listener, for the other
// services): the decode's prefill calls and the chunk bytes behind signed capabilities, status
// behind the shared secret.
import { createRoute, z } from "@hono/zod-openapi";
import type { Context } from "hono";
import { apiKeyAuth, hostCheck } from "../shared/platform/auth/middleware.ts";
import type { Security } from "../shared/platform/auth/security.ts";
import { createApp, newApp, type AppEnv, type ServiceApp } from "../shared/platform/http/app.ts";
import { ApiError } from "../shared/platform/http/errors.ts";
import type { ServiceMetrics } from "../shared/platform/metrics/metrics.ts";
import { isDatabaseUnavailable, type DbProbe } from "../shared/platform/registry/db-probe.ts";
import { docsRoutes } from "./docs.ts";
import { decodeRoutes, decodeStatusRoutes } from "./decode/routes.ts";
import { openaiRoutes } from "./decode/openai.ts";
import { responsesRoutes } from "./decode/responses.ts";
import { sessionRoutes } from "./decode/sessions.ts";
import { dashboardRoutes } from "./decode/dashboard/route.ts";
import type { DecodeService } from "./decode/service.ts";
import { internalSecret, prefillCapability } from "./internal-auth.ts";
import { chunkReadAuth } from "./handoff/index.ts";
import { chunkRoutes, prefillRoutes, prefillStatusRoutes } from "./prefill/routes.ts";
import type { PrefillService } from "./prefill/service.ts";
import type { Runtime } from "./runtime.ts";

export interface Services {
  prefill?: PrefillService;
  decode?: DecodeService;
}

const Health = z
  .object({
    status: z.string(),
    services: z.record(z.string(), z.string()).optional(),
    database: z
      .enum(["reachable", "unreachable"])
      .optional()
      .openapi({ description: "The registry database answered `select 1` within a second (checked at most every 2 s)" }),
  })
  .openapi("Health");

/** A registry outage is a 503 the client may retry, not an internal error. */
function classifyError(err: unknown): ApiError | undefined {
  return isDatabaseUnavailable(err)
    ? new ApiError(503, "not_ready", "the registry database is unreachable; retry shortly", null, undefined, { cause: err })
    : undefined;
}

/** The routes that run a generation: their error answers count as request failures. */
const GENERATION_ROUTES = new Set(["/v1/completions", "/v1/chat/completions", "/v1/decode"]);

/**
 * Counts a generation request answered with an error status as a failure, by the answer's code
 * (the error handler leaves it on the context), unless the decode service counted it already
 * (errors it threw are marked): this catches what never reached it (validation, unknown model,
 * body too large, a refused key).
 */
function countErrorAnswer(metrics: ServiceMetrics, c: Context<AppEnv>): void {
  if (c.req.method !== "POST" || c.res.status < 400 || !GENERATION_ROUTES.has(c.req.path)) return;
  metrics.responseFailed(c.get("errorCode") ?? "internal_error", c.error);
}

const metricsRoute = createRoute({
  method: "get",
  path: "/metrics",
  tags: ["ops"],
  security: [],
  summary: "Prometheus metrics of every service in this process (text exposition format)",
  responses: { 200: { content: { "text/plain": { schema: z.string() } }, description: "Metrics; docs/operations.md describes each one" } },
});

/** /health, /ready and /metrics: on both listeners. */
function opsRoutes(services: Services, metrics: ServiceMetrics, dbProbe: DbProbe): ServiceApp {
  const app = newApp();
  const states = () => ({
    ...(services.prefill ? { prefill: services.prefill.ready ? "ready" : "not ready" } : {}),
    ...(services.decode ? { decode: services.decode.ready ? "ready" : "not ready" } : {}),
  });
  app.openapi(
    createRoute({
      method: "get",
      path: "/health",
      tags: ["ops"],
      security: [],
      summary: "Liveness",
      responses: { 200: { content: { "application/json": { schema: Health } }, description: "Alive" } },
    }),
    (c) => c.json({ status: "ok" }, 200),
  );
  app.openapi(
    createRoute({
      method: "get",
      path: "/ready",
      tags: ["ops"],
      security: [],
      summary: "Readiness: every service in this process is registered and not draining, and the registry database answers",
      responses: {
        200: { content: { "application/json": { schema: Health } }, description: "Ready" },
        503: { content: { "application/json": { schema: Health } }, description: "Starting, draining, or the database is unreachable" },
      },
    }),
    async (c) => {
      const s = states();
      const db = await dbProbe.check();
      const database = db.ok ? ("reachable" as const) : ("unreachable" as const);
      const ready = db.ok && Object.values(s).every((v) => v === "ready");
      return ready ? c.json({ status: "ready", services: s, database }, 200) : c.json({ status: "not ready", services: s, database }, 503);
    },
  );
  app.openapi(metricsRoute, async (c) => c.body(await metrics.text(), 200, { "content-type": metrics.contentType }) as never);
  return app;
}

export function buildApp(rt: Runtime, services: Services, metrics: ServiceMetrics, security: Security, dbProbe: DbProbe): ServiceApp {
  const app = createApp({
    log: rt.log,
    maxBodyBytes: rt.config.maxBodyBytes,
    onResponse: (c) => countErrorAnswer(metrics, c),
    classifyError,
  });
  app.use("*", hostCheck(security.hosts));
  app.use("/v1/*", apiKeyAuth(security.keys, security.limiter));
  app.route("/", opsRoutes(services, metrics, dbProbe));
  if (services.prefill) app.route("/", prefillRoutes(services.prefill));
  if (services.decode) {
    app.route("/", decodeRoutes(services.decode));
    app.route("/", openaiRoutes(rt, services.decode));
    app.route("/", responsesRoutes(rt, services.decode));
    app.route("/", sessionRoutes(rt, services.decode));
    app.route("/", dashboardRoutes());
  }
  // Built on the first request (every route is registered by then) and kept: it never changes
  // while the process runs, and building it costs ~10 ms of CPU.
  let openapi: unknown;
  app.get("/openapi.json", (c) => c.json((openapi ??= app.getOpenAPI31Document(OPENAPI_DOCUMENT))));
  app.openAPIRegistry.registerComponent("securitySchemes", "apiKey", { type: "http", scheme: "bearer" });
  app.route("/", docsRoutes());
  app.get("/", (c) => c.redirect("/docs"));
  return app;
}

const OPENAPI_DOCUMENT = {
  openapi: "3.1.0",
  security: [{ apiKey: [] }],
  info: {
    title: "ctxbank",
    version: "0.1.0",
    description:
      "Disaggregated prefill and decode over a native engine. `/v1/*` takes `Authorization: Bearer <API key>` when the server has keys. Errors are `{ error: { message, type, code, param } }` with a machine-readable `code`.",
  },
  tags: [
    { name: "openai", description: "OpenAI-compatible routes (decode service)" },
    { name: "decode", description: "Decode service" },
    { name: "prefill", description: "Prefill service" },
    { name: "ops", description: "Health, readiness and metrics" },
  ],
} satisfies Parameters<ServiceApp["getOpenAPI31Document"]>[0];

/** The internal listener's app: what only the other services (and operators holding the secret) call. */
export function buildInternalApp(
  rt: Runtime,
  services: Services,
  metrics: ServiceMetrics,
  security: Security,
  dbProbe: DbProbe,
): ServiceApp {
  const app = createApp({ log: rt.log, maxBodyBytes: rt.config.maxBodyBytes, classifyError });
  app.use("*", hostCheck(security.hosts));
  app.use("/v1/prefill", prefillCapability(security.internal));
  app.use("/v1/chunks/*", chunkReadAuth(security.internal, rt.registry));
  app.use("/v1/prefill/status", internalSecret(security.internal));
  app.use("/v1/decode/status", internalSecret(security.internal));
  app.route("/", opsRoutes(services, metrics, dbProbe));
  if (services.prefill) {
    app.route("/", prefillRoutes(services.prefill));
    app.route("/", prefillStatusRoutes(services.prefill));
    app.route("/", chunkRoutes(services.prefill));
  }
  if (services.decode) app.route("/", decodeStatusRoutes(services.decode));
  return app;
}
