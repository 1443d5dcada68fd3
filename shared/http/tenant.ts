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
 * For internal routes a decode calls on a client's behalf: the forwarded tenant when the header
 * holds a well-formed one, else the caller's own. (Only callers that can reach the internal
 * routes can set it; it steers fairness and quotas, not access.)
 */
export function forwardedTenant(c: Context<AppEnv>): string {
  const h = c.req.header(TENANT_HEADER);
  return h !== undefined && TENANT.test(h) ? h : requestTenant(c);
}
