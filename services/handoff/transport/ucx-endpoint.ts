// What a UCX owner publishes in the registry for one shard epoch (shards.ucx_endpoint): its
// worker address, the packed remote key of the shard's mapped pages, where those pages are in its
// process, and how long they are, in an envelope with a checksum. The reader trusts none of it:
// decodeUcxEndpoint checks the envelope before a byte reaches UCX, whose address and rkey parsers
// are not built for malformed input (a flipped byte must be a clean error, not a crash).
//
// Layout (little-endian): "CXU1", epoch u32, base u64, length u64, fence u64, address length
// u32, rkey length u32, fence rkey length u32, 0 u32, address, rkey, fence rkey, CRC-32C u32 of
// everything before it. Stored as base64.
import { crc32c } from "../../../shared/inference/engine/native.ts";

const MAGIC = 0x31555843; // "CXU1"
const HEAD = 48;
/** Far above what UCX packs (a few hundred bytes with every transport of a host), far below harm. */
export const MAX_UCX_ADDRESS = 16 << 10;
export const MAX_UCX_RKEY = 4 << 10;
const MAX_TEXT = Math.ceil(((HEAD + MAX_UCX_ADDRESS + 2 * MAX_UCX_RKEY + 4) * 4) / 3) + 4;
const BASE64 = /^[A-Za-z0-9+/]+={0,2}$/;

export interface UcxEndpoint {
  epoch: number;
  /** The shard's first byte in the owner's address space. */
  base: bigint;
  /** Bytes mapped from `base`. */
  length: number;
  /** Where the owner keeps this epoch's word (the epoch while the pages are mapped, then 0). */
  fence: bigint;
  address: Uint8Array;
  rkey: Uint8Array;
  fenceRkey: Uint8Array;
}

export function encodeUcxEndpoint(ep: UcxEndpoint): string {
  if (ep.address.byteLength < 1 || ep.address.byteLength > MAX_UCX_ADDRESS) throw new RangeError(`UCX worker address of ${ep.address.byteLength} bytes`);
  for (const rkey of [ep.rkey, ep.fenceRkey]) {
    if (rkey.byteLength < 1 || rkey.byteLength > MAX_UCX_RKEY) throw new RangeError(`UCX rkey of ${rkey.byteLength} bytes`);
  }
  const buf = Buffer.alloc(HEAD + ep.address.byteLength + ep.rkey.byteLength + ep.fenceRkey.byteLength + 4);
  buf.writeUInt32LE(MAGIC, 0);
  buf.writeUInt32LE(ep.epoch, 4);
  buf.writeBigUInt64LE(ep.base, 8);
  buf.writeBigUInt64LE(BigInt(ep.length), 16);
  buf.writeBigUInt64LE(ep.fence, 24);
  buf.writeUInt32LE(ep.address.byteLength, 32);
  buf.writeUInt32LE(ep.rkey.byteLength, 36);
  buf.writeUInt32LE(ep.fenceRkey.byteLength, 40);
  buf.set(ep.address, HEAD);
  buf.set(ep.rkey, HEAD + ep.address.byteLength);
  buf.set(ep.fenceRkey, HEAD + ep.address.byteLength + ep.rkey.byteLength);
  const end = buf.byteLength - 4;
  buf.writeUInt32LE(crc32c(buf.subarray(0, end)), end);
  return buf.toString("base64");
}

/** The endpoint in `text`, or a sentence saying what is wrong with it. */
export function decodeUcxEndpoint(text: unknown): UcxEndpoint | string {
  if (typeof text !== "string" || text.length < 8 || text.length > MAX_TEXT || !BASE64.test(text)) return "not a base64 UCX endpoint of a sane size";
  const buf = Buffer.from(text, "base64");
  if (buf.byteLength < HEAD + 3 + 4) return `${buf.byteLength} bytes is too short`;
  if (buf.readUInt32LE(0) !== MAGIC) return "wrong magic";
  const end = buf.byteLength - 4;
  if (crc32c(buf.subarray(0, end)) !== buf.readUInt32LE(end)) return "checksum mismatch";
  const addressLength = buf.readUInt32LE(32);
  const rkeyLength = buf.readUInt32LE(36);
  const fenceRkeyLength = buf.readUInt32LE(40);
  const inBounds = (n: number, max: number) => n >= 1 && n <= max;
  if (!inBounds(addressLength, MAX_UCX_ADDRESS) || !inBounds(rkeyLength, MAX_UCX_RKEY) || !inBounds(fenceRkeyLength, MAX_UCX_RKEY)) {
    return "address or rkey length out of bounds";
  }
  if (HEAD + addressLength + rkeyLength + fenceRkeyLength !== end) return "lengths do not add up to the envelope";
  const epoch = buf.readUInt32LE(4);
  const base = buf.readBigUInt64LE(8);
  const length = buf.readBigUInt64LE(16);
  const fence = buf.readBigUInt64LE(24);
  if (epoch < 1) return "epoch 0";
  if (fence === 0n || fence % 8n !== 0n) return "misaligned epoch word";
  if (length < 1n || length > BigInt(Number.MAX_SAFE_INTEGER) || base === 0n || base + length > 0xffffffffffffffffn) return "mapped range out of bounds";
  return {
    epoch,
    base,
    length: Number(length),
    fence,
    address: buf.subarray(HEAD, HEAD + addressLength),
    rkey: buf.subarray(HEAD + addressLength, HEAD + addressLength + rkeyLength),
    fenceRkey: buf.subarray(HEAD + addressLength + rkeyLength, end),
  };
}
