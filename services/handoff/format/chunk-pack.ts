// Packs per-layer KV (the engine's layout: for each layer, K and V as [token][Hkv][headDim]) into
// a chunk's token-major payload [token][layer][K|V][Hkv][headDim], and back.
import os from "node:os";
import { ChunkError, chunkPayloadLength, dtypeBytes, sealChunk, writeChunkHeader, type ChunkMeta, type KvDtype } from "./chunk.ts";

// Typed arrays use the host byte order and the format is little-endian; every target we build
// for (x86-64, aarch64) is little-endian, so rows are copied as raw bytes.
if (os.endianness() !== "LE") throw new Error("ctxbank KV chunks need a little-endian host");

/** f16 values as raw IEEE-754 half bits, or f32 values. */
export type KvArray = Uint16Array | Float32Array;
export interface LayerKv {
  k: KvArray;
  v: KvArray;
}

/** Writes the header, packs `layers` straight into the payload, seals; returns bytes written. */
export function encodeChunkFromLayers(into: Uint8Array, meta: ChunkMeta, layers: readonly LayerKv[]): number {
  const headerSize = writeChunkHeader(into, meta);
  const total = headerSize + chunkPayloadLength(meta);
  packKv(into.subarray(headerSize, total), meta, layers);
  sealChunk(into.subarray(0, total));
  return total;
}

/** Copies rows 0..tokenCount-1 of every layer into the token-major payload. */
export function packKv(payload: Uint8Array, meta: ChunkMeta, layers: readonly LayerKv[]): void {
  const rowBytes = checkShape(payload, meta, layers);
  const sources = layers.map(({ k, v }) => [bytesOf(k), bytesOf(v)] as const);
  let dst = 0;
  for (let t = 0; t < meta.tokenCount; t++) {
    const src = t * rowBytes;
    for (const [k, v] of sources) {
      payload.set(k.subarray(src, src + rowBytes), dst);
      payload.set(v.subarray(src, src + rowBytes), dst + rowBytes);
      dst += 2 * rowBytes;
    }
  }
}

/** Splits a token-major payload back into per-layer K and V arrays (new arrays, or `into`). */
export function unpackKv(payload: Uint8Array, meta: ChunkMeta, into?: readonly LayerKv[]): LayerKv[] {
  const elems = meta.tokenCount * meta.hkv * meta.headDim;
  const layers = into ? [...into] : meta.layerIds.map(() => ({ k: newArray(meta.dtype, elems), v: newArray(meta.dtype, elems) }));
  const rowBytes = checkShape(payload, meta, layers);
  const targets = layers.map(({ k, v }) => [bytesOf(k), bytesOf(v)] as const);
  let src = 0;
  for (let t = 0; t < meta.tokenCount; t++) {
    const dst = t * rowBytes;
    for (const [k, v] of targets) {
      k.set(payload.subarray(src, src + rowBytes), dst);
      v.set(payload.subarray(src + rowBytes, src + 2 * rowBytes), dst);
      src += 2 * rowBytes;
    }
  }
  return layers;
}

/** Checks the arrays and payload fit the shape; returns the bytes of one [Hkv][headDim] row. */
function checkShape(payload: Uint8Array, meta: ChunkMeta, layers: readonly LayerKv[]): number {
  const bad = (what: string) => new ChunkError("invalid_meta", what);
  if (payload.byteLength !== chunkPayloadLength(meta)) {
    throw bad(`payload has ${payload.byteLength} bytes, the shape needs ${chunkPayloadLength(meta)}`);
  }
  if (layers.length !== meta.layerIds.length) {
    throw bad(`got KV for ${layers.length} layers, the chunk has ${meta.layerIds.length}`);
  }
  const Expected = meta.dtype === "f16" ? Uint16Array : Float32Array;
  const elems = meta.tokenCount * meta.hkv * meta.headDim;
  layers.forEach(({ k, v }, i) => {
    for (const [name, a] of [
      ["K", k],
      ["V", v],
    ] as const) {
      if (!(a instanceof Expected)) throw bad(`layer ${meta.layerIds[i]} ${name} must be a ${Expected.name} for ${meta.dtype}`);
      if (a.length < elems) throw bad(`layer ${meta.layerIds[i]} ${name} has ${a.length} values, needs ${elems}`);
    }
  });
  return meta.hkv * meta.headDim * dtypeBytes(meta.dtype);
}

function bytesOf(a: KvArray): Uint8Array {
  return new Uint8Array(a.buffer, a.byteOffset, a.byteLength);
}

function newArray(dtype: KvDtype, elems: number): KvArray {
  return dtype === "f16" ? new Uint16Array(elems) : new Float32Array(elems);
}
