import { existsSync, statSync, writeFileSync } from "node:fs";
import { mkdtemp, readdir, rm } from "node:fs/promises";
import os from "node:os";
import path from "node:path";
import { afterEach, beforeEach, describe, expect, it, vi } from "vitest";
import { RangeAllocator, type ByteRange } from "../../services/handoff/shard/range-allocator.ts";
import { Shard, parseShardFileName, shardFileName } from "../../services/handoff/shard/shard.ts";
import { defaultShardDir } from "../../shared/platform/shard-root.ts";

/** Small deterministic PRNG so a failing sequence can be replayed from its seed. */
function prng(seed: number) {
  return () => {
    seed = (seed + 0x6d2b79f5) | 0;
    let t = Math.imul(seed ^ (seed >>> 15), 1 | seed);
    t = (t + Math.imul(t ^ (t >>> 7), 61 | t)) ^ t;
    return ((t ^ (t >>> 14)) >>> 0) / 2 ** 32;
  };
}

const ALIGN = 4096;
const up = (n: number) => Math.ceil(n / ALIGN) * ALIGN;

/** Checks the allocator against the reference set of live ranges. */
function checkInvariants(a: RangeAllocator, live: Map<number, number>, seed: number) {
  const holes = a.freeRanges;
  const all: (ByteRange & { free: boolean })[] = [
    ...holes.map((h) => ({ ...h, free: true })),
    ...[...live].map(([offset, length]) => ({ offset, length, free: false })),
  ].sort((x, y) => x.offset - y.offset);
  // Holes and allocations tile [0, size) exactly: no overlap, no gap.
  let cursor = 0;
  for (const r of all) {
    expect(r.offset, `seed ${seed}: overlap or gap at ${cursor}`).toBe(cursor);
    expect(r.offset % ALIGN).toBe(0);
    cursor += r.length;
  }
  expect(cursor).toBe(a.size);
  // Holes are coalesced: no two are adjacent.
  for (let i = 1; i < holes.length; i++) expect(holes[i - 1]!.offset + holes[i - 1]!.length).toBeLessThan(holes[i]!.offset);
  const used = [...live.values()].reduce((s, n) => s + n, 0);
  expect(a.bytesUsed).toBe(used);
  expect(a.bytesFree).toBe(a.size - used);
  expect(a.largestFree).toBe(Math.max(0, ...holes.map((h) => h.length)));
}

