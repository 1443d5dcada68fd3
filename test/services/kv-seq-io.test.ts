// KV export/import between a sequence's cache and chunks: the native transpose (seq.exportRows /
// importRows) must give exactly what chunk-pack.ts's reference pack/unpack gives over zero-copy
// views of the cache, for aligned and unaligned payloads; the checksummed import of a whole chunk
// (seq.importChunk) writes what verifyChunk + importRows write and catches a corrupt byte; and it
// refuses what does not fit.
import { beforeAll, describe, expect, it } from "vitest";
import { Engine, loadModel } from "../../shared/inference/engine/engine.ts";
import type { NativeSequence } from "../../shared/inference/engine/native.ts";
import { ChunkError, chunkByteLength, verifyChunk, type ChunkMeta } from "../../services/handoff/format/chunk.ts";
import { encodeChunkFromLayers, unpackKv } from "../../services/handoff/format/chunk-pack.ts";
import {
  coverageProblem,
  exportChunk,
  importChunk,
  importVerifiedChunk,
  kvShape,
  layerViews,
  tokenBlocks,
  type KvShape,
} from "../../services/handoff/format/seq-io.ts";
import { resolveModel } from "../../shared/inference/model/resolve.ts";

const cap = 40;
const FP = "cd".repeat(32);
let engine: Engine;
let shape: KvShape;

beforeAll(async () => {
  const model = await loadModel(await resolveModel());
  engine = new Engine(model, { threads: 1 });
  shape = kvShape(model.config);
});

function seqWith(fill: (i: number) => number): NativeSequence {
  const seq = engine.createSequence(cap);
  new Uint16Array(seq.kvBuffer()).forEach((_, i, a) => (a[i] = fill(i)));
  return seq;
}
const cacheOf = (seq: NativeSequence) => ({ buffer: seq.kvBuffer(), capacity: seq.capacity });

