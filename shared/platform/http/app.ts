// The Hono app every service starts from: request ids, one structured log line per request,
// a body limit whose 413 closes the connection (so a pooled client does not reuse a half-read socket), uniform validation errors, and an
// error handler that turns anything thrown into the shared error shape.
import { OpenAPIHono } from "@hono/zod-openapi";
import type { Context } from "hono";
import type { ContentfulStatusCode } from "hono/utils/http-status";
import { bodyLimit } from "hono/body-limit";
import { HTTPException } from "hono/http-exception";
import { requestId } from "hono/request-id";
import type { Logger } from "pino";
import { ApiError, errorBody } from "./errors.ts";
import { PolicySpecSchema } from "./wire.ts";
import { bodyTimedOut } from "./server.ts";

/**
 * arrivedAt: performance.now() when the request reached the service (TTFT starts there).
 * tenant: who the request is for — the API key's id, a capability's tenant on the internal
 * listener, or "local" on a keyless server (shared/platform/auth/); fair queuing and per-key caps use it too.
 */
export type AppEnv = { Variables: { requestId: string; log: Logger; arrivedAt: number; tenant: string } };
export type ServiceApp = OpenAPIHono<AppEnv>;

export interface AppOptions {
  log: Logger;
  maxBodyBytes: number;
  /** Called once the response is made (status and headers known; a stream may still be running), before the request's log line. */
  onResponse?: (c: Context<AppEnv>) => void | Promise<void>;
  /** Turns an error the routes did not expect into an answer (a database outage into a 503, say). */
  classifyError?: (err: Error) => ApiError | undefined;
}

/**
 * A validation failure as a 400 naming the first offending field: invalid_policy when it is in
 * the policy, unknown_field for a key the route does not take (its param names the key).
 */
function validationHook(result: { success: boolean; error?: { issues: { path: PropertyKey[]; message: string; code?: string; keys?: string[] }[] } }, c: Context) {
  if (result.success || !result.error) return;
  const issues = result.error.issues;
  const first = issues[0];
  const unknownKey = first?.code === "unrecognized_keys" ? first.keys?.[0] : undefined;
  const path = first ? [...first.path, ...(unknownKey === undefined ? [] : [unknownKey])] : [];
  const param = path.length > 0 ? path.map(String).join(".") : null;
  const message = issues
    .slice(0, 5)
    .map((i) => (i.path.length ? `${i.path.map(String).join(".")}: ${i.message}` : i.message))
    .join("; ");
  // A malformed attention policy (unknown kind, field out of range) is invalid_policy, like one the model cannot run.
  const code = first?.path.includes("policy") ? "invalid_policy" : unknownKey !== undefined ? "unknown_field" : "invalid_request";
  return c.json(errorBody(400, code, `invalid request: ${message}`, param, issues), 400);
}

export function newApp(): ServiceApp {
  const app = new OpenAPIHono<AppEnv>({ defaultHook: validationHook });
  // The policy component from its own schema (with its own description) before any route's field uses it.
  app.openAPIRegistry.register("AttentionPolicy", PolicySpecSchema);
  return app;
}

/** The outermost app: middleware and error handling around the services' routes. */
export function createApp(options: AppOptions): ServiceApp {
  const app = newApp();
  app.use("*", requestId({ headerName: "x-request-id" }));
  app.use("*", async (c, next) => {
    const start = performance.now();
    const log = options.log.child({ reqId: c.get("requestId") });
    c.set("log", log);
    c.set("arrivedAt", start);
    await next();
    await options.onResponse?.(c);
    const level = c.res.status >= 500 ? "error" : c.res.status >= 400 ? "warn" : "info";
    log[level]({ method: c.req.method, path: c.req.path, status: c.res.status, ms: Math.round(performance.now() - start) }, "request");
  });
  app.use(
    "/v1/*",
    bodyLimit({
      maxSize: options.maxBodyBytes,
      onError: (c) =>
        c.json(errorBody(413, "payload_too_large", `the request body exceeds ${options.maxBodyBytes} bytes`), 413, { connection: "close" }),
    }),
  );
  app.onError((err, c) => {
    // The listener found the body stalled and failed its read (server.ts): whatever the read's
    // error became on the way (a JSON or validation error), the answer is 408 and a closed connection.
    const stalled = bodyTimedOut((c.env as { incoming?: unknown } | undefined)?.incoming);
    if (stalled !== undefined) return c.json(errorBody(408, "request_timeout", stalled), 408, { connection: "close" });
    if (err instanceof ApiError) {
      // Every 429 says when to come back; a stage that cannot estimate it says one second.
      const headers = err.status === 429 && !err.headers["retry-after"] ? { ...err.headers, "retry-after": "1" } : err.headers;
      return c.json(err.toJSON(), err.status as ContentfulStatusCode, headers);
    }
    if (err instanceof HTTPException) {
      const status = err.status;
      const message = status === 400 && /JSON/i.test(err.message) ? `the request body is not valid JSON: ${err.message}` : err.message || "bad request";
      return c.json(errorBody(status, status === 413 ? "payload_too_large" : "invalid_request", message), status);
    }
    const known = options.classifyError?.(err);
    if (known) {
      (c.get("log") ?? options.log).warn({ err }, known.message);
      return c.json(known.toJSON(), known.status as ContentfulStatusCode);
    }
    (c.get("log") ?? options.log).error({ err }, "unhandled error");
    return c.json(errorBody(500, "internal_error", "internal error; see the service log"), 500);
  });
  app.notFound((c) => c.json(errorBody(404, "not_found", `no route ${c.req.method} ${c.req.path}`), 404));
  return app;
}