describe("RangeAllocator", () => {
  it.each([1, 2, 3, 4, 5, 6, 7, 8])("random alloc/free sequence (seed %i) matches the reference model", (seed) => {
    const rand = prng(seed);
    const a = new RangeAllocator(256 * ALIGN, ALIGN);
    const live = new Map<number, number>();
    for (let step = 0; step < 2000; step++) {
      if (live.size > 0 && rand() < 0.45) {
        const offsets = [...live.keys()];
        const offset = offsets[Math.floor(rand() * offsets.length)]!;
        expect(a.free(offset)).toBe(live.get(offset));
        live.delete(offset);
      } else {
        const want = 1 + Math.floor(rand() * 24 * ALIGN);
        const need = up(want);
        const before = a.freeRanges;
        const offset = a.alloc(want);
        const fitting = before.filter((h) => h.length >= need);
        if (offset === null) {
          expect(fitting, `seed ${seed}: refused ${need} bytes with a hole that fits`).toEqual([]);
        } else {
          // Best fit: the chosen hole is a smallest one that fits.
          const smallest = Math.min(...fitting.map((h) => h.length));
          const hole = before.find((h) => h.offset === offset);
          expect(hole?.length).toBe(smallest);
          live.set(offset, need);
        }
      }
      checkInvariants(a, live, seed);
    }
    for (const offset of [...live.keys()]) a.free(offset);
    expect(a.freeRanges).toEqual([{ offset: 0, length: a.size }]); // no fragmentation leak
    expect(a.bytesUsed).toBe(0);
  });

  it("returns null when full and reuses freed space", () => {
    const a = new RangeAllocator(5 * ALIGN, ALIGN);
    const offsets = [a.alloc(1), a.alloc(ALIGN), a.alloc(ALIGN + 1)]; // 1 + 1 + 2 pages
    expect(offsets).toEqual([0, ALIGN, 2 * ALIGN]);
    expect(a.alloc(ALIGN + 1)).toBeNull();
    expect(a.alloc(1)).toBe(4 * ALIGN);
    expect(a.alloc(1)).toBeNull();
    expect(a.largestFree).toBe(0);
    a.free(ALIGN);
    expect(a.alloc(ALIGN + 1)).toBeNull(); // one free page is not two
    expect(a.alloc(ALIGN)).toBe(ALIGN);
  });

  it("refuses double frees, bad frees and bad sizes", () => {
    const a = new RangeAllocator(8 * ALIGN, ALIGN);
    const off = a.alloc(2 * ALIGN)!;
    expect(() => a.free(off + ALIGN)).toThrow(/no allocation starts/);
    a.free(off);
    expect(() => a.free(off)).toThrow(/double free/);
    expect(() => a.alloc(0)).toThrow(RangeError);
    expect(() => a.alloc(1.5)).toThrow(RangeError);
    expect(() => new RangeAllocator(1000, ALIGN)).toThrow(/multiple/);
    expect(() => new RangeAllocator(8192, 3000)).toThrow(/power of two/);
  });

  it("knows which ranges lie inside an allocation", () => {
    const a = new RangeAllocator(8 * ALIGN, ALIGN);
    const off = a.alloc(2 * ALIGN)!;
    expect(a.contains(off, 2 * ALIGN)).toBe(true);
    expect(a.contains(off + 10, 100)).toBe(true);
    expect(a.contains(off + ALIGN, ALIGN + 1)).toBe(false);
    expect(a.contains(2 * ALIGN, 1)).toBe(false);
  });
});

