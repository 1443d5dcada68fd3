// Who may read chunk bytes: only a decode holding a live read lease on exactly that chunk. The
// request must carry a capability signed with the services' shared secret (shared/platform/auth/capability.ts)
// naming the chunk, its shard, epoch and exact byte range, the request that leased it and its
// tenant; and the registry must agree right now — the chunk row has that range, is being read
// with an unexpired lease, and the request holds it. Knowing a shard, epoch and offset (or any
// sub-range of a live allocation) is therefore worth nothing without the secret and the lease.
import type { MiddlewareHandler } from "hono";
import type { InternalAuth } from "../../shared/platform/auth/capability.ts";
import { bearer } from "../../shared/platform/auth/middleware.ts";
import { ownsRequest } from "../../shared/platform/auth/tenant.ts";
import type { AppEnv } from "../../shared/platform/http/app.ts";
import { ApiError, withHeaders } from "../../shared/platform/http/errors.ts";
import type { Registry } from "../../shared/platform/registry/registry.ts";

const DIGITS = /^(0|[1-9][0-9]{0,15})$/;

export function chunkReadAuth(auth: InternalAuth, registry: Registry): MiddlewareHandler<AppEnv> {
  return async (c, next) => {
    const token = bearer(c);
    const cap = token === undefined ? undefined : auth.verify(token);
    if (!cap) {
      throw withHeaders(new ApiError(401, "unauthorized", "chunk reads need a capability from the decode that leased the chunk"), {
        "www-authenticate": 'Bearer realm="ctxbank-internal"',
      });
    }
    // Mounted on /v1/chunks/*, so the route's params are not parsed yet: read them from the path.
    const m = /^\/v1\/chunks\/([^/]+)\/([^/]+)$/.exec(c.req.path);
    let shardId = "";
    try {
      shardId = m ? decodeURIComponent(m[1]!) : "";
    } catch {
      // a malformed escape names no shard
    }
    const epoch = m?.[2] ?? "";
    const offset = c.req.query("offset") ?? "";
    const length = c.req.query("length") ?? "";
    const exact =
      cap.route === "chunk" &&
      shardId !== "" &&
      cap.shard === shardId &&
      DIGITS.test(epoch) &&
      DIGITS.test(offset) &&
      DIGITS.test(length) &&
      cap.epoch === Number(epoch) &&
      cap.offset === Number(offset) &&
      cap.length === Number(length) &&
      ownsRequest(cap.tenant, cap.request);
    const leased =
      exact &&
      (await registry.chunks.isLeasedRead({
        chunkId: cap.chunk,
        requestId: cap.request,
        shardId,
        epoch: cap.epoch,
        offset: cap.offset,
        length: cap.length,
      }));
    if (!leased) {
      throw new ApiError(
        403,
        "forbidden",
        "the capability does not allow this read: not exactly a chunk its request holds a live read lease on",
      );
    }
    c.set("tenant", cap.tenant);
    return next();
  };
}
