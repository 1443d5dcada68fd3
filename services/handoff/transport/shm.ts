// Same-host transport: the chunk's bytes straight out of the owner's shard file (tmpfs pages).
// viewChunk gives the chunk's range of the shard file's mapping (native mmap, one per file, kept
// by ShardMaps): the decode verifies and imports from the owner's own pages, so the only copy is
// the one into the cache. readChunk copies into the caller's buffer, for callers that need their
// own bytes.
import { open, type FileHandle } from "node:fs/promises";
import path from "node:path";
import type { Logger } from "pino";
import { parseShardFileName } from "../shard/shard.ts";
import { TransportError, chunkLabel } from "./errors.ts";
import { checkLocation, checkReadArgs, withDeadline } from "./read-checks.ts";
import { ShardMaps } from "./shard-maps.ts";
import type { ChunkLocation, ChunkView, KvTransport, ReadChunkOptions } from "./types.ts";

export interface ShmTransportOptions {
  /** Shard files are only opened inside these directories (the registry's paths are not trusted blindly). */
  allowedDirs: string[];
  /** Bytes per read call; the deadline and abort are checked between pieces. */
  pieceBytes?: number;
  /**
   * Refuse locations without the registered file identity (`fileId`). The services set it: a
   * file is read only when it is the very file (device:inode) its owner created and registered.
   */
  requireFileId?: boolean;
  /** Where a shard file that cannot be closed or checked is reported. */
  log?: Pick<Logger, "warn">;
}

interface OpenFile {
  path: string;
  handle: Promise<FileHandle>;
  users: number;
  dropped: boolean; // no longer cached; closed when its last user is done
}

export class ShmTransport implements KvTransport {
  readonly name = "shm";
  private readonly files = new Map<string, OpenFile>();
  private readonly maps = new ShardMaps();
  private readonly allowedDirs: string[];
  private readonly pieceBytes: number;
  private readonly requireFileId: boolean;
  private readonly log: Pick<Logger, "warn"> | undefined;

  constructor(options: ShmTransportOptions) {
    if (options.allowedDirs.length === 0) throw new TypeError("ShmTransport needs at least one allowed directory");
    this.allowedDirs = options.allowedDirs.map((d) => path.resolve(d));
    this.pieceBytes = options.pieceBytes ?? 8 << 20;
    this.requireFileId = options.requireFileId ?? false;
    this.log = options.log;
  }

  async readChunk(loc: ChunkLocation, into: Uint8Array, opts: ReadChunkOptions): Promise<number> {
    checkReadArgs(loc, into, opts);
    this.checkPath(loc);
    return withDeadline(loc, opts, async (signal) => {
      const entry = this.acquire(loc.shardPath);
      try {
        const file = await openedOrThrow(entry, loc);
        const st = await file.stat({ bigint: true });
        if (loc.fileId && `${st.dev}:${st.ino}` !== loc.fileId) {
          this.drop(entry);
          throw fileMismatch(loc, `${st.dev}:${st.ino}`);
        }
        if (st.nlink === 0n) {
          // The owner restarted and removed the file; our handle would still see the old pages.
          this.drop(entry);
          throw staleEpoch(loc);
        }
        if (BigInt(loc.offset + loc.length) > st.size) {
          throw new TransportError("out_of_range", `${chunkLabel(loc)} lies outside the ${st.size}-byte shard`);
        }
        let done = 0;
        while (done < loc.length && !signal.aborted) {
          const n = Math.min(this.pieceBytes, loc.length - done);
          const { bytesRead } = await file.read(into, done, n, loc.offset + done);
          if (bytesRead === 0) throw new TransportError("short_read", `${chunkLabel(loc)}: file ended after ${done} bytes`);
          done += bytesRead;
        }
        return done;
      } finally {
        this.release(entry);
      }
    });
  }