describe("Shard", () => {
  let dir: string;
  const shards: Shard[] = [];
  beforeEach(async () => {
    dir = await mkdtemp(path.join(existsSync("/dev/shm") ? "/dev/shm" : os.tmpdir(), "ctxbank-test-"));
  });
  afterEach(async () => {
    await Promise.all(shards.splice(0).map((s) => s.close()));
    await rm(dir, { recursive: true, force: true });
  });
  const create = async (epoch: number, shardId = "prefill-a", sizeBytes = 1 << 20) => {
    const shard = await Shard.create({ dir, shardId, epoch, sizeBytes });
    shards.push(shard);
    return shard;
  };

  it("is a private file of fixed size named by shard id and epoch", async () => {
    const shard = await create(3, "prefill-a", 1_000_000);
    expect(shard.path).toBe(path.join(dir, "prefill-a.e3.shard"));
    expect(shard.sizeBytes).toBe(up(1_000_000));
    const st = statSync(shard.path);
    expect(st.size).toBe(shard.sizeBytes);
    expect(st.mode & 0o777).toBe(0o600);
    expect(parseShardFileName("prefill-a.e3.shard")).toEqual({ shardId: "prefill-a", epoch: 3 });
    expect(parseShardFileName("prefill-a.e0.shard")).toBeNull();
    expect(() => shardFileName("../x", 1)).toThrow(/invalid shard id/);
  });

  it("writes and reads back inside allocated ranges only", async () => {
    const shard = await create(1);
    const off = shard.alloc(10_000)!;
    const data = new Uint8Array(10_000).map((_, i) => i % 251);
    await shard.write(off, data);
    const back = new Uint8Array(10_000);
    await shard.read(off, back);
    expect(back).toEqual(data);
    expect(shard.bytesUsed).toBe(up(10_000));
    await expect(shard.write(off + up(10_000), data)).rejects.toThrow(/outside any allocated range/);
    await expect(shard.write(off + 4096, new Uint8Array(8193))).rejects.toThrow(/outside/); // 1 byte past the range
    await expect(shard.read(shard.sizeBytes - 10, new Uint8Array(11))).rejects.toThrow(/outside the shard/);
    shard.free(off);
    expect(shard.bytesFree).toBe(shard.sizeBytes);
    expect(shard.largestFree).toBe(shard.sizeBytes);
  });

  it("views bytes in place: later writes show, freed ranges read zeros, a view outlives close", async () => {
    const shard = await create(1);
    const off = shard.alloc(8192)!;
    const view = shard.view(off, 8192);
    expect(view.every((b) => b === 0)).toBe(true);
    const data = new Uint8Array(8192).map((_, i) => (i * 7) % 253);
    await shard.write(off, data);
    expect(Buffer.compare(view, data)).toBe(0); // the file's pages, not a copy
    expect(shard.view(off + 100, 10)).toEqual(data.subarray(100, 110));
    for (const [o, n] of [
      [-1, 1],
      [shard.sizeBytes - 10, 11],
      [0.5, 1],
      [0, Number.NaN],
    ])
      expect(() => shard.view(o!, n!)).toThrow(RangeError);
    shard.free(off); // punched: the same view now reads zeros
    expect(view.every((b) => b === 0)).toBe(true);
    await shard.close();
    expect(() => shard.view(off, 10)).toThrow(/closed/);
    expect(view.byteLength).toBe(8192); // still mapped while referenced
    expect(view[0]).toBe(0);
  });

  it("a restart makes a new file for the new epoch and removes this shard's stale files only", async () => {
    const old = await create(1);
    const off = old.alloc(100)!;
    await old.write(off, new Uint8Array(100).fill(7));
    await old.close(); // the process dies without cleaning up
    await create(2, "prefill-b");
    writeFileSync(path.join(dir, "notes.txt"), "not a shard");

    const restarted = await create(5);
    expect(restarted.path).not.toBe(old.path);
    expect((await readdir(dir)).filter((n) => !n.endsWith(".owner")).sort()).toEqual([
      "notes.txt",
      "prefill-a.e5.shard",
      "prefill-b.e2.shard",
    ]);
    expect((await readdir(dir)).filter((n) => n.endsWith(".owner")).sort()).toEqual([
      "prefill-a.e5.shard.owner",
      "prefill-b.e2.shard.owner",
    ]);
    const fresh = new Uint8Array(100);
    await restarted.read(off, fresh);
    expect(fresh.every((b) => b === 0)).toBe(true);
  });

  it("replaces a leftover file of the same epoch", async () => {
    writeFileSync(path.join(dir, "prefill-a.e1.shard"), "left over");
    const shard = await create(1);
    expect(statSync(shard.path).size).toBe(1 << 20);
  });

  it("refuses sizes the directory cannot hold and closed use", async () => {
    await expect(Shard.create({ dir, shardId: "big", epoch: 1, sizeBytes: 2 ** 52 })).rejects.toThrow(/does not fit/);
    await expect(Shard.create({ dir, shardId: "z", epoch: 1, sizeBytes: 0 })).rejects.toThrow(/positive/);
    const shard = await create(1);
    await shard.destroy();
    expect(existsSync(shard.path)).toBe(false);
    await expect(shard.read(0, new Uint8Array(1))).rejects.toThrow(/closed/);
  });

  it("falls back to the temp dir, with a warning, when /dev/shm is missing", () => {
    const warn = vi.spyOn(process, "emitWarning").mockImplementation(() => {});
    try {
      expect(defaultShardDir("/nonexistent-shm")).toBe(path.join(os.tmpdir(), "ctxbank-shards"));
      expect(warn).toHaveBeenCalledWith(expect.stringMatching(/not available/), expect.objectContaining({ code: "CTXBANK_NO_SHM" }));
      warn.mockClear();
      expect(defaultShardDir(os.tmpdir())).toBe(path.join(os.tmpdir(), "ctxbank"));
      expect(warn).not.toHaveBeenCalled();
    } finally {
      warn.mockRestore();
    }
  });
});
