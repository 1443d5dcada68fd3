// A prefill that crashed leaves its shard file behind, and on a tmpfs sized to one shard (a
// Kubernetes memory emptyDir with sizeLimit = --shard-bytes, which survives a container restart)
// its written pages fill the space the restarted process needs. The restart must remove its own
// stale file before it measures the free space. statfs is replaced by a filesystem of fixed
// capacity whose usage is the size of the files in the directory.
import { readdirSync, statSync, writeFileSync } from "node:fs";
import { mkdtemp, rm } from "node:fs/promises";
import os from "node:os";
import path from "node:path";
import { afterEach, beforeEach, expect, it, vi } from "vitest";

const CAPACITY = 4 << 20;

vi.mock("node:fs/promises", async (importOriginal) => {
  const real = await importOriginal<typeof import("node:fs/promises")>();
  const statfs = async (dir: string) => {
    const used = readdirSync(dir).reduce((sum, f) => sum + statSync(path.join(dir, f)).size, 0);
    const bsize = 4096;
    return { ...(await real.statfs(dir)), bsize, bavail: Math.floor((CAPACITY - used) / bsize) };
  };
  return { ...real, statfs, default: { ...real, statfs } };
});

const { Shard } = await import("../services/handoff/shard/shard.ts");

let dir: string;
beforeEach(async () => {
  dir = await mkdtemp(path.join(os.tmpdir(), "ctxbank-shard-restart-"));
});
afterEach(async () => {
  await rm(dir, { recursive: true, force: true });
});

it("a restarted owner reclaims the space of its crashed epoch's file", async () => {
  // The crashed epoch wrote 3 MiB of its 4 MiB shard (the file's size stands for its pages).
  writeFileSync(path.join(dir, "prefill-a.e1.shard"), Buffer.alloc(3 << 20));
  const shard = await Shard.create({ dir, shardId: "prefill-a", epoch: 2, sizeBytes: CAPACITY });
  expect(readdirSync(dir)).toEqual(["prefill-a.e2.shard"]);
  await shard.destroy();
});

it("another owner's file still counts against the space", async () => {
  writeFileSync(path.join(dir, "prefill-b.e1.shard"), Buffer.alloc(3 << 20));
  await expect(Shard.create({ dir, shardId: "prefill-a", epoch: 2, sizeBytes: CAPACITY })).rejects.toThrow(/does not fit/);
  expect(readdirSync(dir)).toEqual(["prefill-b.e1.shard"]);
});
