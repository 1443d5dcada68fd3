// Who owns a shard file, so a file whose owner died is found without the registry: an owner that
// was SIGKILLed and restarted under another instance id (another port, with the embedded database
// that forgets everything) would otherwise leave its KV, in clear, in the tmpfs for good. Beside
// each shard file, `<file>.owner` names the owning process: its pid, its start time (pids are
// reused) and its pid namespace (a pid means nothing in another container's namespace, so files
// marked from another namespace are left to the registry's sweeper).
import { readFileSync, readlinkSync } from "node:fs";
import { readdir, readFile, unlink, writeFile } from "node:fs/promises";
import path from "node:path";

interface OwnerMark {
  pid: number;
  /** Field 22 of /proc/<pid>/stat: the process's start, in clock ticks since boot. */
  start: string;
  /** The target of /proc/self/ns/pid, e.g. "pid:[4026531836]". */
  pidns: string;
}

const MARK_SUFFIX = ".owner";

function processStart(pid: number): string | undefined {
  try {
    const stat = readFileSync(`/proc/${pid}/stat`, "utf8");
    // The command name (field 2) may hold spaces and parentheses: fields are counted after its last ')'.
    return stat.slice(stat.lastIndexOf(")") + 2).split(" ")[19];
  } catch {
    return undefined;
  }
}

function pidNamespace(): string | undefined {
  try {
    return readlinkSync("/proc/self/ns/pid");
  } catch {
    return undefined;
  }
}

/** Marks `shardPath` as this process's (best effort: without /proc nothing is written). */
export async function writeOwnerMark(shardPath: string): Promise<void> {
  const start = processStart(process.pid);
  const pidns = pidNamespace();
  if (start === undefined || pidns === undefined) return;
  const mark: OwnerMark = { pid: process.pid, start, pidns };
  await writeFile(shardPath + MARK_SUFFIX, JSON.stringify(mark), { mode: 0o600 });
}

export async function removeOwnerMark(shardPath: string): Promise<void> {
  await unlink(shardPath + MARK_SUFFIX).catch((e: NodeJS.ErrnoException) => (e.code === "ENOENT" ? undefined : Promise.reject(e)));
}

/**
 * Deletes the shard files in `dir` (and their marks) whose marked owner is no longer running: no
 * process with that pid, or one that started at another time, in this pid namespace. Unmarked
 * files and files marked from another namespace are left alone. Returns the deleted paths.
 */
export async function removeOrphanShards(dir: string, isShardFile: (name: string) => boolean): Promise<string[]> {
  const ns = pidNamespace();
  if (ns === undefined) return [];
  const names = await readdir(dir).catch((e: NodeJS.ErrnoException) => (e.code === "ENOENT" ? [] : Promise.reject(e)));
  const removed: string[] = [];
  for (const name of names) {
    if (!isShardFile(name)) continue;
    const file = path.join(dir, name);
    let mark: Partial<OwnerMark>;
    try {
      mark = JSON.parse(await readFile(file + MARK_SUFFIX, "utf8")) as Partial<OwnerMark>;
    } catch {
      continue; // no mark (or one being written): not ours to judge
    }
    if (mark.pidns !== ns || typeof mark.pid !== "number" || typeof mark.start !== "string") continue;
    if (processStart(mark.pid) === mark.start) continue; // alive
    await unlink(file).catch((e: NodeJS.ErrnoException) => (e.code === "ENOENT" ? undefined : Promise.reject(e)));
    await removeOwnerMark(file);
    removed.push(file);
  }
  return removed;
}
