// The router's HTTP app: the decodes' public API, each route forwarded to the decode that holds
// its KV (router.ts), behind the deployment's one gate for API keys and their rate and concurrency
// limits. The router reads only what routing needs from a body (a session id, a previous response,
// the messages); the decode validates the whole request and answers its errors.
import type { Context } from "hono";
import { apiKeyAuth, hostCheck } from "../../shared/platform/auth/middleware.ts";
import type { Security } from "../../shared/platform/auth/security.ts";
import { createApp, type AppEnv, type ServiceApp } from "../../shared/platform/http/app.ts";
import { ApiError } from "../../shared/platform/http/errors.ts";
import { SessionId } from "../../shared/platform/http/wire.ts";
import { isDatabaseUnavailable, type DbProbe } from "../../shared/platform/registry/db-probe.ts";
import type { Logger } from "pino";
import type { HashedMessage } from "../sessions/message-hashes.ts";
import type { KvHint, Router } from "./router.ts";

export interface RouterAppOptions {
  router: Router;
  security: Security;
  dbProbe: DbProbe;
  log: Logger;
  maxBodyBytes: number;
  /** Routers alive, this one included: each holds that share of every key's limits. */
  routers: () => number;
  /** Stopping: /ready answers 503 so the load balancer stops sending requests here. */
  draining: () => boolean;
}

/** The JSON body, or undefined when it is not an object (the decode answers what is wrong with it). */
function parsed(text: string | undefined): Record<string, unknown> | undefined {
  if (!text) return undefined;
  try {
    const v: unknown = JSON.parse(text);
    return v !== null && typeof v === "object" && !Array.isArray(v) ? (v as Record<string, unknown>) : undefined;
  } catch {
    return undefined;
  }
}

/** A session id in a field or header, when well formed (a malformed one is the decode's 400 to answer). */
function sessionId(value: unknown): string | undefined {
  const r = SessionId.safeParse(value);
  return r.success ? r.data : undefined;
}

/** Chat messages of the shape the decode takes; anything else hashes to nothing. */
function messagesOf(value: unknown): HashedMessage[] | undefined {
  if (!Array.isArray(value)) return undefined;
  const out: HashedMessage[] = [];
  for (const m of value) {
    if (
      m === null ||
      typeof m !== "object" ||
      typeof (m as HashedMessage).role !== "string" ||
      typeof (m as HashedMessage).content !== "string"
    )
      return undefined;
    out.push({ role: (m as HashedMessage).role, content: (m as HashedMessage).content });
  }
  return out;
}

/** Where a generation's KV may be: its named session, else the session its messages continue. */
function generationHint(c: Context<AppEnv>, body: Record<string, unknown> | undefined): KvHint {
  const named = sessionId(body?.session_id) ?? sessionId(c.req.header("x-session-id"));
  if (named) return { session: named };
  const messages = messagesOf(body?.messages);
  return messages ? { messages } : {};
}

export function buildRouterApp(o: RouterAppOptions): ServiceApp {
  const { router, security } = o;
  const app = createApp({
    log: o.log,
    maxBodyBytes: o.maxBodyBytes,
    classifyError: (err) =>
      isDatabaseUnavailable(err)
        ? new ApiError(503, "not_ready", "the registry database is unreachable; retry shortly", null, undefined, { cause: err })
        : undefined,
  });
  app.use("*", hostCheck(security.hosts));
  app.use("/v1/*", apiKeyAuth(security.keys, security.limiter));

  app.get("/health", (c) => c.json({ status: "ok" }, 200));
  app.get("/ready", async (c) => {
    const db = await o.dbProbe.check();
    const decodes = router.targets().length;
    const ready = db.ok && decodes > 0 && !o.draining();
    const body = {
      status: o.draining() ? "draining" : ready ? "ready" : "not ready",
      database: db.ok ? "reachable" : "unreachable",
      decodes,
      routers: o.routers(),
    };
    return c.json(body, ready ? 200 : 503);
  });
  app.get("/metrics", async (c) => c.body(await router.metrics.metrics(), 200, { "content-type": router.metrics.contentType }));

  const text = async (c: Context<AppEnv>) =>
    c.req.method === "GET" || c.req.method === "HEAD" || c.req.method === "DELETE" ? undefined : await c.req.text();
  const send = async (c: Context<AppEnv>, hint: (body: Record<string, unknown> | undefined) => KvHint) => {
    const body = await text(c);
    return router.send(c, body, hint(parsed(body)));
  };

  app.post("/v1/chat/completions", (c) => send(c, (b) => generationHint(c, b)));
  app.post("/v1/completions", (c) => send(c, (b) => generationHint(c, b)));
  app.post("/v1/responses", (c) =>
    send(c, (b): KvHint => {
      const previous = typeof b?.previous_response_id === "string" ? b.previous_response_id : undefined;
      return previous ? { response: previous } : {};
    }),
  );
  // A stored response lives in the registry (any decode answers GET); deleting the last turn also
  // ends its chain's session, which only its holder can.
  app.get("/v1/responses/:id", (c) => send(c, () => ({})));
  app.delete("/v1/responses/:id", (c) => send(c, () => ({ response: c.req.param("id") })));
  app.on(["GET", "DELETE"], "/v1/sessions/:id", (c) =>
    send(c, (): KvHint => {
      const id = sessionId(c.req.param("id"));
      return id ? { session: id } : {};
    }),
  );
  app.post("/v1/decode", (c) => send(c, () => ({})));
  app.get("/v1/models", (c) => send(c, () => ({})));
  // The API's description and its page: the decodes serve them. (Each decode's dashboard shows
  // that instance and reads its /metrics: open it on the decode, not here.)
  for (const path of ["/openapi.json", "/docs", "/docs/assets/:asset"]) app.get(path, (c) => send(c, () => ({})));
  app.get("/", (c) => c.redirect("/docs"));
  return app;
}
