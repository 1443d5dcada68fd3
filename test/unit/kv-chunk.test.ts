import { randomBytes } from "node:crypto";
import { describe, expect, it } from "vitest";
import {
  ChunkError,
  chunkByteLength,
  chunkHeaderSize,
  chunkPayloadLength,
  decodeChunkHeader,
  encodeChunk,
  verifyChunk,
  type ChunkMeta,
} from "../../services/handoff/format/chunk.ts";
import { encodeChunkFromLayers, packKv, unpackKv, type LayerKv } from "../../services/handoff/format/chunk-pack.ts";
import { PrefixHasher, chunkKey } from "../../services/handoff/format/chunk-key.ts";
import { crc32c } from "../../shared/inference/engine/native.ts";

const FP = "0123456789abcdef".repeat(4);
const OTHER_FP = "f".repeat(64);

/** CRC-32C bit by bit, straight from the definition (reflected polynomial 0x82F63B78): the oracle. */
function crc32cReference(bytes: Uint8Array): number {
  let c = 0xffffffff;
  for (const b of bytes) {
    c ^= b;
    for (let k = 0; k < 8; k++) c = c & 1 ? (c >>> 1) ^ 0x82f63b78 : c >>> 1;
  }
  return (c ^ 0xffffffff) >>> 0;
}

describe("chunk checksum", () => {
  it("is CRC-32C: the standard check value, a bitwise reference at odd lengths, and chaining", () => {
    expect(crc32c(new TextEncoder().encode("123456789"))).toBe(0xe3069283);
    const bytes = randomBytes(4099);
    for (const [off, n] of [
      [0, 0],
      [1, 7],
      [3, 64],
      [5, 4093],
    ] as const) {
      expect(crc32c(bytes.subarray(off, off + n))).toBe(crc32cReference(bytes.subarray(off, off + n)));
    }
    expect(crc32c(bytes.subarray(100), crc32c(bytes.subarray(0, 100)))).toBe(crc32c(bytes));
    expect(() => crc32c(bytes, -1)).toThrow(RangeError);
    expect(() => crc32c("x" as unknown as Uint8Array)).toThrow(TypeError);
  });
});

function meta(over: Partial<ChunkMeta> = {}): ChunkMeta {
  return { fingerprint: FP, dtype: "f16", layerIds: [3, 4, 5], hkv: 3, headDim: 64, tokenStart: 256, tokenCount: 16, ...over };
}

function randomLayers(m: ChunkMeta): LayerKv[] {
  const elems = m.tokenCount * m.hkv * m.headDim;
  const make = () => {
    const bytes = randomBytes(elems * (m.dtype === "f16" ? 2 : 4));
    return m.dtype === "f16"
      ? new Uint16Array(bytes.buffer, bytes.byteOffset, elems)
      : new Float32Array(bytes.buffer, bytes.byteOffset, elems);
  };
  return m.layerIds.map(() => ({ k: make(), v: make() }));
}

function encode(m: ChunkMeta, layers = randomLayers(m)): Uint8Array {
  const out = new Uint8Array(chunkByteLength(m));
  expect(encodeChunkFromLayers(out, m, layers)).toBe(out.byteLength);
  return out;
}

function chunkError(fn: () => unknown): ChunkError {
  try {
    fn();
  } catch (e) {
    expect(e).toBeInstanceOf(ChunkError);
    return e as ChunkError;
  }
  throw new Error("expected a ChunkError");
}

