// What separates tenants (API keys) in the registry: request ids live in the tenant's namespace
// (`<tenant>:<id>`), so one client's `request_id` can never name, block or consume another's
// request; and chunk content keys are salted with the tenant, so identical prefixes of different
// tenants never share a chunk (no prefix-reuse side channel). The keyless tenant "local" (one
// user, nobody to separate from) keeps plain ids and unsalted keys.
import { LOCAL_TENANT } from "./api-keys.ts";

/** The registry id of a client's request id (or of a generated one). */
export function namespacedRequestId(tenant: string, id: string): string {
  return tenant === LOCAL_TENANT ? id : `${tenant}:${id}`;
}

/** Whether a registry request id belongs to `tenant`. Client ids cannot hold ':', so the prefix is the owner. */
export function ownsRequest(tenant: string, requestId: string): boolean {
  const colon = requestId.indexOf(":");
  return colon < 0 ? tenant === LOCAL_TENANT : requestId.slice(0, colon) === tenant;
}

/** The tenant a registry request id belongs to. */
export function tenantOf(requestId: string): string {
  const colon = requestId.indexOf(":");
  return colon < 0 ? LOCAL_TENANT : requestId.slice(0, colon);
}

/** The salt mixed into the tenant's chunk keys; none for the keyless tenant. */
export function chunkKeySalt(tenant: string): string | undefined {
  return tenant === LOCAL_TENANT ? undefined : tenant;
}
