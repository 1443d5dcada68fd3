// Per-key cap on shard bytes: which key holds each reserved range, so one client's unclaimed
// handles cannot fill the shard. Ownership is charged when ranges are reserved and reconciled
// lazily against the shard's allocator (a range the reaper or a failure freed is no longer held;
// one reserved again is charged to its new holder), so no free path has to report back.
import { ApiError, retryAfter } from "../../../shared/platform/http/errors.ts";
import type { Shard } from "./shard.ts";

interface Held {
  tenant: string;
  shard: Shard;
  length: number;
}

export class ShardQuota {
  private readonly held = new Map<number, Held>();

  constructor(
    /** Bytes one tenant may hold. */
    readonly capBytes: number,
    /** Tenants the cap does not apply to (the keyless "local" one under the default cap). */
    private readonly exempt: ReadonlySet<string>,
    /** Seconds a refused tenant is told to wait (its unclaimed ranges expire within the retention). */
    private readonly retryAfterS: number,
  ) {}

  /** Bytes `tenant` holds on `shard` now. */
  used(tenant: string, shard: Shard): number {
    let bytes = 0;
    for (const [offset, h] of this.held) {
      if (h.shard !== shard || shard.allocatedAt(offset) !== h.length) {
        this.held.delete(offset);
        continue;
      }
      if (h.tenant === tenant) bytes += h.length;
    }
    return bytes;
  }

  /** 429 shard_full when `need` more bytes would take `tenant` over its cap. */
  check(tenant: string, need: number, shard: Shard): void {
    if (this.exempt.has(tenant)) return;
    const used = this.used(tenant, shard);
    if (used + need <= this.capBytes) return;
    throw retryAfter(
      this.retryAfterS,
      new ApiError(
        429,
        "shard_full",
        `this key holds ${used} bytes of the KV shard and this prompt needs ${need}; a key may hold ${this.capBytes} (--max-shard-bytes-per-key). Decode or let expire earlier handles, then retry`,
      ),
    );
  }

  charge(tenant: string, shard: Shard, ranges: readonly { offset: number; length: number }[]): void {
    for (const r of ranges) this.held.set(r.offset, { tenant, shard, length: r.length });
  }
}