describe("KV chunk format", () => {
  it("sizes: 64-byte aligned header, payload = tokens x layers x 2 x Hkv x d x dtype", () => {
    expect(chunkHeaderSize(1)).toBe(128);
    expect(chunkHeaderSize(30)).toBe(128);
    expect(chunkHeaderSize(32)).toBe(128);
    expect(chunkHeaderSize(33)).toBe(192);
    const m = meta({ layerIds: Array.from({ length: 30 }, (_, i) => i), tokenCount: 256 });
    expect(chunkPayloadLength(m)).toBe(256 * 30 * 2 * 3 * 64 * 2); // SmolLM2: 22.5 KiB per token
    expect(chunkByteLength(m)).toBe(128 + 256 * 23_040);
    expect(chunkPayloadLength(meta({ dtype: "f32" }))).toBe(2 * chunkPayloadLength(meta()));
  });

  for (const dtype of ["f16", "f32"] as const) {
    it(`round-trips ${dtype} KV through a chunk, token-major`, () => {
      const m = meta({ dtype });
      const layers = randomLayers(m);
      const bytes = encode(m, layers);
      const { header, payload } = verifyChunk(bytes, {
        fingerprint: FP,
        tokenStart: 256,
        tokenCount: 16,
        layerIds: [3, 4, 5],
        dtype,
      });
      expect(header).toMatchObject({ ...m, layoutVersion: 2, headerSize: 128, payloadLength: chunkPayloadLength(m) });
      expect(payload.byteOffset - bytes.byteOffset).toBe(128); // a view, not a copy

      // Layout: token t, layer index l, K then V, each one [Hkv][d] row.
      const row = m.hkv * m.headDim;
      const values =
        dtype === "f16"
          ? new Uint16Array(payload.buffer, payload.byteOffset, payload.byteLength / 2)
          : new Float32Array(payload.buffer, payload.byteOffset, payload.byteLength / 4);
      for (const [t, l] of [
        [0, 0],
        [5, 2],
        [15, 1],
      ] as const) {
        const base = (t * m.layerIds.length + l) * 2 * row;
        expect(values.subarray(base, base + row)).toEqual(layers[l]!.k.subarray(t * row, (t + 1) * row));
        expect(values.subarray(base + row, base + 2 * row)).toEqual(layers[l]!.v.subarray(t * row, (t + 1) * row));
      }

      const back = unpackKv(payload, header);
      back.forEach((layer, i) => {
        expect(layer.k).toEqual(layers[i]!.k);
        expect(layer.v).toEqual(layers[i]!.v);
      });
    });
  }

  it("encodeChunk from a packed payload equals packing straight into the chunk, at any buffer offset", () => {
    const m = meta();
    const layers = randomLayers(m);
    const payload = new Uint8Array(chunkPayloadLength(m));
    packKv(payload, m, layers);
    const arena = new Uint8Array(chunkByteLength(m) + 3);
    const into = arena.subarray(3); // unaligned on purpose
    expect(encodeChunk(into, m, payload)).toBe(chunkByteLength(m));
    expect(into).toEqual(encode(m, layers));
    expect(verifyChunk(into).header.tokenCount).toBe(16);
  });

  it("detects every flipped byte and every flipped bit", () => {
    const m = meta({ layerIds: [0, 7], hkv: 1, headDim: 4, tokenCount: 2 });
    const good = encode(m);
    expect(good.byteLength).toBe(128 + 64);
    for (let i = 0; i < good.byteLength; i++) {
      for (const mask of [0xff, 1, 2, 4, 8, 16, 32, 64, 128]) {
        const bad = good.slice();
        bad[i]! ^= mask;
        const err = chunkError(() => verifyChunk(bad, { fingerprint: FP }));
        if (i < 4) expect(err.code).toBe("bad_magic");
      }
    }
  });

  it("names what is wrong", () => {
    const good = encode(meta());
    const withByte = (at: number, value: number) => {
      const b = good.slice();
      expect(b[at], `byte ${at} already holds ${value}`).not.toBe(value);
      b[at] = value;
      return b;
    };
    expect(chunkError(() => verifyChunk(withByte(4, 1))).code).toBe("bad_version"); // layout 1 (zlib crc32)
    expect(chunkError(() => verifyChunk(withByte(12, 9))).code).toBe("bad_header"); // dtype
    expect(chunkError(() => verifyChunk(withByte(6, 64))).code).toBe("bad_header"); // header size
    expect(chunkError(() => verifyChunk(withByte(29, good[29]! ^ 1))).code).toBe("size_mismatch");
    expect(chunkError(() => verifyChunk(withByte(good.byteLength - 1, good.at(-1)! ^ 1))).code).toBe("checksum_mismatch");
    expect(chunkError(() => verifyChunk(good, { fingerprint: OTHER_FP })).code).toBe("fingerprint_mismatch");
    expect(chunkError(() => verifyChunk(good, { tokenStart: 0 })).message).toMatch(/tokenStart/);
    expect(chunkError(() => verifyChunk(good, { layerIds: [3, 4] })).code).toBe("metadata_mismatch");
    const longer = new Uint8Array(good.byteLength + 1);
    longer.set(good);
    expect(chunkError(() => verifyChunk(longer)).code).toBe("length_mismatch");
  });

  it("reports every truncation as truncated", () => {
    const good = encode(meta({ tokenCount: 2 }));
    for (let n = 0; n < good.byteLength; n++) expect(chunkError(() => verifyChunk(good.subarray(0, n))).code).toBe("truncated");
    expect(decodeChunkHeader(good.subarray(0, 128)).tokenCount).toBe(2); // the header alone is enough to size a read
  });

  it("refuses shapes it cannot encode and arrays that do not fit", () => {
    const buf = new Uint8Array(1 << 20);
    const invalid = (m: ChunkMeta, layers?: LayerKv[]) =>
      chunkError(() => encodeChunkFromLayers(buf, m, layers ?? randomLayers(meta()))).code;
    expect(invalid(meta({ fingerprint: "abc" }))).toBe("invalid_meta");
    expect(invalid(meta({ layerIds: [4, 3, 5] }))).toBe("invalid_meta");
    expect(invalid(meta({ layerIds: [] }))).toBe("invalid_meta");
    expect(invalid(meta({ tokenCount: 0 }))).toBe("invalid_meta");
    expect(invalid(meta({ hkv: 1.5 }))).toBe("invalid_meta");
    expect(invalid(meta({ tokenStart: 2 ** 32 - 1 }))).toBe("invalid_meta");
    expect(invalid(meta({ dtype: "f32" }))).toBe("invalid_meta"); // Uint16Array given for f32
    expect(invalid(meta(), randomLayers(meta()).slice(1))).toBe("invalid_meta");
    expect(invalid(meta(), randomLayers(meta({ tokenCount: 15 })))).toBe("invalid_meta");
    expect(chunkError(() => encodeChunkFromLayers(new Uint8Array(100), meta(), randomLayers(meta()))).code).toBe("buffer_too_small");
    expect(chunkError(() => encodeChunk(buf, meta(), new Uint8Array(10))).code).toBe("invalid_meta");
  });
});