describe("seq-io", () => {
  const meta = (): ChunkMeta => ({
    fingerprint: FP,
    dtype: "f16",
    layerIds: [1, 3, 29],
    hkv: shape.hkv,
    headDim: shape.headDim,
    tokenStart: 7,
    tokenCount: 20,
  });

  it("export equals the reference encoder over zero-copy layer views", () => {
    const seq = seqWith((i) => (i * 2654435761) & 0xffff);
    const m = meta();
    const ours = new Uint8Array(chunkByteLength(m));
    const ref = new Uint8Array(chunkByteLength(m));
    expect(exportChunk(ours, m, seq, shape)).toBe(ours.byteLength);
    encodeChunkFromLayers(ref, m, layerViews(cacheOf(seq), shape, m.layerIds, m.tokenStart, m.tokenCount));
    expect(Buffer.compare(ours, ref)).toBe(0);
    expect(verifyChunk(ours, { fingerprint: FP }).header.tokenStart).toBe(7);
    seq.release();
  });

  it.each([0, 2, 5])("import writes exactly the rows the chunk covers (payload offset %i)", (shift) => {
    const src = seqWith((i) => (i * 40503) & 0xffff);
    const m = meta();
    const bytes = new Uint8Array(chunkByteLength(m) + shift).subarray(shift);
    exportChunk(bytes, m, src, shape);
    const { header, payload } = verifyChunk(bytes);
    const dst = seqWith(() => 0xaaaa);
    importChunk(payload, header, dst, shape);
    const expected = seqWith(() => 0xaaaa);
    unpackKv(payload, header, layerViews(cacheOf(expected), shape, header.layerIds, header.tokenStart, header.tokenCount));
    expect(Buffer.compare(new Uint8Array(dst.kvBuffer()), new Uint8Array(expected.kvBuffer()))).toBe(0);
    // Rows outside the chunk are untouched; rows inside equal the source.
    const view = (s: NativeSequence) => layerViews(cacheOf(s), shape, [3], 7, 20)[0]!.v;
    expect(view(dst)).toEqual(view(src));
    expect(new Uint16Array(dst.kvBuffer())[0]).toBe(0xaaaa);
    for (const s of [src, dst, expected]) s.release();
  });

  it.each([0, 3])("a verified import of the whole chunk writes what verifyChunk + importChunk write (offset %i)", (shift) => {
    const src = seqWith((i) => (i * 48271) & 0xffff);
    const m = meta();
    const bytes = new Uint8Array(chunkByteLength(m) + shift).subarray(shift);
    exportChunk(bytes, m, src, shape);
    const fused = seqWith(() => 0x5555);
    const header = importVerifiedChunk(bytes, { fingerprint: FP, tokenStart: 7, layerIds: m.layerIds }, fused, shape);
    expect(header.tokenCount).toBe(20);
    const separate = seqWith(() => 0x5555);
    const verified = verifyChunk(bytes, { fingerprint: FP });
    importChunk(verified.payload, verified.header, separate, shape);
    expect(Buffer.compare(new Uint8Array(fused.kvBuffer()), new Uint8Array(separate.kvBuffer()))).toBe(0);
    expect(fused.nPast).toBe(0); // the caller declares the length
    for (const s of [src, fused, separate]) s.release();
  });

  it("a verified import refuses a corrupt byte, a short chunk, and a chunk not the one expected", () => {
    const src = seqWith((i) => (i * 69621) & 0xffff);
    const m = meta();
    const good = new Uint8Array(chunkByteLength(m));
    exportChunk(good, m, src, shape);
    const dst = seqWith(() => 0);
    const codeOf = (bytes: Uint8Array, expect = {}, into = dst) => {
      try {
        importVerifiedChunk(bytes, expect, into, shape);
      } catch (e) {
        if (e instanceof ChunkError) return e.code;
        throw e;
      }
      return "ok";
    };
    // The checksum field, the header's zero padding, the payload.
    for (const at of [9, 100, good.byteLength - 1]) {
      const bad = good.slice();
      bad[at]! ^= 0x40;
      expect(codeOf(bad)).toBe(at === 100 ? "bad_header" : "checksum_mismatch");
    }
    const flipped = good.slice();
    flipped[good.byteLength >> 1]! ^= 1;
    expect(() => importVerifiedChunk(flipped, {}, dst, shape)).toThrow(/chunk checksum 0x[0-9a-f]{8} does not match stored/);
    expect(codeOf(good.subarray(0, 0))).toBe("truncated");
    expect(codeOf(good.subarray(0, good.byteLength - 1))).toBe("truncated");
    // Not the chunk the registry row describes: refused before a row is written.
    const [untouched, clean] = [seqWith(() => 0), seqWith(() => 0)];
    expect(codeOf(good, { tokenStart: 8 }, untouched)).toBe("metadata_mismatch");
    expect(codeOf(good, { fingerprint: "ab".repeat(32) }, untouched)).toBe("fingerprint_mismatch");
    expect(Buffer.compare(new Uint8Array(untouched.kvBuffer()), new Uint8Array(clean.kvBuffer()))).toBe(0);
    expect(codeOf(good)).toBe("ok");
    expect(() => dst.importChunk(good, 12, m.layerIds, 7, 20)).toThrow(/payload has \d+ bytes, the rows need/);
    expect(() => dst.importChunk(good.subarray(0, 8), 64, m.layerIds, 7, 20)).toThrow(/cannot hold a header of 64/);
    for (const s of [src, dst, untouched, clean]) s.release();
  });

  it("refuses chunks that do not fit the model or the sequence", () => {
    const m = meta();
    const bytes = new Uint8Array(chunkByteLength(m));
    const seq = seqWith(() => 0);
    expect(() => exportChunk(bytes, { ...m, tokenStart: 30 }, seq, shape)).toThrow(/exceed the sequence capacity 40/);
    expect(() => exportChunk(bytes, { ...m, layerIds: [1, 3, 30] }, seq, shape)).toThrow(/layer 30 is not in the model's 30 layers/);
    expect(() => importChunk(new Uint8Array(10), m, seq, shape)).toThrow(/payload has 10 bytes/);
    expect(() => importChunk(bytes, { ...m, hkv: 2 }, seq, shape)).toThrow(/Hkv=2/);
    // The native checks, reached directly.
    expect(() => seq.importRows(new Uint8Array(10), [0], 0, 1)).toThrow(/payload has 10 bytes, the rows need/);
    expect(() => seq.importRows(new Uint8Array(768), [0, 0], 0, 1)).toThrow(/listed twice/);
    expect(() => seq.exportRows(new Uint16Array(10) as unknown as Uint8Array, [0], 0, 1)).toThrow(TypeError);
    expect(() => seq.importRows(new Uint8Array(768), [0.5], 0, 1)).toThrow(/integers/);
    seq.release();
  });

  it("prefault commits a sequence's rows without changing them or its length, and checks its argument", async () => {
    const seq = seqWith((i) => (i * 40503) & 0xffff);
    const before = new Uint8Array(seq.kvBuffer()).slice();
    seq.setLength(5);
    expect(typeof (await seq.prefault(cap))).toBe("boolean"); // false only on kernels before Linux 5.14
    expect(seq.nPast).toBe(5);
    expect(Buffer.compare(new Uint8Array(seq.kvBuffer()), before)).toBe(0);
    expect(() => seq.prefault(cap + 1)).toThrow(RangeError);
    expect(() => seq.prefault(-1)).toThrow(RangeError);
    expect(() => seq.prefault(1.5)).toThrow(RangeError);
    expect(() => (seq.prefault as (x: unknown) => unknown)("8")).toThrow(TypeError);
    // Released while it runs: it stops, and the sequence reads as empty zeros as after any release.
    const racing = seq.prefault(cap);
    seq.release();
    await racing;
    expect(seq.nPast).toBe(0);
    expect(new Uint16Array(seq.kvBuffer()).every((x) => x === 0)).toBe(true);
  });

  const FOUR = { nLayer: 4, slidingLayers: [], slidingWindow: 0 };
  it("plans blocks and checks coverage", () => {
    expect(tokenBlocks(5, 2)).toEqual([
      { tokenStart: 0, tokenEnd: 2 },
      { tokenStart: 2, tokenEnd: 4 },
      { tokenStart: 4, tokenEnd: 5 },
    ]);
    const all = [0, 1, 2, 3];
    expect(
      coverageProblem(
        [
          { layerIds: all, tokenStart: 0, tokenEnd: 3 },
          { layerIds: all, tokenStart: 3, tokenEnd: 5 },
        ],
        FOUR,
        5,
      ),
    ).toBeNull();
    expect(coverageProblem([{ layerIds: all, tokenStart: 0, tokenEnd: 3 }], FOUR, 5)).toMatch(/cover 3 of 5/);
    expect(
      coverageProblem(
        [
          { layerIds: all, tokenStart: 0, tokenEnd: 3 },
          { layerIds: all, tokenStart: 2, tokenEnd: 5 },
        ],
        FOUR,
        5,
      ),
    ).toMatch(/overlap/);
    expect(coverageProblem([{ layerIds: [0, 1], tokenStart: 0, tokenEnd: 5 }], FOUR, 5)).toMatch(/layer 2/);
    // Sliding-window layers (2 and 3, window 2) need their last window only; rows before it may come or not.
    const sliding = { nLayer: 4, slidingLayers: [2, 3], slidingWindow: 2 };
    const globals = { layerIds: [0, 1], tokenStart: 0, tokenEnd: 5 };
    expect(coverageProblem([globals, { layerIds: [2, 3], tokenStart: 3, tokenEnd: 5 }], sliding, 5)).toBeNull();
    expect(coverageProblem([globals, { layerIds: [2, 3], tokenStart: 0, tokenEnd: 5 }], sliding, 5)).toBeNull();
    expect(coverageProblem([globals, { layerIds: [2, 3], tokenStart: 4, tokenEnd: 5 }], sliding, 5)).toMatch(
      /layer 2: tokens 3..4 are missing/,
    );
    expect(coverageProblem([globals, { layerIds: [2, 3], tokenStart: 3, tokenEnd: 5 }], sliding, 6)).toMatch(
      /layer 0: chunks cover 5 of 6/,
    );
  });
});
