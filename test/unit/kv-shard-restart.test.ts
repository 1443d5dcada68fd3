// A prefill that crashed leaves its shard file behind, and on a tmpfs sized to one shard (a
// Kubernetes memory emptyDir with sizeLimit = --shard-bytes, which survives a container restart)
// its written pages fill the space the restarted process needs. The restart must remove its own
// stale file before it measures the free space; and the files of any owner that died under another
// shard id (a restart on another port), found by their owner marks. statfs is replaced by a
// filesystem of fixed capacity whose usage is the size of the files in the directory.
import { spawnSync } from "node:child_process";
import { readdirSync, readFileSync, readlinkSync, statSync, writeFileSync } from "node:fs";
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

const { Shard } = await import("../../services/handoff/shard/shard.ts");

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
  expect(readdirSync(dir).sort()).toEqual(["prefill-a.e2.shard", "prefill-a.e2.shard.owner"]);
  await shard.destroy();
  expect(readdirSync(dir)).toEqual([]);
});

it("files of owners that died under other shard ids go; live, foreign and unmarked ones stay", async () => {
  const ns = readlinkSync("/proc/self/ns/pid");
  const start = (pid: number) => {
    const stat = readFileSync(`/proc/${pid}/stat`, "utf8");
    return stat.slice(stat.lastIndexOf(")") + 2).split(" ")[19]!;
  };
  const dead = spawnSync("true").pid!; // exited: no such process now
  const files: Record<string, object | undefined> = {
    "serve-h-8080.e1.shard": { pid: dead, start: "12345", pidns: ns }, // SIGKILLed, restarted on another port
    "serve-h-9090.e3.shard": { pid: process.pid, start: "1", pidns: ns }, // the pid was reused since
    "prefill-b.e1.shard": { pid: process.pid, start: start(process.pid), pidns: ns }, // alive
    "prefill-c.e1.shard": { pid: dead, start: "12345", pidns: "pid:[1]" }, // another container's
    "prefill-d.e1.shard": undefined, // no mark: an older version's
  };
  for (const [name, mark] of Object.entries(files)) {
    writeFileSync(path.join(dir, name), Buffer.alloc(4096));
    if (mark) writeFileSync(path.join(dir, `${name}.owner`), JSON.stringify(mark));
  }
  const shard = await Shard.create({ dir, shardId: "serve-h-8081", epoch: 1, sizeBytes: 1 << 20 });
  expect(
    readdirSync(dir)
      .filter((n) => n.endsWith(".shard"))
      .sort(),
  ).toEqual(["prefill-b.e1.shard", "prefill-c.e1.shard", "prefill-d.e1.shard", "serve-h-8081.e1.shard"]);
  expect(readdirSync(dir).filter((n) => n.startsWith("serve-h-8080") || n.startsWith("serve-h-9090"))).toEqual([]);
  await shard.destroy();
});

it("another owner's file still counts against the space", async () => {
  writeFileSync(path.join(dir, "prefill-b.e1.shard"), Buffer.alloc(3 << 20));
  await expect(Shard.create({ dir, shardId: "prefill-a", epoch: 2, sizeBytes: CAPACITY })).rejects.toThrow(/does not fit/);
  expect(readdirSync(dir)).toEqual(["prefill-b.e1.shard"]);
});
