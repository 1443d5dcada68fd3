// The shm reader's mappings: one per shard file, kept across chunks and loads, so a chunk costs a
// stat of the path and the population of its own pages rather than an mmap and a munmap. Each
// view still checks the path's file identity and size first. A mapping goes when its file is gone
// or replaced (found by a view, by a new mapping, or by a check every few seconds while it is idle:
// a mapping keeps a removed file's memory alive) and on close. It is kept while its file lives
// because making one costs more than an mmap: V8 counts the whole file as external memory and may
// collect garbage at once. Views are ranges of the one mapping; unmapping it detaches them all,
// and that waits for the last view to be released.
import { statSync } from "node:fs";
import { mapFile, populateMapped, unmapFile } from "../../../shared/inference/engine/native.ts";

export interface MappedRange {
  readonly bytes: Uint8Array;
  release(): void;
}

interface ShardMap {
  path: string;
  fileId: string; // device:inode of the file mapped
  size: number;
  buffer: ArrayBuffer;
  users: number; // views not yet released
  dropped: boolean; // no longer handed out; unmapped once users is 0
  idle: NodeJS.Timeout | undefined; // the check for a removed file while no view is out
}

/** Errors carry mapFile's codes: ENOENT (no file at the path), ESTALE (not the expected file), ERANGE. */
function mapError(code: string, message: string): NodeJS.ErrnoException {
  return Object.assign(new Error(message), { code });
}

export class ShardMaps {
  private readonly byPath = new Map<string, ShardMap>();

  constructor(private readonly checkMs = 5_000) {}

  /**
   * Bytes [offset, offset + length) of the file at `path`, which must be `expectId`
   * (device:inode) when given, its pages mapped in. release() the range when done with it.
   */
  async view(path: string, offset: number, length: number, expectId?: string): Promise<MappedRange> {
    const map = this.mapFor(path, offset + length, expectId);
    map.users++;
    clearTimeout(map.idle);
    let released = false;
    const release = () => {
      if (released) return;
      released = true;
      this.unuse(map);
    };
    try {
      // On a worker thread: the caller imports another chunk meanwhile.
      await populateMapped(map.buffer, offset, length);
    } catch (err) {
      release();
      throw err;
    }
    return { bytes: new Uint8Array(map.buffer, offset, length), release };
  }

  /** Unmaps every mapping (each once its views are released). */
  close(): void {
    for (const map of [...this.byPath.values()]) this.drop(map);
  }

  /** The live mapping of the file now at `path`, checked and made if need be. */
  private mapFor(path: string, end: number, expectId: string | undefined): ShardMap {
    const st = statSync(path, { bigint: true, throwIfNoEntry: false });
    let map = this.byPath.get(path);
    const fileId = st && `${st.dev}:${st.ino}`;
    if (map && map.fileId !== fileId) {
      this.drop(map); // the file was removed or replaced: its old pages are nobody's to read
      map = undefined;
    }
    if (!st) throw mapError("ENOENT", `cannot map ${path}: no such file`);
    if (expectId !== undefined && fileId !== expectId) {
      throw mapError("ESTALE", `cannot map ${path}: the file is ${fileId} (device:inode), not the registered ${expectId}`);
    }
    if (end > Number(st.size)) throw mapError("ERANGE", `cannot map ${path}: bytes up to ${end} lie outside the ${st.size}-byte file`);
    if (map && end > map.size) {
      this.drop(map); // the file grew past the mapping
      map = undefined;
    }
    if (!map) {
      this.dropRemoved(); // a new file often means an older one was retired
      // The whole file, no pages yet; mapFile checks the identity again on the descriptor it maps.
      const size = Number(st.size);
      map = { path, fileId: fileId!, size, buffer: mapFile(path, 0, size, fileId, false), users: 0, dropped: false, idle: undefined };
      this.byPath.set(path, map);
    }
    return map;
  }

  private unuse(map: ShardMap): void {
    map.users--;
    if (map.users > 0) return;
    if (map.dropped) unmapFile(map.buffer);
    else this.checkLater(map);
  }

  private checkLater(map: ShardMap): void {
    map.idle = setTimeout(() => {
      if (map.dropped || map.users > 0) return;
      if (this.removed(map)) this.drop(map);
      else this.checkLater(map);
    }, this.checkMs).unref();
  }

  private removed(map: ShardMap): boolean {
    const st = statSync(map.path, { bigint: true, throwIfNoEntry: false });
    return !st || `${st.dev}:${st.ino}` !== map.fileId;
  }

  private drop(map: ShardMap): void {
    if (this.byPath.get(map.path) === map) this.byPath.delete(map.path);
    if (map.dropped) return;
    map.dropped = true;
    clearTimeout(map.idle);
    if (map.users === 0) unmapFile(map.buffer);
  }

  /** Drops the mappings of files that were removed or replaced since they were mapped. */
  private dropRemoved(): void {
    for (const map of [...this.byPath.values()]) if (this.removed(map)) this.drop(map);
  }
}