describe("chunk keys", () => {
  const tokens = Array.from({ length: 1000 }, (_, i) => (i * 7919) % 49_152);
  const base = { fingerprint: FP, prefixTokens: tokens.slice(0, 512), tokenStart: 256, layerIds: [3, 4, 5] };

  it("is a deterministic hex sha256 that changes with every input", () => {
    const key = chunkKey(base);
    expect(key).toMatch(/^[0-9a-f]{64}$/);
    expect(chunkKey({ ...base, prefixTokens: [...base.prefixTokens] })).toBe(key);
    const variants = [
      { fingerprint: OTHER_FP },
      { prefixTokens: tokens.slice(0, 511) },
      { prefixTokens: [...tokens.slice(0, 511), tokens[511]! + 1] },
      { prefixTokens: [1, ...tokens.slice(1, 512)] }, // differs only before the chunk
      { tokenStart: 0 },
      { layerIds: [3, 4] },
      { layerIds: [3, 4, 6] },
      { dtype: "f32" as const },
      { layoutVersion: 3 },
    ];
    const keys = variants.map((v) => chunkKey({ ...base, ...v }));
    expect(new Set([key, ...keys]).size).toBe(variants.length + 1);
  });

  it("hashing a prompt block by block gives the same keys as hashing each prefix whole", () => {
    const hasher = new PrefixHasher(FP);
    for (let start = 0; start < tokens.length; start += 256) {
      hasher.push(tokens.slice(start, start + 256));
      const whole = chunkKey({ fingerprint: FP, prefixTokens: tokens.slice(0, hasher.length), tokenStart: start, layerIds: [0, 1] });
      expect(hasher.keyFor(start, [0, 1])).toBe(whole);
    }
    expect(hasher.length).toBe(1000);
  });

  it("identical prefixes share keys whatever follows", () => {
    const a = new PrefixHasher(FP).push(tokens.slice(0, 256));
    const b = new PrefixHasher(FP).push(tokens.slice(0, 256));
    const keyA = a.keyFor(0, [1]);
    a.push([1, 2, 3]);
    b.push([4, 5, 6]);
    expect(b.keyFor(0, [1])).not.toBe(keyA); // covers a longer prefix now
    expect(new PrefixHasher(FP).push(tokens.slice(0, 256)).keyFor(0, [1])).toBe(keyA);
    expect(a.keyFor(256, [1])).not.toBe(b.keyFor(256, [1]));
  });

  it("validates its inputs", () => {
    expect(() => new PrefixHasher("nope")).toThrow(ChunkError);
    expect(() => new PrefixHasher(FP).push([1, -1])).toThrow(/not a u32/);
    expect(() => new PrefixHasher(FP).push([1.5])).toThrow(/not a u32/);
    expect(() => new PrefixHasher(FP).push([1, 2]).keyFor(2, [0])).toThrow(/tokenStart/);
    expect(() => new PrefixHasher(FP).push([1, 2]).keyFor(0, [2, 1])).toThrow(/strictly increasing/);
  });
});
