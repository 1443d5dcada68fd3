// What a UCX owner publishes in the registry for one shard epoch (shards.ucx_endpoint): its
// worker address, the id of the shard's mapping in its process, that mapping's secret token (the
// owner answers only asks that carry it), and the mapping's length, in an envelope with a
// checksum. The reader trusts none of it: decodeUcxEndpoint checks the envelope before a byte
// reaches UCX, whose address parser is not built for malformed input (a flipped byte must be a
// clean error, not a crash).
//
// Layout (little-endian): "CXU2", epoch u32, mapping u64, token u64, length u64, address length
// u32, 0 u32, address, CRC-32C u32 of everything before it. Stored as base64.
import { crc32c } from "../../../shared/inference/engine/native.ts";

const MAGIC = 0x32555843; // "CXU2"
const HEAD = 40;
/** Far above what UCX packs (a few hundred bytes with every transport of a host), far below harm. */
export const MAX_UCX_ADDRESS = 16 << 10;
const MAX_TEXT = Math.ceil(((HEAD + MAX_UCX_ADDRESS + 4) * 4) / 3) + 4;
const BASE64 = /^[A-Za-z0-9+/]+={0,2}$/;

export interface UcxEndpoint {
  epoch: number;
  /** The shard's mapping in the owner's process. */
  mapping: bigint;
  /** The mapping's secret: an ask without it is refused. */
  token: bigint;
  /** Bytes mapped. */
  length: number;
  address: Uint8Array;
}

export function encodeUcxEndpoint(ep: UcxEndpoint): string {
  if (ep.address.byteLength < 1 || ep.address.byteLength > MAX_UCX_ADDRESS)
    throw new RangeError(`UCX worker address of ${ep.address.byteLength} bytes`);
  const buf = Buffer.alloc(HEAD + ep.address.byteLength + 4);
  buf.writeUInt32LE(MAGIC, 0);
  buf.writeUInt32LE(ep.epoch, 4);
  buf.writeBigUInt64LE(ep.mapping, 8);
  buf.writeBigUInt64LE(ep.token, 16);
  buf.writeBigUInt64LE(BigInt(ep.length), 24);
  buf.writeUInt32LE(ep.address.byteLength, 32);
  buf.set(ep.address, HEAD);
  const end = buf.byteLength - 4;
  buf.writeUInt32LE(crc32c(buf.subarray(0, end)), end);
  return buf.toString("base64");
}

/** The endpoint in `text`, or a sentence saying what is wrong with it. */
export function decodeUcxEndpoint(text: unknown): UcxEndpoint | string {
  if (typeof text !== "string" || text.length < 8 || text.length > MAX_TEXT || !BASE64.test(text))
    return "not a base64 UCX endpoint of a sane size";
  const buf = Buffer.from(text, "base64");
  if (buf.byteLength < HEAD + 1 + 4) return `${buf.byteLength} bytes is too short`;
  if (buf.readUInt32LE(0) !== MAGIC) return "wrong magic";
  const end = buf.byteLength - 4;
  if (crc32c(buf.subarray(0, end)) !== buf.readUInt32LE(end)) return "checksum mismatch";
  const addressLength = buf.readUInt32LE(32);
  if (addressLength < 1 || addressLength > MAX_UCX_ADDRESS) return "address length out of bounds";
  if (HEAD + addressLength !== end) return "lengths do not add up to the envelope";
  const epoch = buf.readUInt32LE(4);
  const mapping = buf.readBigUInt64LE(8);
  const length = buf.readBigUInt64LE(24);
  if (epoch < 1) return "epoch 0";
  if (mapping === 0n) return "mapping 0";
  if (length < 1n || length > BigInt(Number.MAX_SAFE_INTEGER)) return "mapped length out of bounds";
  return { epoch, mapping, token: buf.readBigUInt64LE(16), length: Number(length), address: buf.subarray(HEAD, end) };
}
