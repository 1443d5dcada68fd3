// Service-to-service authorisation: a shared secret (CTXBANK_INTERNAL_SECRET) and short-lived
// capabilities signed with it. A capability names what it allows — the route, the resource, for
// chunks the exact byte range and the request holding it, the tenant — and when it expires:
//
//   token = base64url(payload JSON) "." base64url(HMAC-SHA256(secret, "ctxbank/cap/v1\0" + payload JSON))
//
// The signature covers the payload's exact bytes (the canonical form is whatever was signed), so
// no re-serialisation can change what was authorised. Chosen over mTLS because it needs no CA or
// certificates to distribute, it authorises one byte range of one chunk for one request rather
// than a whole peer, and it costs one HMAC; encrypting the links (mTLS, a service mesh) stays the
// deployment's job at the network layer.
import { createHmac, randomBytes, timingSafeEqual } from "node:crypto";
import { z } from "zod";

const DOMAIN = "ctxbank/cap/v1\0";
export const MIN_SECRET_LENGTH = 32;

const CapabilitySchema = z.discriminatedUnion("route", [
  /**
   * POST /v1/prefill on a prefill's internal listener, for a decode acting for `tenant`; once
   * (`nonce`: a fresh random id per call; the prefill refuses one it has seen, see Nonces).
   */
  z.object({ route: z.literal("prefill"), tenant: z.string(), exp: z.number(), nonce: z.string().min(16).max(64) }),
  /** GET /v1/chunks/{shard}/{epoch}?offset&length: exactly this chunk's range, for the request that leased it. */
  z.object({
    route: z.literal("chunk"),
    tenant: z.string(),
    exp: z.number(),
    chunk: z.string(),
    shard: z.string(),
    epoch: z.number(),
    offset: z.number(),
    length: z.number(),
    request: z.string(),
  }),
]);
export type Capability = z.infer<typeof CapabilitySchema>;

export class InternalAuth {
  private readonly key: Buffer;

  constructor(secret: string) {
    if (secret.length < MIN_SECRET_LENGTH) throw new Error(`the internal secret must be at least ${MIN_SECRET_LENGTH} characters`);
    this.key = Buffer.from(secret, "utf8");
  }

  /** A fresh random id for a single-use capability. */
  static nonce(): string {
    return randomBytes(16).toString("base64url");
  }

  /** A fresh random secret, for a `serve` process that talks only to itself. */
  static randomSecret(): string {
    return randomBytes(32).toString("base64url");
  }

  sign(cap: Capability): string {
    const payload = Buffer.from(JSON.stringify(cap), "utf8");
    return `${payload.toString("base64url")}.${this.mac(payload).toString("base64url")}`;
  }

  /** The capability a token carries when its signature holds and it has not expired; else undefined. */
  verify(token: string, nowMs: number = Date.now()): Capability | undefined {
    const dot = token.indexOf(".");
    if (dot <= 0 || token.length > 4096) return undefined;
    const payload = Buffer.from(token.slice(0, dot), "base64url");
    const mac = Buffer.from(token.slice(dot + 1), "base64url");
    const expected = this.mac(payload);
    if (mac.length !== expected.length || !timingSafeEqual(mac, expected)) return undefined;
    let parsed;
    try {
      parsed = CapabilitySchema.safeParse(JSON.parse(payload.toString("utf8")));
    } catch {
      return undefined;
    }
    if (!parsed.success || parsed.data.exp <= nowMs) return undefined;
    return parsed.data;
  }

  /** Whether `presented` is the secret itself (operators' access to internal status), in constant time. */
  isSecret(presented: string): boolean {
    const a = this.mac(Buffer.from(presented, "utf8"));
    const b = this.mac(this.key);
    return timingSafeEqual(a, b);
  }

  private mac(payload: Buffer): Buffer {
    return createHmac("sha256", this.key).update(DOMAIN).update(payload).digest();
  }
}

/**
 * The nonces of single-use capabilities seen until they expire: a token replayed (sniffed off the
 * internal network, say) before its expiry is refused. Expired entries are dropped as new ones come,
 * so the set holds at most one capability lifetime's worth of calls.
 */
export class Nonces {
  private readonly seen = new Map<string, number>(); // nonce -> exp (ms), in insertion order

  /** True the first time `nonce` is presented (before `exp`); false for a replay. */
  use(nonce: string, exp: number, nowMs: number = Date.now()): boolean {
    for (const [n, e] of this.seen) {
      if (e > nowMs) break; // (exp grows with insertion nearly always; a late one is dropped on a later pass)
      this.seen.delete(n);
    }
    if (this.seen.has(nonce)) return false;
    this.seen.set(nonce, exp);
    return true;
  }

  get size(): number {
    return this.seen.size;
  }
}
