// The Hono app every service starts from: request ids, one structured log line per request,
// a body limit whose 413 closes the connection (so a pooled client does not reuse a half-read socket), uniform validation errors, and the
// one error handler: whatever a route or middleware throws becomes the shared error shape, with the
// status its code has in the table (errors.ts), and the code is left on the context for metrics.
import { OpenAPIHono } from "@hono/zod-openapi";
import type { Context } from "hono";
import { bodyLimit } from "hono/body-limit";
import { HTTPException } from "hono/http-exception";
import { requestId } from "hono/request-id";
import type { Logger } from "pino";
import type { ContentfulStatusCode } from "hono/utils/http-status";
import { CtxbankError } from "../../inference/errors.ts";
import { ApiError, errorAnswer } from "./errors.ts";
import { isJsonMediaType, MAX_JSON_DEPTH, readJsonWithin } from "./json-depth.ts";
import { PolicySpecSchema } from "./wire.ts";
import { bodyTimedOut } from "./server.ts";

/**
 * arrivedAt: performance.now() when the request reached the service (TTFT starts there).
 * tenant: who the request is for — the API key's id, a capability's tenant on the internal
 * listener, or "local" on a keyless server (shared/platform/auth/); fair queuing and per-key caps use it too.
 */
export type AppEnv = {
  /** errorCode: the code of the error the request was answered with (set by the error handler). */
  Variables: { requestId: string; log: Logger; arrivedAt: number; tenant: string; errorCode: string | undefined };
};
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
function validationHook(result: {
  success: boolean;
  error?: { issues: { path: PropertyKey[]; message: string; code?: string; keys?: string[] }[] };
}) {
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
  throw new ApiError(400, code, `invalid request: ${message}`, param, issues);
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
    const code = c.get("errorCode");
    log[level](
      {
        method: c.req.method,
        path: c.req.path,
        status: c.res.status,
        ...(code ? { code } : {}),
        ms: Math.round(performance.now() - start),
      },
      "request",
    );
  });
  app.use(
    "/v1/*",
    bodyLimit({
      maxSize: options.maxBodyBytes,
      onError: () => {
        throw closing(new ApiError(413, "payload_too_large", `the request body exceeds ${options.maxBodyBytes} bytes`));
      },
    }),
  );
  // Every JSON body (public and internal routes) is scanned for its nesting as it arrives, before
  // any route parses it: one nested too deep is refused at once, unread past that point (and the
  // connection closed). The routes then read the body from the text read here.
  app.use("*", async (c, next) => {
    const body = c.req.raw.body;
    if (body && c.req.method !== "GET" && c.req.method !== "HEAD" && isJsonMediaType(c.req.header("content-type"))) {
      const text = await readJsonWithin(body, MAX_JSON_DEPTH);
      if (text === undefined)
        throw closing(
          new ApiError(400, "invalid_request", `the request body nests arrays and objects deeper than ${MAX_JSON_DEPTH} levels`),
        );
      c.req.raw = new Request(c.req.raw, { body: text });
    }
    await next();
  });
  /** Answers `err` (any thrown value) in the shared shape and records its code on the context. */
  const answer = (c: Context<AppEnv>, err: unknown): Response => {
    const a = errorAnswer(err);
    c.set("errorCode", a.body.error.code);
    if (a.unexpected) (c.get("log") ?? options.log).error({ err }, "request failed");
    return c.json(a.body, a.status as ContentfulStatusCode, a.headers);
  };
  app.onError((err, c) => {
    // The listener found the body stalled and failed its read (server.ts): whatever the read's
    // error became on the way (a JSON or validation error), the answer is 408 and a closed connection.
    const stalled = bodyTimedOut((c.env as { incoming?: unknown } | undefined)?.incoming);
    if (stalled !== undefined) return answer(c, closing(new ApiError(408, "request_timeout", stalled)));
    if (err instanceof HTTPException) {
      // Hono's own: a body that is not JSON (400), or one over the limit (413).
      const message = /JSON/i.test(err.message) ? `the request body is not valid JSON: ${err.message}` : err.message || "bad request";
      return answer(
        c,
        err.status === 413
          ? closing(new ApiError(413, "payload_too_large", message))
          : new ApiError(400, "invalid_request", message, null, undefined, { cause: err }),
      );
    }
    // Only what no code meant to throw is classified: a domain error's cause chain may hold a
    // refused connection that is not the database's (a KV owner's, say).
    const known = err instanceof CtxbankError ? undefined : options.classifyError?.(err);
    if (known) {
      (c.get("log") ?? options.log).warn({ err }, known.message);
      return answer(c, known);
    }
    return answer(c, err);
  });
  app.notFound((c) => answer(c, new ApiError(404, "not_found", `no route ${c.req.method} ${c.req.path}`)));
  return app;
}

/** The error, answered with a closed connection (so a pooled client does not reuse a half-read socket). */
function closing<E extends ApiError>(err: E): E {
  err.headers.connection = "close";
  return err;
}
