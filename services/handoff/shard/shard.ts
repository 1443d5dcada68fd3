// A shard: one file of fixed size in a tmpfs directory (host memory), owned by one prefill
// process for one epoch, with a range allocator for the chunks written into it. Being a file,
// a co-located decode can open it by path, and a restarted owner finds (and removes) the old one.
import { open, readdir, statfs, unlink, type FileHandle } from "node:fs/promises";
import path from "node:path";
import { mapFile, punchHole } from "../../../shared/inference/engine/native.ts";
import { defaultShardDir } from "../../../shared/platform/shard-root.ts";
import { RangeAllocator } from "./range-allocator.ts";
import { removeOrphanShards, removeOwnerMark, writeOwnerMark } from "./owner-mark.ts";
import { ensureShardDir, fileIdentity } from "./shard-dir.ts";

/** Shard ids become file names and URL path segments: no slashes, no leading dot. */
export const SHARD_ID_PATTERN = /^[A-Za-z0-9][A-Za-z0-9._:-]{0,127}$/;
const FILE_PATTERN = new RegExp(`^(${SHARD_ID_PATTERN.source.slice(1, -1)})\\.e([1-9][0-9]{0,9})\\.shard$`);

export interface ShardOptions {
  shardId: string; // stable across restarts; the registry's shard id
  epoch: number; // from the registry (ShardStore.create)
  sizeBytes: number; // rounded up to the alignment
  dir?: string; // default: defaultShardDir()
  alignment?: number; // default 4096
}

export function shardFileName(shardId: string, epoch: number): string {
  const name = `${shardId}.e${epoch}.shard`;
  if (!FILE_PATTERN.test(name)) throw new RangeError(`invalid shard id "${shardId}" or epoch ${epoch}`);
  return name;
}

export function parseShardFileName(name: string): { shardId: string; epoch: number } | null {
  const m = FILE_PATTERN.exec(name);
  return m ? { shardId: m[1]!, epoch: Number(m[2]) } : null;
}

/** Deletes this shard id's files in `dir` (all epochs, or all but `except`); returns their paths. */
export async function removeShardFiles(dir: string, shardId: string, except?: number): Promise<string[]> {
  const names = await readdir(dir).catch((e: NodeJS.ErrnoException) => (e.code === "ENOENT" ? [] : Promise.reject(e)));
  const stale = names.filter((n) => {
    const parsed = parseShardFileName(n);
    return parsed?.shardId === shardId && parsed.epoch !== except;
  });
  const paths = stale.map((n) => path.join(dir, n));
  // Readers that still have a file open keep its pages until they close it.
  await Promise.all(paths.map((p) => unlink(p).catch((e: NodeJS.ErrnoException) => (e.code === "ENOENT" ? undefined : Promise.reject(e)))));
  await Promise.all(paths.map(removeOwnerMark));
  return paths;
}

/** Deletes the shard files in `dir` whose owning process is gone (owner-mark.ts); returns their paths. */
export function removeOrphanShardFiles(dir: string): Promise<string[]> {
  return removeOrphanShards(dir, (name) => parseShardFileName(name) !== null);
}

export class Shard {
  private readonly ranges: RangeAllocator;
  private closed = false;
  /** Cleared when the file system cannot punch holes (freed pages then stay until the file goes). */
  private punching = true;
  private mapping: ArrayBuffer | undefined; // view()'s

  private constructor(
    readonly shardId: string,
    readonly epoch: number,
    readonly path: string,
    readonly sizeBytes: number,
    private readonly file: FileHandle,
    alignment: number,
    /** "device:inode" of the file: what the registry records, so readers map only this file. */
    readonly fileId: string,
  ) {
    this.ranges = new RangeAllocator(sizeBytes, alignment);
  }

  /** Creates the epoch's file (removing any earlier file of this shard id) at its full size. */
  static async create(options: ShardOptions): Promise<Shard> {
    const { shardId, epoch, dir = defaultShardDir(), alignment = 4096 } = options;
    const name = shardFileName(shardId, epoch);
    if (!Number.isSafeInteger(options.sizeBytes) || options.sizeBytes < 1) {
      throw new RangeError(`shard size must be a positive integer, got ${options.sizeBytes}`);
    }
    const sizeBytes = Math.ceil(options.sizeBytes / alignment) * alignment;
    await ensureShardDir(dir);
    // A file of this shard id is left over from an earlier life (a crash, or an embedded database
    // that restarted its epochs); nobody can rely on its contents. Remove it before measuring the
    // free space: after a crash its pages still fill the tmpfs (a pod's /dev/shm survives a
    // container restart), and the restarted process would never fit.
    await removeShardFiles(dir, shardId);
    // And those of any owner that died (under another shard id: a restart on another port).
    await removeOrphanShardFiles(dir);
    const fs = await statfs(dir);
    const available = fs.bavail * fs.bsize;
    if (sizeBytes > available) {
      throw new RangeError(`shard of ${sizeBytes} bytes does not fit in ${dir} (${available} bytes free)`);
    }
    const filePath = path.join(dir, name);
    const file = await open(filePath, "wx+", 0o600);
    try {
      await file.truncate(sizeBytes); // sparse on tmpfs: pages are committed as chunks are written
      await writeOwnerMark(filePath);
      return new Shard(shardId, epoch, filePath, sizeBytes, file, alignment, await fileIdentity(file));
    } catch (err) {
      await file.close();
      await removeOwnerMark(filePath);
      // The file was made just now by this call (wx); one that is gone already needs nothing.
      await unlink(filePath).catch((e: NodeJS.ErrnoException) =>
        e.code === "ENOENT"
          ? undefined
          : Promise.reject(new AggregateError([err, e], `could not remove ${filePath} after failing to create it`)),
      );
      throw err;
    }
  }

