import { describe, expect, it } from "vitest";
import { ScratchPool } from "../../services/handoff/scratch-pool.ts";

describe("ScratchPool (HTTP staging buffers reused across loads)", () => {
  it("hands back the buffers it was given, keeping at most `keep`", () => {
    const pool = new ScratchPool(2);
    const a = pool.take();
    const b = pool.take();
    const c = pool.take();
    expect(a.buf.byteLength).toBe(0); // nothing kept yet: the reader grows it to the chunk
    [a, b, c].forEach((s, i) => (s.buf = Buffer.alloc(16 + i)));
    const given = [a.buf, b.buf, c.buf];
    pool.put(a);
    pool.put(b);
    pool.put(c); // over `keep`: dropped
    expect(a.buf.byteLength).toBe(0); // the holder no longer points at a kept buffer
    const again = [pool.take().buf, pool.take().buf, pool.take().buf];
    expect(again[0]).toBe(given[1]);
    expect(again[1]).toBe(given[0]);
    expect(again[2]!.byteLength).toBe(0);
  });

  it("does not keep empty buffers (a worker whose chunks were all mapped in place)", () => {
    const pool = new ScratchPool(4);
    pool.put(pool.take());
    expect(pool.take().buf.byteLength).toBe(0);
  });
});
