// Deterministic chunk keys: the same model, the same token prefix and the same layers give the
// same key, so re-prefills are idempotent and requests sharing a prefix share its chunks.
//
// key = hex sha256 of, in order:
//   "ctxbank/chunk-key/v1\0", fingerprint (32 bytes), dtype (u8), layout version (u16),
//   every token of the prefix [0, tokenEnd) as u32 LE,
//   tokenStart (u32), tokenEnd (u32), each layer id (u16), layer count (u16).
// With a tenant salt (API key id, shared/platform/auth/tenant.ts) the domain is "ctxbank/chunk-key/v1+salt\0"
// followed by the salt's length (u16) and UTF-8 bytes, so tenants never share a key (or a chunk)
// for the same prefix; without one the key is exactly the unsalted v1 key.
// Read from the end, the trailer fixes the layer count, the ids and tokenEnd, and so where the
// token list ends: the encoding is injective, so different chunks never share a key by layout.
// The prefix comes first so that PrefixHasher can hash a long prompt once, block by block
// (O(n) instead of O(n²) for n blocks), and still give exactly the key of the whole prefix.
import { createHash, type Hash } from "node:crypto";
import { ChunkError, DTYPE_CODE, LAYOUT_VERSION, fingerprintBytes, type KvDtype } from "./chunk.ts";

const DOMAIN = Buffer.from("ctxbank/chunk-key/v1\0", "latin1");
const SALTED_DOMAIN = Buffer.from("ctxbank/chunk-key/v1+salt\0", "latin1");

export class PrefixHasher {
  private readonly hash: Hash;
  private tokens = 0;

  constructor(fingerprint: string, options: { dtype?: KvDtype; layoutVersion?: number; salt?: string | undefined } = {}) {
    const { dtype = "f16", layoutVersion = LAYOUT_VERSION, salt } = options;
    if (!(dtype in DTYPE_CODE)) throw new ChunkError("invalid_meta", `unknown dtype "${dtype}"`);
    const head = Buffer.alloc(3);
    head.writeUInt8(DTYPE_CODE[dtype], 0);
    head.writeUInt16LE(layoutVersion, 1);
    this.hash = createHash("sha256").update(salt === undefined ? DOMAIN : SALTED_DOMAIN);
    if (salt !== undefined) {
      const bytes = Buffer.from(salt, "utf8");
      if (bytes.length === 0 || bytes.length > 0xffff) throw new ChunkError("invalid_meta", "a chunk key salt must be 1..65535 bytes");
      const len = Buffer.alloc(2);
      len.writeUInt16LE(bytes.length, 0);
      this.hash.update(len).update(bytes);
    }
    this.hash.update(fingerprintBytes(fingerprint)).update(head);
  }

  /** Number of tokens hashed so far: the end of the prefix the next key covers. */
  get length(): number {
    return this.tokens;
  }

  /** Appends tokens (u32 ids) to the prefix. */
  push(tokens: ArrayLike<number>): this {
    const bytes = Buffer.alloc(4 * tokens.length);
    for (let i = 0; i < tokens.length; i++) {
      const t = tokens[i]!;
      if (!Number.isInteger(t) || t < 0 || t > 0xffff_ffff) {
        throw new ChunkError("invalid_meta", `token id at ${this.tokens + i} is not a u32: ${t}`);
      }
      bytes.writeUInt32LE(t, 4 * i);
    }
    this.hash.update(bytes);
    this.tokens += tokens.length;
    return this;
  }

  /** Key of the chunk covering tokens [tokenStart, length) of `layerIds` after this prefix. */
  keyFor(tokenStart: number, layerIds: readonly number[]): string {
    if (!Number.isInteger(tokenStart) || tokenStart < 0 || tokenStart >= this.tokens) {
      throw new ChunkError("invalid_meta", `tokenStart ${tokenStart} must be in [0, ${this.tokens})`);
    }
    if (layerIds.length < 1 || layerIds.length > 0xffff) throw new ChunkError("invalid_meta", "a chunk needs 1..65535 layers");
    const trailer = Buffer.alloc(8 + 2 * layerIds.length + 2);
    trailer.writeUInt32LE(tokenStart, 0);
    trailer.writeUInt32LE(this.tokens, 4);
    layerIds.forEach((id, i) => {
      if (!Number.isInteger(id) || id < 0 || id > 0xffff || (i > 0 && id <= layerIds[i - 1]!)) {
        throw new ChunkError("invalid_meta", `layer ids must be strictly increasing u16, got ${layerIds.join(",")}`);
      }
      trailer.writeUInt16LE(id, 8 + 2 * i);
    });
    trailer.writeUInt16LE(layerIds.length, 8 + 2 * layerIds.length);
    return this.hash.copy().update(trailer).digest("hex");
  }
}

/** Key of the chunk covering [tokenStart, prefixTokens.length) of `layerIds`. */
export function chunkKey(input: {
  fingerprint: string;
  prefixTokens: ArrayLike<number>;
  tokenStart: number;
  layerIds: readonly number[];
  dtype?: KvDtype;
  layoutVersion?: number;
  salt?: string;
}): string {
  return new PrefixHasher(input.fingerprint, input).push(input.prefixTokens).keyFor(input.tokenStart, input.layerIds);
}
