// Between a NativeSequence's f16 cache and KV chunks: the plan of chunks for a prompt (layer
// groups x token blocks), zero-copy per-layer views of a token range of the cache (for reading
// it from JS), and export / import of one chunk, whose token-major ⇄ layer-major transpose runs
// natively (seq.exportRows / seq.importRows; seq.importChunk also checksums the chunk in the same
// pass). The cache layout (native.ts): layer l's K starts at element l*2*capacity*kvDim and its V
// at l*2*capacity*kvDim + capacity*kvDim; rows are [token][kvDim].
import type { ModelConfig, NativeSequence } from "../../../shared/inference/engine/native.ts";
import {
  ChunkError,
  checkChecksum,
  checkChunkButChecksum,
  chunkPayloadLength,
  sealChunk,
  writeChunkHeader,
  type ChunkExpectation,
  type ChunkHeader,
  type ChunkMeta,
} from "./chunk.ts";
import type { LayerKv } from "./chunk-pack.ts";

export interface KvShape {
  nLayer: number;
  hkv: number;
  headDim: number;
  /**
   * The sliding-window layers and their window (none: []/0). Such a layer's rows before its last
   * window are never read, and the engine keeps a ring of rows for it (native/src/kv_cache.h), so a
   * copy of a sequence carries only its last window (windowStart).
   */
  slidingLayers: readonly number[];
  slidingWindow: number;
}

export function kvShape(config: Pick<ModelConfig, "nLayer" | "nHeadKv" | "headDim" | "slidingLayers" | "slidingWindow">): KvShape {
  return {
    nLayer: config.nLayer,
    hkv: config.nHeadKv,
    headDim: config.headDim,
    slidingLayers: config.slidingLayers,
    slidingWindow: config.slidingWindow,
  };
}

/** The first token of a sliding-window layer's rows a copy of n tokens carries: the start of its last window. */
export function windowStart(shape: Pick<KvShape, "slidingWindow">, nTokens: number): number {
  return Math.max(0, nTokens - shape.slidingWindow);
}

/** The first token of layer `l`'s rows a copy of n tokens carries (0, or windowStart on a sliding layer). */
function firstRowKept(shape: Pick<KvShape, "slidingLayers" | "slidingWindow">, layer: number, nTokens: number): number {
  return shape.slidingLayers.includes(layer) ? windowStart(shape, nTokens) : 0;
}

/**
 * Layer groups split into their global and their sliding-window layers (global part first, empty
 * parts dropped): a sliding part is copied only for its last window.
 */
export function splitSlidingLayers(groups: readonly (readonly number[])[], shape: KvShape): { layerIds: number[]; sliding: boolean }[] {
  const sliding = new Set(shape.slidingLayers);
  return groups.flatMap((g) =>
    [
      { layerIds: g.filter((l) => !sliding.has(l)), sliding: false },
      { layerIds: g.filter((l) => sliding.has(l)), sliding: true },
    ].filter((part) => part.layerIds.length > 0),
  );
}

/**
 * The rows that carry a sequence's first n tokens, by part of the layers: the global layers from
 * token 0, the sliding-window layers from the start of their last window (global part first).
 */
export function heldParts(shape: KvShape, nTokens: number): { layerIds: number[]; tokenStart: number }[] {
  const all = Array.from({ length: shape.nLayer }, (_, l) => l);
  return splitSlidingLayers([all], shape).map(({ layerIds, sliding }) => ({
    layerIds,
    tokenStart: sliding ? windowStart(shape, nTokens) : 0,
  }));
}

/** heldParts in chunks of `blockTokens` tokens, each part's in token order. */
export function heldChunks(
  shape: KvShape,
  nTokens: number,
  blockTokens: number,
): { layerIds: number[]; tokenStart: number; tokenCount: number }[] {
  return heldParts(shape, nTokens).flatMap(({ layerIds, tokenStart: from }) =>
    tokenBlocks(nTokens - from, blockTokens).map((b) => ({
      layerIds,
      tokenStart: from + b.tokenStart,
      tokenCount: b.tokenEnd - b.tokenStart,
    })),
  );
}

export interface BlockRange {
  tokenStart: number;
  tokenEnd: number;
}

/** Token blocks [0, blockTokens), [blockTokens, 2·blockTokens), … covering [0, nTokens). */
export function tokenBlocks(nTokens: number, blockTokens: number): BlockRange[] {
  const blocks: BlockRange[] = [];
  for (let s = 0; s < nTokens; s += blockTokens) blocks.push({ tokenStart: s, tokenEnd: Math.min(nTokens, s + blockTokens) });
  return blocks;
}

/** The part of a sequence's cache a chunk reads from or writes to. */
export interface CacheView {
  buffer: ArrayBuffer; // seq.kvBuffer()
  capacity: number; // seq.capacity
}

/** Zero-copy f16 views of rows [tokenStart, tokenStart+tokenCount) of K and V for each layer. */
export function layerViews(
  cache: CacheView,
  shape: KvShape,
  layerIds: readonly number[],
  tokenStart: number,
  tokenCount: number,
): LayerKv[] {
  const kvDim = shape.hkv * shape.headDim;
  if (tokenStart + tokenCount > cache.capacity) {
    throw new ChunkError("invalid_meta", `tokens ${tokenStart}+${tokenCount} exceed the sequence capacity ${cache.capacity}`);
  }
  const all = new Uint16Array(cache.buffer);
  const need = shape.nLayer * 2 * cache.capacity * kvDim;
  if (all.length < need) throw new ChunkError("invalid_meta", `the cache has ${all.length} values, the shape needs ${need}`);
  return layerIds.map((l) => {
    if (l >= shape.nLayer) throw new ChunkError("invalid_meta", `layer ${l} is not in the model's ${shape.nLayer} layers`);
    const k = l * 2 * cache.capacity * kvDim + tokenStart * kvDim;
    const v = k + cache.capacity * kvDim;
    return { k: all.subarray(k, k + tokenCount * kvDim), v: all.subarray(v, v + tokenCount * kvDim) };
  });
}

