// The KV chunk binary format (layout version 2): a little-endian header, then the payload
// token-major [token][layer][K|V][Hkv][headDim], so that gathering selected tokens reads every
// layer of a token in one contiguous run.
//
//   off size  field
//     0    4  magic "CXKV"
//     4    2  layout version (u16)
//     6    2  header size (u16): 64 + 2·nLayers rounded up to 64, so the payload is 64-byte aligned
//     8    4  checksum (u32): CRC-32C of bytes [0, 8) then [12, end of payload)
//    12    1  dtype: 0 f32, 1 f16
//    13    1  reserved, 0
//    14    2  nLayers (u16)
//    16    2  Hkv (u16)
//    18    2  headDim (u16)
//    20    4  tokenStart (u32)
//    24    4  tokenCount (u32)
//    28    4  payload length (u32) = tokenCount · nLayers · 2 · Hkv · headDim · dtype size
//    32   32  model fingerprint (raw bytes; hex in the registry)
//    64 2·nL  layer ids (u16, strictly increasing), then zero padding up to the header size
//
// Why CRC-32C and not a cryptographic hash: the checksum guards against accidental damage (a torn
// or stale shard range, a transport bug), not an adversary inside the cluster. CRC-32C detects
// every error burst up to 32 bits and, with SSE4.2 (the engine's crc32c), runs at about twice
// zlib.crc32's speed (layout version 1) and five times sha256's (bench/checksum/README.md); it is
// checked on every transfer, so its speed is part of the handoff's.
import { CtxbankError } from "../../../shared/inference/errors.ts";
import { crc32c } from "../../../shared/inference/engine/native.ts";

export const CHUNK_MAGIC = "CXKV";
export const LAYOUT_VERSION = 2;
const FIXED_HEADER = 64;
const HEADER_ALIGN = 64;
const MAX_LAYERS = 4096;
const U16_MAX = 0xffff;
const U32_MAX = 0xffff_ffff;

export type KvDtype = "f32" | "f16";
/** The dtype byte of the header (and of the chunk key). */
export const DTYPE_CODE: Readonly<Record<KvDtype, number>> = { f32: 0, f16: 1 };
const DTYPE_BYTES: Record<KvDtype, number> = { f32: 4, f16: 2 };

/** What a chunk holds; everything but the checksum and the derived sizes. */
export interface ChunkMeta {
  fingerprint: string; // 64 lowercase hex digits (sha256 of the model)
  dtype: KvDtype;
  layerIds: readonly number[];
  hkv: number;
  headDim: number;
  tokenStart: number;
  tokenCount: number;
}

export interface ChunkHeader extends ChunkMeta {
  layoutVersion: number;
  headerSize: number;
  payloadLength: number;
  checksum: number;
}

export const CHUNK_ERROR_CODES = [
  "bad_magic",
  "bad_version",
  "bad_header", // a header field is out of range or inconsistent
  "size_mismatch", // payload length does not match the shape
  "truncated", // fewer bytes than the header says
  "length_mismatch", // more bytes than the chunk (the caller passed the wrong range)
  "checksum_mismatch",
  "fingerprint_mismatch",
  "metadata_mismatch", // valid chunk, but not the one the registry row describes
  "buffer_too_small",
  "invalid_meta", // encode was given an impossible shape
] as const;
export type ChunkErrorCode = (typeof CHUNK_ERROR_CODES)[number];

export class ChunkError extends CtxbankError<ChunkErrorCode> {
  static override readonly codes = CHUNK_ERROR_CODES;
  override readonly name = "ChunkError";
}

export function dtypeBytes(dtype: KvDtype): number {
  return DTYPE_BYTES[dtype];
}

export function chunkHeaderSize(nLayers: number): number {
  return Math.ceil((FIXED_HEADER + 2 * nLayers) / HEADER_ALIGN) * HEADER_ALIGN;
}

export function chunkPayloadLength(meta: ChunkMeta): number {
  return meta.tokenCount * meta.layerIds.length * 2 * meta.hkv * meta.headDim * DTYPE_BYTES[meta.dtype];
}

