// The shard directory and files as a trust boundary (issue 10, crash cleanup and smaller items):
// a directory someone else created or can write is refused; a shm reader maps only the file the
// owner registered (a file planted at its path is refused, before and after mapping); freed
// ranges give their tmpfs pages back.
import { existsSync } from "node:fs";
import { chmod, chown, lstat, mkdir, mkdtemp, rename, rm, stat, symlink, writeFile } from "node:fs/promises";
import os from "node:os";
import path from "node:path";
import { afterEach, beforeEach, describe, expect, it } from "vitest";
import { Shard } from "../../services/handoff/shard/shard.ts";
import { ensureShardDir, fileIdentity, ShardDirError } from "../../services/handoff/shard/shard-dir.ts";
import { TransportError } from "../../services/handoff/transport/errors.ts";
import { ShmTransport } from "../../services/handoff/transport/shm.ts";
import type { ChunkLocation } from "../../services/handoff/transport/types.ts";

const MiB = 1 << 20;
const base = existsSync("/dev/shm") ? "/dev/shm" : os.tmpdir();
const isRoot = process.getuid?.() === 0;

let root: string;
beforeEach(async () => {
  root = await mkdtemp(path.join(base, "ctxbank-sec-shard-"));
});
afterEach(async () => {
  await rm(root, { recursive: true, force: true });
});

async function transportError(f: () => unknown): Promise<TransportError> {
  try {
    await f();
  } catch (e) {
    expect(e).toBeInstanceOf(TransportError);
    return e as TransportError;
  }
  throw new Error("expected a TransportError");
}

describe("shard directory", () => {
  it("is created with mode 0700", async () => {
    const dir = path.join(root, "new", "shards");
    await ensureShardDir(dir);
    expect((await stat(dir)).mode & 0o777).toBe(0o700);
  });

  it("refuses a pre-existing directory that others can write", async () => {
    const dir = path.join(root, "open");
    await mkdir(dir);
    await chmod(dir, 0o777);
    await expect(ensureShardDir(dir)).rejects.toThrow(ShardDirError);
    await expect(ensureShardDir(dir)).rejects.toThrow(/writable by its group or by others \(mode 777\)/);
    await chmod(dir, 0o770);
    await expect(ensureShardDir(dir)).rejects.toThrow(/mode 770/);
    // Shard.create goes through the same check: nothing is created in it.
    await expect(Shard.create({ dir, shardId: "p", epoch: 1, sizeBytes: MiB })).rejects.toThrow(ShardDirError);
  });

  it.runIf(isRoot)("refuses a pre-existing directory owned by another user", async () => {
    const dir = path.join(root, "theirs");
    await mkdir(dir, { mode: 0o700 });
    await chown(dir, 12345, 12345);
    await expect(ensureShardDir(dir)).rejects.toThrow(/owned by uid 12345, not by this service's user/);
  });

  it("refuses a symbolic link, and tightens a directory of ours that others can read", async () => {
    const real = path.join(root, "real");
    await mkdir(real, { mode: 0o700 });
    const link = path.join(root, "link");
    await symlink(real, link);
    await expect(ensureShardDir(link)).rejects.toThrow(/symbolic link/);
    const readable = path.join(root, "readable");
    await mkdir(readable);
    await chmod(readable, 0o755);
    await ensureShardDir(readable);
    expect((await lstat(readable)).mode & 0o777).toBe(0o700);
  });
});

describe("registered shard file", () => {
  let shard: Shard;
  let loc: ChunkLocation;
  beforeEach(async () => {
    shard = await Shard.create({ dir: path.join(root, "shards"), shardId: "owner-a", epoch: 3, sizeBytes: 8 * MiB });
    const offset = shard.alloc(MiB)!;
    await shard.write(offset, Buffer.alloc(MiB, 0x5a));
    loc = {
      shardId: "owner-a",
      epoch: 3,
      shardPath: shard.path,
      ownerBaseUrl: "http://127.0.0.1:9",
      fileId: shard.fileId,
      offset,
      length: MiB,
    };
  });
  afterEach(async () => {
    await shard.destroy();
  });

  it("carries the file's device:inode", async () => {
    expect(shard.fileId).toMatch(/^\d+:\d+$/);
    expect(shard.fileId).toBe(await fileIdentity(shard.path));
  });

  it("a file planted at the registered path is neither mapped nor read", async () => {
    const shm = new ShmTransport({ allowedDirs: [path.dirname(shard.path)], requireFileId: true });
    try {
      const view = await shm.viewChunk(loc);
      expect(view.bytes[0]).toBe(0x5a);
      view.release();
      await shm.readChunk(loc, new Uint8Array(MiB), { deadlineMs: Date.now() + 5_000 });

      // An attacker (or a confused second owner) swaps another file in under the same name.
      const planted = `${shard.path}.planted`;
      await writeFile(planted, Buffer.alloc(8 * MiB, 0x41));
      await rename(planted, shard.path);

      const mapped = await transportError(() => shm.viewChunk(loc));
      expect(mapped.code).toBe("file_mismatch");
      expect(mapped.message).toContain(`not the registered ${shard.fileId}`);
      // A reader that opens the path now gets the planted file and refuses it; one that still
      // holds the original (unlinked) file refuses it as gone.
      const fresh = new ShmTransport({ allowedDirs: [path.dirname(shard.path)], requireFileId: true });
      const read = await transportError(() => fresh.readChunk(loc, new Uint8Array(MiB), { deadlineMs: Date.now() + 5_000 })).finally(() =>
        fresh.close(),
      );
      expect(read.code).toBe("file_mismatch");
      const cached = await transportError(() => shm.readChunk(loc, new Uint8Array(MiB), { deadlineMs: Date.now() + 5_000 }));
      expect(cached.code).toBe("stale_epoch");
      // A location without the registered identity is not trusted either.
      expect((await transportError(() => shm.viewChunk({ ...loc, fileId: null }))).code).toBe("file_mismatch");
    } finally {
      await shm.close();
    }
  });

  it("freeing a range returns its tmpfs pages (the file's allocated blocks go down)", async () => {
    const big = shard.alloc(4 * MiB)!;
    await shard.write(big, Buffer.alloc(4 * MiB, 0x33));
    const before = (await stat(shard.path)).blocks;
    shard.free(big);
    const after = await stat(shard.path);
    expect(after.size).toBe(8 * MiB); // the file keeps its size
    expect(before - after.blocks).toBeGreaterThanOrEqual((4 * MiB) / 512 - 8);
    // The other chunk's bytes are untouched.
    const kept = Buffer.alloc(16);
    await shard.read(loc.offset, kept);
    expect(kept.every((b) => b === 0x5a)).toBe(true);
  });
});
