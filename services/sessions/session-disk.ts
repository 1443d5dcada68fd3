// The disk tier of parked sessions (session-store.ts): a session moved out of memory is written to
// a local directory as KV chunks in the shards' format (docs/kv-format.md: every chunk checksummed,
// the global layers from token 0 and the sliding-window layers' last window, blocks of
// `blockTokens` tokens: seq-io.ts heldChunks), with a JSON record beside it naming its key, its
// tokens and rounds. The next turn reads it back, checking every chunk; a restarted decode lists
// the directory and serves what is there. Bounded by a byte quota: a session that would go over it
// is refused (the store then drops it). Files are 0600 in a 0700 directory: they hold prompts' KV
// in clear, so the directory must be the service's own.
import { createHash } from "node:crypto";
import { mkdir, open, readdir, readFile, rename, stat, unlink, writeFile } from "node:fs/promises";
import path from "node:path";
import type { NativeSequence } from "../../shared/inference/engine/native.ts";
import {
  chunkByteLength,
  chunkHeaderSize,
  decodeChunkHeader,
  exportChunk,
  heldChunks,
  heldParts,
  importVerifiedChunk,
  type ChunkMeta,
  type KvShape,
} from "../handoff/index.ts";

/** What a spilled session's record holds (the KV itself is in its .kv file). */
export interface DiskSession {
  tenant: string;
  id: string;
  tokens: Int32Array;
  roundStarts: number[];
  roundHashes: string[];
  turns: number;
  createdAt: number;
  lastUsedAt: number;
}

const RECORD_VERSION = 1;

export class SessionDisk {
  private bytesUsed: number | undefined;

  constructor(
    readonly dir: string,
    /** Bytes all files together may take. */
    readonly quotaBytes: number,
    private readonly shape: KvShape,
    /** The model's fingerprint: chunks of another model are refused. */
    private readonly fingerprint: string,
    private readonly blockTokens: number,
  ) {}

  /** Bytes the session files take now. */
  async used(): Promise<number> {
    if (this.bytesUsed === undefined) {
      await this.ensureDir();
      let total = 0;
      for (const name of await readdir(this.dir)) {
        if (!name.endsWith(".kv")) continue;
        total += (await stat(path.join(this.dir, name)).catch(() => ({ size: 0 }))).size;
      }
      this.bytesUsed = total;
    }
    return this.bytesUsed;
  }

  /** Writes `seq`'s first `s.tokens.length` tokens and the record; throws when over the quota. */
  async save(s: DiskSession, seq: NativeSequence): Promise<void> {
    const n = s.tokens.length;
    const metas = heldChunks(this.shape, n, this.blockTokens).map((c): ChunkMeta => ({ ...this.meta(), ...c }));
    const size = metas.reduce((sum, m) => sum + chunkByteLength(m), 0);
    if ((await this.used()) + size > this.quotaBytes) {
      throw new Error(`the session disk tier holds ${this.bytesUsed} of ${this.quotaBytes} bytes; this session needs ${size}`);
    }
    const base = this.base(s.tenant, s.id);
    const buf = new Uint8Array(Math.max(...metas.map(chunkByteLength)));
    const fh = await open(`${base}.kv.tmp`, "w", 0o600);
    try {
      for (const m of metas) {
        const len = exportChunk(buf, m, seq, this.shape);
        await fh.write(buf, 0, len);
      }
      await fh.sync();
    } finally {
      await fh.close();
    }
    const record = {
      version: RECORD_VERSION,
      tenant: s.tenant,
      id: s.id,
      tokens: Buffer.from(s.tokens.buffer, s.tokens.byteOffset, s.tokens.byteLength).toString("base64"),
      roundStarts: s.roundStarts,
      roundHashes: s.roundHashes,
      turns: s.turns,
      createdAt: s.createdAt,
      lastUsedAt: s.lastUsedAt,
      bytes: size,
    };
    await writeFile(`${base}.json.tmp`, JSON.stringify(record), { mode: 0o600 });
    // The KV first, then the record that names it: a crash leaves at most an unnamed .kv file.
    await rename(`${base}.kv.tmp`, `${base}.kv`);
    await rename(`${base}.json.tmp`, `${base}.json`);
    this.bytesUsed = (this.bytesUsed ?? 0) + size;
  }