  /** Reserves a range for a chunk of `length` bytes; null when the shard is full. */
  alloc(length: number): number | null {
    return this.ranges.alloc(length);
  }

  /**
   * Frees the range starting at `offset` (as returned by the registry reaper) and returns its
   * pages to the system: without that, a tmpfs shard keeps every page it ever wrote.
   */
  free(offset: number): number {
    const length = this.ranges.free(offset);
    if (this.punching && !this.closed) {
      try {
        this.punching = punchHole(this.file.fd, offset, length);
      } catch (err) {
        this.punching = false;
        process.emitWarning(`cannot return freed pages of shard ${this.path}: ${(err as Error).message}`, { code: "CTXBANK_PUNCH_HOLE" });
      }
    }
    return length;
  }

  /** The length of the allocation that starts at `offset`, if one does. */
  allocatedAt(offset: number): number | undefined {
    return this.ranges.lengthAt(offset);
  }

  /** Whether [offset, offset + length) lies inside one allocated range. */
  holds(offset: number, length: number): boolean {
    return this.ranges.contains(offset, length);
  }

  get bytesUsed(): number {
    return this.ranges.bytesUsed;
  }
  get bytesFree(): number {
    return this.ranges.bytesFree;
  }
  get largestFree(): number {
    return this.ranges.largestFree;
  }

  /** Writes `data` at `offset`, which must lie inside one allocated range. */
  async write(offset: number, data: Uint8Array): Promise<void> {
    this.assertOpen();
    if (!this.holds(offset, data.byteLength)) {
      throw new RangeError(`write of ${data.byteLength} bytes at ${offset} is outside any allocated range`);
    }
    let done = 0;
    while (done < data.byteLength) {
      const { bytesWritten } = await this.file.write(data, done, data.byteLength - done, offset + done);
      done += bytesWritten;
    }
  }

  /** Reads `into.byteLength` bytes at `offset` (a plain copy out of the shard's pages). */
  async read(offset: number, into: Uint8Array): Promise<void> {
    this.assertOpen();
    if (!Number.isSafeInteger(offset) || offset < 0 || offset + into.byteLength > this.sizeBytes) {
      throw new RangeError(`read of ${into.byteLength} bytes at ${offset} is outside the shard (${this.sizeBytes} bytes)`);
    }
    let done = 0;
    while (done < into.byteLength) {
      const { bytesRead } = await this.file.read(into, done, into.byteLength - done, offset + done);
      if (bytesRead === 0) throw new Error(`shard file ${this.path} ended early at ${offset + done}`);
      done += bytesRead;
    }
  }

  /**
   * The bytes at [offset, offset + length) in place: a view of one read-only mapping of the whole
   * file, made on first use, whose pages come in as they are touched. For sending a chunk without
   * copying it first (services/handoff/chunk-route.ts). A view keeps the mapping alive after
   * close() (it goes at garbage collection), so a send in flight never faults; punched ranges
   * read as zeros.
   */
  view(offset: number, length: number): Uint8Array {
    this.assertOpen();
    if (!Number.isSafeInteger(offset) || !Number.isSafeInteger(length) || offset < 0 || length < 0 || offset + length > this.sizeBytes) {
      throw new RangeError(`view of ${length} bytes at ${offset} is outside the shard (${this.sizeBytes} bytes)`);
    }
    this.mapping ??= mapFile(this.path, 0, this.sizeBytes, this.fileId, false); // this very file, not one swapped in at the path
    return new Uint8Array(this.mapping, offset, length);
  }

  async close(): Promise<void> {
    if (this.closed) return;
    this.closed = true;
    this.mapping = undefined; // unmapped when the last view is collected
    await this.file.close();
  }

  /** Closes and deletes the file (a graceful shutdown; a crash leaves it for the next epoch to remove). */
  async destroy(): Promise<void> {
    await this.close();
    await unlink(this.path).catch((e: NodeJS.ErrnoException) => (e.code === "ENOENT" ? undefined : Promise.reject(e)));
    await removeOwnerMark(this.path);
  }

  private assertOpen(): void {
    if (this.closed) throw new Error(`shard ${this.shardId} epoch ${this.epoch} is closed`);
  }
}
