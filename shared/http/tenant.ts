// Who a request is for: the authenticated API key's id ("local" when the server runs keyless), set
// by the public listener's key check or, on the internal listener, from the signed capability a
// decode sends (shared/auth/). Fair queuing, the per-key caps, request ids and chunk keys use it.
import type { Context } from "hono";
import type { AppEnv } from "./app.ts";

/** The request's tenant as the app's middleware set it. */
export function requestTenant(c: Context<AppEnv>): string {
  return c.get("tenant") ?? "local";
}
