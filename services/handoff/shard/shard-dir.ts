// The shard directory's trust checks. Shard files hold other clients' prompts' KV, and a decode
// maps whatever file the registry names in it, so the directory must be ours alone: created
// 0700, and a pre-existing one refused unless it is a real directory owned by this user that no
// one else can write (on a shared /dev/shm anyone may create /dev/shm/ctxbank first).
import { CtxbankError } from "../../../shared/inference/errors.ts";
import { chmod, lstat, mkdir, stat, type FileHandle } from "node:fs/promises";

/** The shard directory is unsafe to use (a link, not ours, writable by others). */
export class ShardDirError extends CtxbankError<"unsafe_shard_dir"> {
  static override readonly codes = ["unsafe_shard_dir"] as const;
  override readonly name = "ShardDirError";
  constructor(message: string) {
    super("unsafe_shard_dir", message);
  }
}

/** Creates `dir` (mode 0700) or checks a pre-existing one; throws ShardDirError naming the problem. */
export async function ensureShardDir(dir: string): Promise<void> {
  await mkdir(dir, { recursive: true, mode: 0o700 });
  const st = await lstat(dir);
  const uid = process.getuid?.();
  if (st.isSymbolicLink()) {
    throw new ShardDirError(`shard directory ${dir} is a symbolic link; use a real directory owned by this user (mode 0700)`);
  }
  if (!st.isDirectory()) throw new ShardDirError(`shard directory ${dir} exists and is not a directory`);
  if (uid !== undefined && st.uid !== uid) {
    throw new ShardDirError(
      `shard directory ${dir} is owned by uid ${st.uid}, not by this service's user (uid ${uid}); someone else may have created it to read or plant shard files. Remove it or choose another --shard-dir`,
    );
  }
  if ((st.mode & 0o022) !== 0) {
    throw new ShardDirError(
      `shard directory ${dir} is writable by its group or by others (mode ${(st.mode & 0o777).toString(8)}); files may have been planted in it. Remove it or make it mode 0700`,
    );
  }
  // Ours and not writable by others, but readable: tighten it (file names tell who is serving).
  if ((st.mode & 0o077) !== 0) await chmod(dir, 0o700);
}

/** "device:inode" of a file, exact (bigint stat), as the registry records a shard file. */
export async function fileIdentity(file: string | FileHandle): Promise<string> {
  const st = typeof file === "string" ? await stat(file, { bigint: true }) : await file.stat({ bigint: true });
  return `${st.dev}:${st.ino}`;
}