/** Total bytes of the encoded chunk (header + payload): what to allocate in a shard. */
export function chunkByteLength(meta: ChunkMeta): number {
  return chunkHeaderSize(meta.layerIds.length) + chunkPayloadLength(meta);
}

export function fingerprintBytes(hex: string): Uint8Array {
  if (!/^[0-9a-f]{64}$/.test(hex)) {
    throw new ChunkError("invalid_meta", `model fingerprint must be 64 lowercase hex digits, got "${hex}"`);
  }
  return Buffer.from(hex, "hex");
}

/** Throws invalid_meta unless the shape can be encoded. */
export function validateMeta(meta: ChunkMeta): void {
  fingerprintBytes(meta.fingerprint);
  const bad = (what: string) => {
    throw new ChunkError("invalid_meta", `cannot encode chunk: ${what}`);
  };
  if (!(meta.dtype in DTYPE_CODE)) bad(`unknown dtype "${meta.dtype}"`);
  const ids = meta.layerIds;
  if (ids.length < 1 || ids.length > MAX_LAYERS) bad(`needs 1..${MAX_LAYERS} layers, got ${ids.length}`);
  ids.forEach((id, i) => {
    if (!isUint(id, U16_MAX)) bad(`layer id ${id} is not a u16`);
    if (i > 0 && id <= ids[i - 1]!) bad(`layer ids must be strictly increasing, got ${ids.join(",")}`);
  });
  if (!isUint(meta.hkv, U16_MAX) || meta.hkv < 1) bad(`Hkv ${meta.hkv} is not in 1..65535`);
  if (!isUint(meta.headDim, U16_MAX) || meta.headDim < 1) bad(`headDim ${meta.headDim} is not in 1..65535`);
  if (!isUint(meta.tokenCount, U32_MAX) || meta.tokenCount < 1) bad(`tokenCount ${meta.tokenCount} must be >= 1`);
  if (!isUint(meta.tokenStart, U32_MAX) || meta.tokenStart + meta.tokenCount > U32_MAX) {
    bad(`token range ${meta.tokenStart}+${meta.tokenCount} does not fit u32`);
  }
  if (chunkPayloadLength(meta) > U32_MAX) bad(`payload of ${chunkPayloadLength(meta)} bytes exceeds 4 GiB`);
}

/**
 * Writes the header for `meta` at the start of `into` with a zero checksum; returns the header
 * size. The caller then fills the payload and calls sealChunk.
 */
export function writeChunkHeader(into: Uint8Array, meta: ChunkMeta): number {
  validateMeta(meta);
  const headerSize = chunkHeaderSize(meta.layerIds.length);
  const total = headerSize + chunkPayloadLength(meta);
  if (into.byteLength < total) {
    throw new ChunkError("buffer_too_small", `chunk needs ${total} bytes, buffer has ${into.byteLength}`);
  }
  into.fill(0, 0, headerSize);
  const view = dataView(into);
  into.set(Buffer.from(CHUNK_MAGIC, "latin1"), 0);
  view.setUint16(4, LAYOUT_VERSION, true);
  view.setUint16(6, headerSize, true);
  view.setUint8(12, DTYPE_CODE[meta.dtype]);
  view.setUint16(14, meta.layerIds.length, true);
  view.setUint16(16, meta.hkv, true);
  view.setUint16(18, meta.headDim, true);
  view.setUint32(20, meta.tokenStart, true);
  view.setUint32(24, meta.tokenCount, true);
  view.setUint32(28, chunkPayloadLength(meta), true);
  into.set(fingerprintBytes(meta.fingerprint), 32);
  meta.layerIds.forEach((id, i) => view.setUint16(FIXED_HEADER + 2 * i, id, true));
  return headerSize;
}

/** Computes and stores the checksum of a chunk whose header and payload are written; returns it. */
export function sealChunk(chunk: Uint8Array): number {
  const header = decodeChunkHeader(chunk);
  const checksum = computeChecksum(chunk, header.headerSize + header.payloadLength);
  dataView(chunk).setUint32(8, checksum, true);
  return checksum;
}