  /** Reads the session's KV into `seq` (empty, with room for `nTokens`), checking every chunk, and declares its length. */
  async load(tenant: string, id: string, seq: NativeSequence, nTokens: number): Promise<void> {
    const fh = await open(`${this.base(tenant, id)}.kv`, "r");
    try {
      const headerSize = chunkHeaderSize(this.shape.nLayer);
      let buf = new Uint8Array(headerSize);
      let at = 0;
      // The chunks as save() wrote them: each part of the layers (global, sliding), in token order.
      for (const { layerIds, tokenStart } of heldParts(this.shape, nTokens)) {
        let next = tokenStart;
        while (next < nTokens) {
          const { bytesRead } = await fh.read(buf, 0, headerSize, at);
          if (bytesRead !== headerSize) throw new Error(`session ${id}: its KV file ends at byte ${at + bytesRead}, before token ${next}`);
          const header = decodeChunkHeader(buf.subarray(0, headerSize));
          const total = header.headerSize + header.payloadLength;
          if (buf.byteLength < total) {
            const bigger = new Uint8Array(total);
            bigger.set(buf.subarray(0, headerSize));
            buf = bigger;
          }
          const rest = await fh.read(buf, headerSize, total - headerSize, at + headerSize);
          if (rest.bytesRead !== total - headerSize)
            throw new Error(`session ${id}: its KV file is truncated at byte ${at + headerSize + rest.bytesRead}`);
          importVerifiedChunk(
            buf.subarray(0, total),
            { fingerprint: this.fingerprint, tokenStart: next, layerIds, dtype: "f16" },
            seq,
            this.shape,
          );
          next += header.tokenCount;
          at += total;
        }
        if (next !== nTokens)
          throw new Error(`session ${id}: its KV file holds ${next} tokens of layers ${layerIds[0]}.., the record ${nTokens}`);
      }
      seq.setLength(nTokens);
    } finally {
      await fh.close();
    }
  }

  async remove(tenant: string, id: string): Promise<void> {
    const base = this.base(tenant, id);
    const size = (await stat(`${base}.kv`).catch(() => undefined))?.size ?? 0;
    for (const f of [`${base}.json`, `${base}.kv`])
      await unlink(f).catch((e: NodeJS.ErrnoException) => (e.code === "ENOENT" ? undefined : Promise.reject(e)));
    if (this.bytesUsed !== undefined) this.bytesUsed = Math.max(0, this.bytesUsed - size);
  }

  /** The sessions on disk (a restart adopts them). A record that cannot be read is removed with its file. */
  async list(): Promise<DiskSession[]> {
    await this.ensureDir();
    const out: DiskSession[] = [];
    for (const name of await readdir(this.dir)) {
      if (!name.endsWith(".json")) continue;
      const file = path.join(this.dir, name);
      try {
        const r = JSON.parse(await readFile(file, "utf8")) as Record<string, unknown>;
        const raw = Buffer.from(String(r.tokens), "base64");
        const ok =
          r.version === RECORD_VERSION &&
          typeof r.tenant === "string" &&
          typeof r.id === "string" &&
          raw.byteLength % 4 === 0 &&
          Array.isArray(r.roundStarts) &&
          Array.isArray(r.roundHashes) &&
          typeof r.lastUsedAt === "number" &&
          this.base(r.tenant, r.id) === file.slice(0, -".json".length);
        if (!ok) throw new Error("malformed record");
        const tokens = new Int32Array(raw.buffer.slice(raw.byteOffset, raw.byteOffset + raw.byteLength));
        out.push({
          tenant: r.tenant as string,
          id: r.id as string,
          tokens,
          roundStarts: r.roundStarts as number[],
          roundHashes: r.roundHashes as string[],
          turns: Number(r.turns) || 1,
          createdAt: Number(r.createdAt) || 0,
          lastUsedAt: r.lastUsedAt as number,
        });
      } catch {
        await unlink(file).catch(() => {});
        await unlink(`${file.slice(0, -".json".length)}.kv`).catch(() => {});
      }
    }
    this.bytesUsed = undefined; // recounted on the next use
    return out;
  }

  private meta(): Omit<ChunkMeta, "tokenStart" | "tokenCount" | "layerIds"> {
    return { fingerprint: this.fingerprint, dtype: "f16", hkv: this.shape.hkv, headDim: this.shape.headDim };
  }

  /** The file path without extension: a hash of the key, so no tenant or id reaches the file system as text. */
  private base(tenant: string, id: string): string {
    return path.join(this.dir, createHash("sha256").update(`${tenant}\u0000${id}`).digest("hex").slice(0, 40));
  }

  private async ensureDir(): Promise<void> {
    await mkdir(this.dir, { recursive: true, mode: 0o700 });
  }
}
