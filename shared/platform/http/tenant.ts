// Who a request is for: the authenticated API key's id, the tenant a signed capability names on
// the internal listener, or "local" when the server runs keyless (shared/platform/auth/). Fair queuing and
// the per-key caps are keyed by it.
import type { Context } from "hono";
import type { AppEnv } from "./app.ts";

/** The request's tenant as the auth middleware set it. */
export function requestTenant(c: Context<AppEnv>): string {
  return c.get("tenant") ?? "local";
}
