// What a benchmark result needs to be reproducible: the machine, the runtime, the git state.
import { execFileSync } from "node:child_process";
import { createHash } from "node:crypto";
import { createReadStream, existsSync, readdirSync, readFileSync, statSync, writeFileSync } from "node:fs";
import os from "node:os";

export interface MachineInfo {
  cpuModel: string;
  /** Logical CPUs the OS reports. */
  cpus: number;
  /** CPUs this process may run on (affinity / cgroup aware when available). */
  availableParallelism: number;
  cpuFlags?: string[];
  totalMemGiB: number;
  platform: string;
  arch: string;
  kernel: string;
  hypervisor?: string;
  node: string;
  v8: string;
  loadAvg: number[];
}

const INTERESTING_FLAGS = ["avx", "avx2", "fma", "f16c", "avx512f", "avx512bw", "avx512vl", "avx512_vnni", "avx512_bf16", "amx_tile"];

export function machineInfo(): MachineInfo {
  const cpus = os.cpus();
  const info: MachineInfo = {
    cpuModel: cpus[0]?.model.trim() ?? "unknown",
    cpus: cpus.length,
    availableParallelism: typeof os.availableParallelism === "function" ? os.availableParallelism() : cpus.length,
    totalMemGiB: os.totalmem() / 2 ** 30,
    platform: os.platform(),
    arch: os.arch(),
    kernel: os.release(),
    node: process.version,
    v8: process.versions.v8,
    loadAvg: os.loadavg(),
  };
  try {
    const cpuinfo = readFileSync("/proc/cpuinfo", "utf8");
    const flags = /^flags\s*:\s*(.*)$/m.exec(cpuinfo)?.[1]?.split(/\s+/) ?? [];
    info.cpuFlags = INTERESTING_FLAGS.filter((f) => flags.includes(f));
    if (flags.includes("hypervisor")) {
      let vendor = "yes";
      try {
        vendor =
          execFileSync("lscpu", { encoding: "utf8" })
            .match(/^Hypervisor vendor:\s*(.*)$/m)?.[1]
            ?.trim() ?? vendor;
      } catch {
        /* lscpu missing: keep "yes" */
      }
      info.hypervisor = vendor;
    }
  } catch {
    /* not Linux */
  }
  return info;
}

export interface GitInfo {
  commit?: string;
  branch?: string;
  /** Uncommitted changes anywhere in the work tree (untracked files ignored). */
  dirty?: boolean;
  /** Tracked or untracked changes under the given paths, as `git status --porcelain` lines. */
  changesUnder?: Record<string, string[]>;
}

function git(cwd: string, args: string[]): string | undefined {
  try {
    return execFileSync("git", args, { cwd, encoding: "utf8", stdio: ["ignore", "pipe", "ignore"] }).trim();
  } catch {
    return undefined;
  }
}

export function gitInfo(cwd: string, watchPaths: string[] = []): GitInfo {
  const info: GitInfo = {
    commit: git(cwd, ["rev-parse", "HEAD"]),
    branch: git(cwd, ["rev-parse", "--abbrev-ref", "HEAD"]),
  };
  const status = git(cwd, ["status", "--porcelain", "--untracked-files=no"]);
  if (status !== undefined) info.dirty = status.length > 0;
  if (watchPaths.length > 0) {
    info.changesUnder = {};
    for (const p of watchPaths) {
      const s = git(cwd, ["status", "--porcelain", "--", p]);
      if (s !== undefined) info.changesUnder[p] = s.length > 0 ? s.split("\n") : [];
    }
  }
  return info;
}

export async function sha256File(path: string): Promise<string> {
  const h = createHash("sha256");
  for await (const chunk of createReadStream(path)) h.update(chunk as Buffer);
  return h.digest("hex");
}

export interface FileStamp {
  path: string;
  bytes: number;
  mtime: string;
  sha256: string;
}

export async function fileStamp(path: string): Promise<FileStamp> {
  const st = statSync(path);
  return { path, bytes: st.size, mtime: st.mtime.toISOString(), sha256: await sha256File(path) };
}

/** Shared objects mapped into this process whose path matches `re` (Linux only). */
export function mappedLibraries(re: RegExp): string[] {
  try {
    const maps = readFileSync("/proc/self/maps", "utf8");
    const libs = new Set<string>();
    for (const line of maps.split("\n")) {
      const path = line.slice(line.indexOf("/"));
      if (line.includes("/") && re.test(path)) libs.add(path);
    }
    return [...libs];
  } catch {
    return [];
  }
}

/** Nice values of every thread of this process (Linux; empty elsewhere). */
export function threadNiceValues(): number[] {
  try {
    return readdirSync("/proc/self/task").map((tid) => {
      const stat = readFileSync(`/proc/self/task/${tid}/stat`, "utf8");
      // Fields after the ")" that closes the command name; nice is field 19 overall.
      const rest = stat.slice(stat.lastIndexOf(")") + 2).split(" ");
      return Number(rest[16]);
    });
  } catch {
    return [];
  }
}

/**
 * Sets the nice value of every existing thread of this process (Linux nice is per thread; threads
 * created later inherit it from their creator). Negative values need root / CAP_SYS_NICE.
 * Returns the error message if it could not.
 */
export function setProcessNice(nice: number): string | undefined {
  try {
    const tids = readdirSync("/proc/self/task").map(Number);
    for (const tid of tids) os.setPriority(tid, nice);
    // With autogroup scheduling (the default on desktop-style kernels) thread nice only ranks
    // threads inside their session's group; the group's own nice decides against other sessions.
    if (existsSync("/proc/self/autogroup")) writeFileSync("/proc/self/autogroup", String(nice));
    return undefined;
  } catch (err) {
    try {
      os.setPriority(nice);
    } catch {
      /* reported below */
    }
    return err instanceof Error ? err.message : String(err);
  }
}

/** This process's scheduler autogroup and its nice ("/autogroup-165 nice 0"), if the kernel has them. */
export function autogroup(): string | undefined {
  try {
    return readFileSync("/proc/self/autogroup", "utf8").trim();
  } catch {
    return undefined;
  }
}

/** Sets the autogroup nice back (e.g. on exit after setProcessNice). Best effort. */
export function restoreAutogroupNice(nice: number): void {
  try {
    writeFileSync("/proc/self/autogroup", String(nice));
  } catch {
    /* nothing to do */
  }
}
