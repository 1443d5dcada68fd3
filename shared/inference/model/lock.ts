/**
 * The download lock: `<file>.lock`, created exclusively, holding pid/host, its mtime refreshed as a
 * heartbeat. A second process waits for it; a lock whose owner is dead (same host) or that has not
 * been touched for `staleMs` is taken over.
 */
import type { Stats } from "node:fs";
import { open, readFile, rm, stat, utimes } from "node:fs/promises";
import { hostname } from "node:os";
import { setTimeout as sleep } from "node:timers/promises";
import { errCode, ModelResolveError, throwIfAborted } from "./errors.ts";
import type { Logger } from "./progress.ts";

export const LOCK_SUFFIX = ".lock";

export interface Lock {
  release(): Promise<void>;
}

interface LockContent {
  pid: number;
  host: string;
  started: number;
}

export async function acquireLock(
  lockPath: string,
  o: { timeoutMs: number; staleMs: number; log: Logger; signal: AbortSignal | undefined },
): Promise<Lock> {
  const start = Date.now();
  let announced = false;
  for (;;) {
    throwIfAborted(o.signal);
    try {
      const fh = await open(lockPath, "wx");
      try {
        const content: LockContent = { pid: process.pid, host: hostname(), started: Date.now() };
        await fh.writeFile(JSON.stringify(content));
      } finally {
        await fh.close();
      }
      const beat = setInterval(
        () => {
          const now = new Date();
          utimes(lockPath, now, now).catch(() => undefined);
        },
        Math.max(250, Math.floor(o.staleMs / 4)),
      );
      beat.unref();
      return {
        release: async () => {
          clearInterval(beat);
          await rm(lockPath, { force: true });
        },
      };
    } catch (e) {
      if (errCode(e) !== "EEXIST") throw e;
    }
    if (await lockIsStale(lockPath, o.staleMs)) {
      o.log.line(`removing stale download lock ${lockPath}`);
      await rm(lockPath, { force: true });
      continue;
    }
    if (!announced) {
      o.log.line(`another process is downloading the model (lock ${lockPath}); waiting for it…`);
      announced = true;
    }
    if (Date.now() - start > o.timeoutMs) {
      throw new ModelResolveError(
        "model_lock_timeout",
        `gave up waiting ${Math.round(o.timeoutMs / 1000)} s for another process's model download ` +
          `(lock ${lockPath}); if no other ctxbank process is running, delete that file and retry`,
      );
    }
    await sleep(200, undefined, o.signal ? { signal: o.signal } : undefined).catch(() => undefined);
  }
}

async function lockIsStale(lockPath: string, staleMs: number): Promise<boolean> {
  let st: Stats;
  try {
    st = await stat(lockPath);
  } catch {
    return false; // gone: the next open() will succeed
  }
  try {
    const c = JSON.parse(await readFile(lockPath, "utf8")) as Partial<LockContent>;
    if (c.host === hostname() && typeof c.pid === "number" && !pidAlive(c.pid)) return true;
  } catch {
    /* being written, or garbage: fall back to age */
  }
  return Date.now() - st.mtimeMs > staleMs;
}

function pidAlive(pid: number): boolean {
  try {
    process.kill(pid, 0);
    return true;
  } catch (e) {
    return errCode(e) === "EPERM";
  }
}
