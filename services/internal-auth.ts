// Authentication on the internal listener. The decode's prefill call carries a `prefill`
// capability naming the tenant it acts for; operators (and Prometheus) reach status with the
// shared secret itself as the bearer token. Chunk reads have their own check (handoff/chunk-auth.ts).
import type { MiddlewareHandler } from "hono";
import { Nonces, type InternalAuth } from "../shared/platform/auth/capability.ts";
import { bearer } from "../shared/platform/auth/middleware.ts";
import type { AppEnv } from "../shared/platform/http/app.ts";
import { ApiError, withHeaders } from "../shared/platform/http/errors.ts";

const CHALLENGE = { "www-authenticate": 'Bearer realm="ctxbank-internal"' };

/** POST /v1/prefill from a decode: a valid `prefill` capability, used once; its tenant becomes the request's. */
export function prefillCapability(auth: InternalAuth): MiddlewareHandler<AppEnv> {
  const nonces = new Nonces();
  return async (c, next) => {
    const token = bearer(c);
    const cap = token === undefined ? undefined : auth.verify(token);
    if (cap?.route !== "prefill") {
      throw withHeaders(
        new ApiError(401, "unauthorized", "internal prefill calls need a prefill capability signed with the shared secret"),
        CHALLENGE,
      );
    }
    if (!nonces.use(cap.nonce, cap.exp)) {
      throw withHeaders(
        new ApiError(401, "unauthorized", "this prefill capability was used already (each call signs a new one)"),
        CHALLENGE,
      );
    }
    c.set("tenant", cap.tenant);
    return next();
  };
}

/** Status and metrics on the internal listener: the shared secret as the bearer token. */
export function internalSecret(auth: InternalAuth): MiddlewareHandler<AppEnv> {
  return async (c, next) => {
    const token = bearer(c);
    if (token === undefined || !auth.isSecret(token)) {
      throw withHeaders(
        new ApiError(401, "unauthorized", "internal status needs Authorization: Bearer <the shared internal secret>"),
        CHALLENGE,
      );
    }
    return next();
  };
}
