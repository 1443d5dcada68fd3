// Who a request is for: the authenticated API key's id ("local" when the server runs keyless).
// Fair queuing and the per-key caps are keyed by it. Decode forwards it to the prefill it calls
// in TENANT_HEADER, so the prefill's queue and shard cap see the client, not the decode.
import type { Context } from "hono";
import type { AppEnv } from "./app.ts";

export const TENANT_HEADER = "x-ctxbank-tenant";
const TENANT = /^[A-Za-z0-9][A-Za-z0-9._:@-]{0,127}$/;

/** The request's tenant as the app's middleware set it. */
export function requestTenant(c: Context<AppEnv>): string {
  return c.get("tenant") ?? "local";
}

/**
 * For internal routes a decode calls on a client's behalf: the tenant forwarded in TENANT_HEADER
 * when the caller has no key of its own (keyless, or a service caller the auth layer leaves
 * unkeyed), else the caller's own key, so a client with a key cannot charge its work to another.
 */
export function forwardedTenant(c: Context<AppEnv>): string {
  const own = requestTenant(c);
  const h = c.req.header(TENANT_HEADER);
  return own === "local" && h !== undefined && TENANT.test(h) ? h : own;
}