/** Header + a copy of `payload` + checksum into `into`; returns bytes written. */
export function encodeChunk(into: Uint8Array, meta: ChunkMeta, payload: Uint8Array): number {
  const expected = chunkPayloadLength(meta);
  if (payload.byteLength !== expected) {
    throw new ChunkError("invalid_meta", `payload has ${payload.byteLength} bytes, the shape needs ${expected}`);
  }
  const headerSize = writeChunkHeader(into, meta);
  into.set(payload, headerSize);
  sealChunk(into);
  return headerSize + expected;
}

/** Parses and structurally validates a header (not the checksum). `bytes` may be just the header. */
export function decodeChunkHeader(bytes: Uint8Array): ChunkHeader {
  if (bytes.byteLength < FIXED_HEADER) {
    throw new ChunkError("truncated", `chunk header needs ${FIXED_HEADER} bytes, got ${bytes.byteLength}`);
  }
  const magic = Buffer.from(bytes.buffer, bytes.byteOffset, 4).toString("latin1");
  if (magic !== CHUNK_MAGIC) throw new ChunkError("bad_magic", `not a KV chunk: magic is ${JSON.stringify(magic)}`);
  const view = dataView(bytes);
  const layoutVersion = view.getUint16(4, true);
  if (layoutVersion !== LAYOUT_VERSION) {
    throw new ChunkError("bad_version", `chunk layout version ${layoutVersion}, this build reads ${LAYOUT_VERSION}`);
  }
  const bad = (what: string) => new ChunkError("bad_header", `bad chunk header: ${what}`);
  const headerSize = view.getUint16(6, true);
  const dtypeCode = view.getUint8(12);
  const dtype = (Object.keys(DTYPE_CODE) as KvDtype[]).find((d) => DTYPE_CODE[d] === dtypeCode);
  if (!dtype) throw bad(`unknown dtype code ${dtypeCode}`);
  if (view.getUint8(13) !== 0) throw bad("reserved byte is not zero");
  const nLayers = view.getUint16(14, true);
  if (nLayers < 1 || nLayers > MAX_LAYERS) throw bad(`nLayers ${nLayers} is not in 1..${MAX_LAYERS}`);
  if (headerSize !== chunkHeaderSize(nLayers)) {
    throw bad(`header size ${headerSize} does not match ${nLayers} layers (${chunkHeaderSize(nLayers)})`);
  }
  if (bytes.byteLength < headerSize) {
    throw new ChunkError("truncated", `chunk header is ${headerSize} bytes, got ${bytes.byteLength}`);
  }
  const hkv = view.getUint16(16, true);
  const headDim = view.getUint16(18, true);
  const tokenStart = view.getUint32(20, true);
  const tokenCount = view.getUint32(24, true);
  const payloadLength = view.getUint32(28, true);
  if (hkv < 1 || headDim < 1 || tokenCount < 1) throw bad(`empty shape Hkv=${hkv} headDim=${headDim} tokens=${tokenCount}`);
  if (tokenStart + tokenCount > U32_MAX) throw bad(`token range ${tokenStart}+${tokenCount} overflows u32`);
  const layerIds: number[] = [];
  for (let i = 0; i < nLayers; i++) {
    const id = view.getUint16(FIXED_HEADER + 2 * i, true);
    if (i > 0 && id <= layerIds[i - 1]!) throw bad("layer ids are not strictly increasing");
    layerIds.push(id);
  }
  for (let off = FIXED_HEADER + 2 * nLayers; off < headerSize; off++) {
    if (bytes[off] !== 0) throw bad(`padding byte at ${off} is not zero`);
  }
  const header: ChunkHeader = {
    layoutVersion,
    headerSize,
    payloadLength,
    checksum: view.getUint32(8, true),
    fingerprint: Buffer.from(bytes.buffer, bytes.byteOffset + 32, 32).toString("hex"),
    dtype,
    layerIds,
    hkv,
    headDim,
    tokenStart,
    tokenCount,
  };
  const expected = chunkPayloadLength(header);
  if (payloadLength !== expected) {
    throw new ChunkError(
      "size_mismatch",
      `payload length ${payloadLength} does not match ${tokenCount} tokens x ${nLayers} layers x 2 x ${hkv} x ${headDim} ${dtype} (${expected})`,
    );
  }
  return header;
}

