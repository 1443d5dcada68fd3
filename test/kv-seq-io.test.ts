// KV export/import between a sequence's cache layout and chunks: the fast transpose must give
// exactly what chunk-pack.ts's reference pack/unpack gives, for aligned and unaligned buffers.
import { describe, expect, it } from "vitest";
import { chunkByteLength, verifyChunk, type ChunkMeta } from "../shared/kv/chunk.ts";
import { encodeChunkFromLayers, unpackKv } from "../shared/kv/chunk-pack.ts";
import { coverageProblem, exportChunk, importChunk, layerViews, tokenBlocks } from "../shared/kv/seq-io.ts";

const shape = { nLayer: 4, hkv: 3, headDim: 64 };
const cap = 40;
const kvDim = 192;
const FP = "cd".repeat(32);

function cacheWith(fill: (i: number) => number) {
  const buffer = new ArrayBuffer(shape.nLayer * 2 * cap * kvDim * 2);
  new Uint16Array(buffer).forEach((_, i, a) => (a[i] = fill(i)));
  return { buffer, capacity: cap };
}

describe("seq-io", () => {
  const meta: ChunkMeta = { fingerprint: FP, dtype: "f16", layerIds: [1, 3], hkv: 3, headDim: 64, tokenStart: 7, tokenCount: 20 };

  it("export equals the reference encoder over zero-copy layer views", () => {
    const cache = cacheWith((i) => (i * 2654435761) & 0xffff);
    const ours = new Uint8Array(chunkByteLength(meta));
    const ref = new Uint8Array(chunkByteLength(meta));
    expect(exportChunk(ours, meta, cache, shape)).toBe(ours.byteLength);
    encodeChunkFromLayers(ref, meta, layerViews(cache, shape, meta.layerIds, meta.tokenStart, meta.tokenCount));
    expect(Buffer.compare(ours, ref)).toBe(0);
    expect(verifyChunk(ours, { fingerprint: FP }).header.tokenStart).toBe(7);
  });

  it.each([0, 2])("import writes exactly the rows the chunk covers (payload offset %i mod 8)", (shift) => {
    const src = cacheWith((i) => (i * 40503) & 0xffff);
    const bytes = new Uint8Array(chunkByteLength(meta) + shift).subarray(shift);
    exportChunk(bytes, meta, src, shape);
    const { header, payload } = verifyChunk(bytes);
    const dst = cacheWith(() => 0xaaaa);
    importChunk(payload, header, dst, shape);
    const expected = cacheWith(() => 0xaaaa);
    unpackKv(payload, header, layerViews(expected, shape, header.layerIds, header.tokenStart, header.tokenCount));
    expect(Buffer.compare(new Uint8Array(dst.buffer), new Uint8Array(expected.buffer))).toBe(0);
    // Rows outside the chunk are untouched; rows inside equal the source.
    const view = (c: { buffer: ArrayBuffer }) => layerViews({ buffer: c.buffer, capacity: cap }, shape, [1], 7, 20)[0]!.k;
    expect(view(dst)).toEqual(view(src));
    expect(new Uint16Array(dst.buffer)[0]).toBe(0xaaaa);
  });

  it("refuses chunks that do not fit the model or the sequence", () => {
    const bytes = new Uint8Array(chunkByteLength(meta));
    const cache = cacheWith(() => 0);
    expect(() => exportChunk(bytes, { ...meta, tokenStart: 30 }, cache, shape)).toThrow(/exceed the sequence capacity/);
    expect(() => exportChunk(bytes, { ...meta, layerIds: [5] }, cache, shape)).toThrow(/layer 5/);
    expect(() => importChunk(new Uint8Array(10), meta, cache, shape)).toThrow(/payload has 10 bytes/);
    expect(() => importChunk(bytes, { ...meta, hkv: 2 }, cache, shape)).toThrow(/Hkv=2/);
  });

  it("plans blocks and checks coverage", () => {
    expect(tokenBlocks(5, 2)).toEqual([
      { tokenStart: 0, tokenEnd: 2 },
      { tokenStart: 2, tokenEnd: 4 },
      { tokenStart: 4, tokenEnd: 5 },
    ]);
    const all = [0, 1, 2, 3];
    expect(coverageProblem([{ layerIds: all, tokenStart: 0, tokenEnd: 3 }, { layerIds: all, tokenStart: 3, tokenEnd: 5 }], 4, 5)).toBeNull();
    expect(coverageProblem([{ layerIds: all, tokenStart: 0, tokenEnd: 3 }], 4, 5)).toMatch(/cover 3 of 5/);
    expect(coverageProblem([{ layerIds: all, tokenStart: 0, tokenEnd: 3 }, { layerIds: all, tokenStart: 2, tokenEnd: 5 }], 4, 5)).toMatch(/overlap/);
    expect(coverageProblem([{ layerIds: [0, 1], tokenStart: 0, tokenEnd: 5 }], 4, 5)).toMatch(/layer 2/);
  });
});
