// The per-key shard shares (services/handoff/shard/shard-quota.ts) over a real shard: a key over its cap
// is refused with 429 shard_full and Retry-After while another key fits; a range freed by the
// reaper stops counting without being reported; a range reserved again counts for its new
// holder; the exempt (keyless) tenant is not capped.
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { ApiError } from "../../shared/platform/http/errors.ts";
import { Shard } from "../../services/handoff/shard/shard.ts";
import { ShardQuota } from "../../services/handoff/shard/shard-quota.ts";
import { tempShardDir } from "../../tools/lib/services.ts";

const PAGE = 4096;

describe("ShardQuota", () => {
  let dir: Awaited<ReturnType<typeof tempShardDir>>;
  let shard: Shard;

  beforeAll(async () => {
    dir = await tempShardDir();
    shard = await Shard.create({ shardId: "quota-test", epoch: 1, sizeBytes: 64 * PAGE, dir: dir.dir, alignment: PAGE });
  });
  afterAll(async () => {
    await shard?.destroy();
    await dir?.remove();
  });

  const reserve = (quota: ShardQuota, tenant: string, pages: number) => {
    quota.check(tenant, pages * PAGE, shard);
    const offset = shard.alloc(pages * PAGE)!;
    quota.charge(tenant, shard, [{ offset, length: pages * PAGE }]);
    return offset;
  };

  it("caps each key, frees follow the allocator, and the exempt tenant is not capped", () => {
    const quota = new ShardQuota(16 * PAGE, new Set(["local"]), 30_000);
    const a1 = reserve(quota, "a", 10);
    expect(() => reserve(quota, "a", 10)).toThrow(ApiError);
    try {
      quota.check("a", 10 * PAGE, shard);
    } catch (e) {
      expect((e as ApiError).status).toBe(429);
      expect((e as ApiError).code).toBe("shard_full");
      // When a's oldest range is reclaimable: one retention (30 s) after it was reserved.
      expect(Number((e as ApiError).headers["retry-after"])).toBeGreaterThanOrEqual(29);
      expect(Number((e as ApiError).headers["retry-after"])).toBeLessThanOrEqual(30);
    }
    reserve(quota, "b", 10); // another key still fits
    reserve(quota, "local", 20); // keyless: no cap, no share
    expect(quota.used("a", shard)).toBe(10 * PAGE);
    shard.free(a1); // the reaper freed a's range
    expect(quota.used("a", shard)).toBe(0);
    const again = reserve(quota, "b", 6); // b may take the same offset; it counts for b now
    expect(again).toBe(a1);
    expect(quota.used("b", shard)).toBe(16 * PAGE);
    expect(quota.used("a", shard)).toBe(0);
    expect(() => reserve(quota, "b", 1)).toThrow(/max-shard-bytes-per-key/);
  });

  it("two keys cannot fill the shard: a third key holding nothing finds room", async () => {
    const s = await Shard.create({ shardId: "quota-share", epoch: 1, sizeBytes: 60 * PAGE, dir: dir.dir, alignment: PAGE });
    try {
      const quota = new ShardQuota(60 * PAGE, new Set(), 30_000);
      const take = (tenant: string, pages: number) => {
        quota.check(tenant, pages * PAGE, s);
        quota.charge(tenant, s, [{ offset: s.alloc(pages * PAGE)!, length: pages * PAGE }]);
      };
      // Alone, a may take half; then it must leave a third free once b holds some.
      take("a", 30);
      expect(() => take("a", 1)).toThrow(/kept free for another key/);
      take("b", 10); // 20 free: a third of the shard kept for a newcomer
      expect(() => take("b", 1)).toThrow(/kept free for another key/);
      expect(() => take("a", 1)).toThrow(/kept free/);
      // A third key holding nothing fits (it leaves a quarter free, for a fourth).
      take("c", 5);
      expect(s.bytesFree).toBe(15 * PAGE);
    } finally {
      await s.destroy();
    }
  });
});
