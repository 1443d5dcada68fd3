// Shares of the KV shard per key, so one client's unclaimed handles cannot fill it and a key that
// holds nothing always finds room. Every reservation must leave free at least the share of one
// more key: shard size / (keys holding ranges after it + 1). So a key alone may take half the
// shard, two keys leave a third free for a newcomer, three a quarter, and so on; and no key holds
// more than `capBytes`. Ownership is charged when ranges are reserved and reconciled lazily
// against the shard's allocator (a range the reaper or a failure freed is no longer held; one
// reserved again is charged to its new holder), so no free path has to report back.
import { ApiError, retryAfter } from "../../../shared/platform/http/errors.ts";
import type { Shard } from "./shard.ts";

interface Held {
  tenant: string;
  shard: Shard;
  length: number;
  /** Date.now() when it was reserved: it is reclaimable at the latest one retention later. */
  at: number;
}

export class ShardQuota {
  private readonly held = new Map<number, Held>();

  constructor(
    /** Bytes one tenant may hold at most. */
    readonly capBytes: number,
    /** Tenants no share applies to (the keyless "local" one under the default cap). */
    private readonly exempt: ReadonlySet<string>,
    /** How long an unclaimed range is kept (ms): when a refused tenant can expect room again. */
    private readonly retainMs: number,
  ) {}

  /** Bytes each tenant holds on `shard` now (freed ranges forgotten on the way). */
  private holdings(shard: Shard): Map<string, number> {
    const by = new Map<string, number>();
    for (const [offset, h] of this.held) {
      if (h.shard !== shard || shard.allocatedAt(offset) !== h.length) {
        this.held.delete(offset);
        continue;
      }
      by.set(h.tenant, (by.get(h.tenant) ?? 0) + h.length);
    }
    return by;
  }

  /** Bytes `tenant` holds on `shard` now. */
  used(tenant: string, shard: Shard): number {
    return this.holdings(shard).get(tenant) ?? 0;
  }

  /** 429 shard_full when `need` more bytes would take `tenant` over its cap, or leave no room for a key holding nothing. */
  check(tenant: string, need: number, shard: Shard): void {
    if (this.exempt.has(tenant)) return;
    const holdings = this.holdings(shard);
    const used = holdings.get(tenant) ?? 0;
    const holders = holdings.size + (holdings.has(tenant) ? 0 : 1); // after this reservation
    const keep = Math.floor(shard.sizeBytes / (holders + 1)); // a newcomer's share, kept free
    if (used + need > this.capBytes) {
      throw this.full(
        `this key holds ${used} bytes of the KV shard and this prompt needs ${need}; a key may hold ${this.capBytes} (--max-shard-bytes-per-key). Decode or let expire earlier handles, then retry`,
        tenant,
      );
    }
    if (shard.bytesFree - need < keep) {
      throw this.full(
        `the KV shard has ${shard.bytesFree} bytes free and this prompt needs ${need}; with ${holders} keys holding handles, ${keep} bytes are kept free for another key. Decode or let expire earlier handles, then retry`,
        tenant,
      );
    }
  }

  charge(tenant: string, shard: Shard, ranges: readonly { offset: number; length: number }[]): void {
    const at = Date.now();
    for (const r of ranges) this.held.set(r.offset, { tenant, shard, length: r.length, at });
  }

  /** 429 shard_full whose Retry-After is when the tenant's oldest range (else anyone's) is reclaimable. */
  full(message: string, tenant: string): ApiError {
    let oldest = Infinity,
      oldestOwn = Infinity;
    for (const h of this.held.values()) {
      oldest = Math.min(oldest, h.at);
      if (h.tenant === tenant) oldestOwn = Math.min(oldestOwn, h.at);
    }
    const from = Number.isFinite(oldestOwn) ? oldestOwn : oldest;
    const seconds = Number.isFinite(from) ? Math.ceil((from + this.retainMs - Date.now()) / 1000) : 1;
    return retryAfter(Math.min(60, Math.max(1, seconds)), new ApiError(429, "shard_full", message));
  }
}