/** What export and import need of a sequence. */
export type RowMover = Pick<NativeSequence, "exportRows" | "importRows" | "importChunk">;

/** Encodes the chunk `meta` describes from the sequence's cache into `into`; returns the bytes written. */
export function exportChunk(into: Uint8Array, meta: ChunkMeta, seq: RowMover, shape: KvShape): number {
  checkShape(meta, shape);
  const headerSize = writeChunkHeader(into, meta);
  const total = headerSize + chunkPayloadLength(meta);
  moveRows(() => seq.exportRows(into.subarray(headerSize, total), meta.layerIds, meta.tokenStart, meta.tokenCount));
  sealChunk(into.subarray(0, total));
  return total;
}

/** Writes a verified chunk's payload into the cache rows it covers. */
export function importChunk(payload: Uint8Array, meta: ChunkMeta, seq: RowMover, shape: KvShape): void {
  checkShape(meta, shape);
  if (payload.byteLength !== chunkPayloadLength(meta)) {
    throw new ChunkError("invalid_meta", `payload has ${payload.byteLength} bytes, the shape needs ${chunkPayloadLength(meta)}`);
  }
  moveRows(() => seq.importRows(payload, meta.layerIds, meta.tokenStart, meta.tokenCount));
}

/**
 * A whole chunk as it arrived (exactly its bytes) into the cache rows it covers, verified: the
 * header and `expect` first (so only the rows the caller expects are written), then the payload is
 * transposed into the cache and checksummed in one native pass (seq.importChunk). Throws
 * ChunkError, checksum_mismatch included; the rows are then written but must not be declared
 * (the caller sets no length for a load that failed). Returns the header.
 */
export function importVerifiedChunk(bytes: Uint8Array, expect: ChunkExpectation, seq: RowMover, shape: KvShape): ChunkHeader {
  const header = checkChunkButChecksum(bytes, expect);
  checkShape(header, shape);
  const computed = moveRows(() => seq.importChunk(bytes, header.headerSize, header.layerIds, header.tokenStart, header.tokenCount));
  checkChecksum(header, computed);
  return header;
}

function checkShape(meta: ChunkMeta, shape: KvShape): void {
  if (meta.dtype !== "f16") throw new ChunkError("invalid_meta", `the engine's cache is f16, the chunk is ${meta.dtype}`);
  if (meta.hkv !== shape.hkv || meta.headDim !== shape.headDim) {
    throw new ChunkError("invalid_meta", `chunk is Hkv=${meta.hkv} headDim=${meta.headDim}, the model has ${shape.hkv}x${shape.headDim}`);
  }
}

/** The engine's RangeError (rows outside the cache, a layer the model lacks) as a ChunkError. */
function moveRows<T>(move: () => T): T {
  try {
    return move();
  } catch (e) {
    if (e instanceof RangeError) throw new ChunkError("invalid_meta", e.message);
    throw e;
  }
}

/**
 * Checks that chunks (by layer ids and token range) cover every layer for tokens [0, nTokens)
 * exactly once; returns a sentence saying what is wrong, or null. `leftOut`: token ranges the
 * layers above `aboveLayer` may lack (Round Attention's unpicked rounds, round-chunks.ts).
 */
export function coverageProblem(
  chunks: readonly { layerIds: readonly number[]; tokenStart: number; tokenEnd: number }[],
  shape: Pick<KvShape, "nLayer" | "slidingLayers" | "slidingWindow">,
  nTokens: number,
  leftOut?: { aboveLayer: number; ranges: readonly BlockRange[] },
): string | null {
  const { nLayer } = shape;
  // Past the left-out ranges that start where the layer's coverage stopped.
  const skip = (l: number, at: number): number => {
    if (!leftOut || l <= leftOut.aboveLayer) return at;
    for (const r of leftOut.ranges) if (r.tokenStart === at) at = r.tokenEnd;
    return at;
  };
  const perLayer = Array.from({ length: nLayer }, () => [] as BlockRange[]);
  for (const c of chunks) {
    for (const l of c.layerIds) {
      if (l >= nLayer) return `a chunk holds layer ${l}, the model has ${nLayer}`;
      perLayer[l]!.push({ tokenStart: c.tokenStart, tokenEnd: c.tokenEnd });
    }
  }
  for (let l = 0; l < nLayer; l++) {
    // A sliding-window layer needs its last window only: rows before it are not counted.
    let at = firstRowKept(shape, l, nTokens);
    const from = at;
    const ranges = perLayer[l]!.filter((r) => r.tokenEnd > from)
      .map((r) => ({ tokenStart: Math.max(r.tokenStart, from), tokenEnd: r.tokenEnd }))
      .sort((a, b) => a.tokenStart - b.tokenStart);
    for (const r of ranges) {
      if (r.tokenStart !== at) at = skip(l, at);
      if (r.tokenStart !== at) return `layer ${l}: tokens ${at}..${r.tokenStart} ${r.tokenStart > at ? "are missing" : "overlap"}`;
      at = r.tokenEnd;
    }
    at = skip(l, at);
    if (at !== nTokens) return `layer ${l}: chunks cover ${at} of ${nTokens} tokens`;
  }
  return null;
}