/** What the reader expects, usually from the chunk's registry row. */
export interface ChunkExpectation {
  fingerprint?: string;
  checksum?: number;
  tokenStart?: number;
  tokenCount?: number;
  layerIds?: readonly number[];
  dtype?: KvDtype;
}

/**
 * Validates a whole chunk (exactly its bytes, no more, no less): header, checksum, and whatever
 * the caller expects. Returns the header and a view of the payload (no copy).
 */
export function verifyChunk(bytes: Uint8Array, expect: ChunkExpectation = {}): { header: ChunkHeader; payload: Uint8Array } {
  const header = chunkLength(bytes);
  checkChecksum(header, computeChecksum(bytes, bytes.byteLength));
  checkExpectation(header, expect);
  return { header, payload: bytes.subarray(header.headerSize) };
}

/**
 * verifyChunk without the checksum, for a reader that computes it as it imports the payload
 * (seq-io.ts importVerifiedChunk) and then calls checkChecksum. Returns the header.
 */
export function checkChunkButChecksum(bytes: Uint8Array, expect: ChunkExpectation = {}): ChunkHeader {
  const header = chunkLength(bytes);
  checkExpectation(header, expect);
  return header;
}

/** Throws checksum_mismatch unless `computed` (CRC-32C of the chunk's bytes) is the header's checksum. */
export function checkChecksum(header: ChunkHeader, computed: number): void {
  if (computed !== header.checksum) {
    throw new ChunkError("checksum_mismatch", `chunk checksum ${hex32(computed)} does not match stored ${hex32(header.checksum)}`);
  }
}

/** The header of a chunk that is exactly `bytes` long. */
function chunkLength(bytes: Uint8Array): ChunkHeader {
  const header = decodeChunkHeader(bytes);
  const total = header.headerSize + header.payloadLength;
  if (bytes.byteLength < total) throw new ChunkError("truncated", `chunk is ${total} bytes, got ${bytes.byteLength}`);
  if (bytes.byteLength > total) {
    throw new ChunkError("length_mismatch", `chunk is ${total} bytes but ${bytes.byteLength} were given`);
  }
  return header;
}

function checkExpectation(header: ChunkHeader, expect: ChunkExpectation): void {
  if (expect.fingerprint !== undefined && expect.fingerprint !== header.fingerprint) {
    throw new ChunkError(
      "fingerprint_mismatch",
      `chunk was made by model ${header.fingerprint.slice(0, 12)}…, expected ${expect.fingerprint.slice(0, 12)}…`,
    );
  }
  const mismatches: string[] = [];
  if (expect.checksum !== undefined && expect.checksum !== header.checksum) mismatches.push("checksum");
  if (expect.tokenStart !== undefined && expect.tokenStart !== header.tokenStart) mismatches.push("tokenStart");
  if (expect.tokenCount !== undefined && expect.tokenCount !== header.tokenCount) mismatches.push("tokenCount");
  if (expect.dtype !== undefined && expect.dtype !== header.dtype) mismatches.push("dtype");
  if (expect.layerIds !== undefined && expect.layerIds.join(",") !== header.layerIds.join(",")) mismatches.push("layerIds");
  if (mismatches.length > 0) {
    throw new ChunkError("metadata_mismatch", `chunk is not the one expected: ${mismatches.join(", ")} differ`);
  }
}

function computeChecksum(chunk: Uint8Array, total: number): number {
  return crc32c(chunk.subarray(12, total), crc32c(chunk.subarray(0, 8)));
}

function dataView(bytes: Uint8Array): DataView {
  return new DataView(bytes.buffer, bytes.byteOffset, bytes.byteLength);
}

function isUint(n: number, max: number): boolean {
  return Number.isInteger(n) && n >= 0 && n <= max;
}

function hex32(n: number): string {
  return `0x${n.toString(16).padStart(8, "0")}`;
}