  async viewChunk(loc: ChunkLocation): Promise<ChunkView> {
    checkLocation(loc);
    this.checkPath(loc);
    try {
      return await this.maps.view(loc.shardPath, loc.offset, loc.length, loc.fileId ?? undefined);
    } catch (err) {
      const { code, message } = err as NodeJS.ErrnoException;
      // A missing file means its owner restarted (the epoch is in the file name).
      if (code === "ENOENT") throw staleEpoch(loc);
      if (code === "ESTALE") throw new TransportError("file_mismatch", `${chunkLabel(loc)}: ${message}`, undefined, { cause: err });
      throw new TransportError(code === "ERANGE" ? "out_of_range" : "io_error", `${chunkLabel(loc)}: ${message}`, undefined, {
        cause: err,
      });
    }
  }

  async close(): Promise<void> {
    this.maps.close();
    const entries = [...this.files.values()];
    this.files.clear();
    await Promise.all(entries.map((e) => this.closeFile(e)));
  }

  private checkPath(loc: ChunkLocation): void {
    if (this.requireFileId && !loc.fileId) {
      throw new TransportError(
        "file_mismatch",
        `${chunkLabel(loc)}: the registry has no file identity for ${loc.shardPath}; it is not read over shm`,
      );
    }
    const file = path.resolve(loc.shardPath ?? "");
    const parsed = parseShardFileName(path.basename(file));
    if (!this.allowedDirs.includes(path.dirname(file)) || !parsed || parsed.shardId !== loc.shardId) {
      throw new TransportError(
        "invalid_request",
        `${chunkLabel(loc)}: ${loc.shardPath} is not a shard file of ${loc.shardId} in an allowed directory`,
      );
    }
    if (parsed.epoch !== loc.epoch) throw staleEpoch(loc);
  }

  private acquire(filePath: string): OpenFile {
    let entry = this.files.get(filePath);
    if (!entry) {
      entry = { path: filePath, handle: open(filePath, "r"), users: 0, dropped: false };
      const created = entry;
      created.handle.catch(() => this.drop(created));
      this.files.set(filePath, entry);
      this.dropRemovedFiles(); // a new shard file often means an older one was retired
    }
    entry.users++;
    return entry;
  }

  private release(entry: OpenFile): void {
    entry.users--;
    if (entry.dropped && entry.users === 0) void this.closeFile(entry);
  }

  private drop(entry: OpenFile): void {
    if (this.files.get(entry.path) === entry) this.files.delete(entry.path);
    if (entry.dropped) return;
    entry.dropped = true;
    if (entry.users === 0) void this.closeFile(entry);
  }

  /** Closes an entry's file; a failed close is logged. */
  private closeFile(entry: OpenFile): Promise<void> {
    return entry.handle.then(
      (fh) => fh.close().catch((err: unknown) => this.log?.warn({ err, path: entry.path }, "could not close a shard file")),
      () => undefined, // the open failed: its readers got that error (openedOrThrow) and acquire() dropped the entry
    );
  }

  /** Drops idle handles of deleted shard files: an open handle keeps a whole shard's memory alive. */
  private dropRemovedFiles(): void {
    for (const entry of this.files.values()) {
      if (entry.users > 0) continue;
      void entry.handle
        .then((fh) => fh.stat())
        .then(
          (st) => st.nlink === 0 && this.drop(entry),
          (err: unknown) => {
            // A failed open was dropped already (acquire); a failed stat keeps the handle for now.
            if (!entry.dropped) this.log?.warn({ err, path: entry.path }, "could not check whether a shard file was removed");
          },
        );
    }
  }
}

async function openedOrThrow(entry: OpenFile, loc: ChunkLocation): Promise<FileHandle> {
  try {
    return await entry.handle;
  } catch (err) {
    const code = (err as NodeJS.ErrnoException).code;
    if (code === "ENOENT") throw staleEpoch(loc);
    throw new TransportError("io_error", `${chunkLabel(loc)}: cannot open ${loc.shardPath}: ${code ?? err}`, undefined, { cause: err });
  }
}

function fileMismatch(loc: ChunkLocation, found: string): TransportError {
  return new TransportError(
    "file_mismatch",
    `${chunkLabel(loc)}: ${loc.shardPath} is ${found} (device:inode), not the registered ${loc.fileId}`,
  );
}

function staleEpoch(loc: ChunkLocation): TransportError {
  return new TransportError("stale_epoch", `${chunkLabel(loc)}: the shard's epoch ${loc.epoch} is gone (its owner restarted)`);
}
