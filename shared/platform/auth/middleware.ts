// The public listener's gate: the Host check (DNS rebinding) and the API key with its limits.
// Both throw ApiErrors, which the app's error handler answers in the shared shape.
import type { HttpBindings } from "@hono/node-server";
import type { Context, MiddlewareHandler } from "hono";
import type { AppEnv } from "../http/app.ts";
import { ApiError, withHeaders } from "../http/errors.ts";
import { LOCAL_TENANT, type ApiKeys } from "./api-keys.ts";
import type { AllowedHosts } from "./hosts.ts";
import type { KeyLimiter } from "./rate-limit.ts";

/** Liveness and readiness stay reachable by IP (kubelet probes send the pod IP as Host). */
const PROBES = new Set(["/health", "/ready"]);

export function hostCheck(allowed: AllowedHosts): MiddlewareHandler<AppEnv> {
  return async (c, next) => {
    if (PROBES.has(c.req.path) || allowed.allows(c.req.header("host"))) return next();
    throw new ApiError(421, "misdirected_request", "this server does not answer for that Host (allow it with --allowed-hosts)");
  };
}

/** The bearer token of a request, or undefined. */
export function bearer(c: Context): string | undefined {
  const m = /^Bearer[ \t]+(\S+)[ \t]*$/i.exec(c.req.header("authorization") ?? "");
  return m?.[1];
}

/**
 * Authenticates `/v1/*` with an API key and applies its rate and concurrency limits; sets the
 * tenant (the key id). Without keys (a loopback `serve`) every request is the tenant "local".
 */
export function apiKeyAuth(keys: ApiKeys | undefined, limiter: KeyLimiter): MiddlewareHandler<AppEnv> {
  return async (c, next) => {
    if (!keys) {
      c.set("tenant", LOCAL_TENANT);
      return next();
    }
    const token = bearer(c);
    const entry = token === undefined ? undefined : keys.verify(token);
    if (!entry) {
      const challenge = token === undefined ? 'Bearer realm="ctxbank"' : 'Bearer realm="ctxbank", error="invalid_token"';
      const message = token === undefined ? "this API needs a key: send Authorization: Bearer <key>" : "the API key is not valid";
      throw withHeaders(new ApiError(401, "unauthorized", message), { "www-authenticate": challenge });
    }
    const admission = limiter.admit(entry.id, entry.limits);
    if (!admission.ok) {
      const message =
        admission.code === "rate_limited"
          ? `the API key's request rate (${entry.limits.rate}/s, burst ${entry.limits.burst}) is spent; retry after ${admission.retryAfterS} s`
          : `the API key already has ${entry.limits.concurrency} requests in flight; retry when one ends`;
      throw withHeaders(new ApiError(429, admission.code, message), { "retry-after": String(admission.retryAfterS) });
    }
    c.set("tenant", entry.id);
    // A streamed answer is in flight until its last byte: release when the socket's response
    // closes; without a Node response (app.request) when the handler returns.
    const outgoing = (c.env as Partial<HttpBindings> | undefined)?.outgoing;
    if (outgoing && "once" in outgoing) outgoing.once("close", admission.release);
    try {
      await next();
    } finally {
      if (!outgoing || !("once" in outgoing)) admission.release();
    }
  };
}
