// Where KV shards live when the configuration names no directory: memory-backed /dev/shm when
// it is there, else the temp directory (with a warning, since that may be disk-backed).
import { accessSync, constants } from "node:fs";
import os from "node:os";
import path from "node:path";

const SHM_ROOT = "/dev/shm";

/**
 * /dev/shm/ctxbank where /dev/shm exists (memory-backed), else a directory under os.tmpdir()
 * with a warning: that works but may be disk-backed.
 */
export function defaultShardDir(shmRoot = SHM_ROOT): string {
  if (isWritableDir(shmRoot)) return path.join(shmRoot, "ctxbank");
  const fallback = path.join(os.tmpdir(), "ctxbank-shards");
  process.emitWarning(`${shmRoot} is not available; KV shards go to ${fallback}, which may be disk-backed`, {
    code: "CTXBANK_NO_SHM",
  });
  return fallback;
}

function isWritableDir(dir: string): boolean {
  try {
    accessSync(dir, constants.W_OK | constants.X_OK);
    return true;
  } catch {
    return false;
  }
}
