// The model's resident memory: after the engine repacks the weights, the mapped GGUF's pages are
// dropped, so the weights are not held twice (file-backed pages + the packed copy). Measured on
// /proc/self/status (Linux) around a fresh load and a forward pass in this process.
import { readFileSync, statSync } from "node:fs";
import { describe, expect, it } from "vitest";
import { Engine, loadModel } from "../../shared/inference/engine/engine.ts";
import { addon } from "../../shared/inference/engine/native.ts";
import { resolveModel } from "../../shared/inference/model/resolve.ts";

/** File-backed and anonymous resident bytes of this process. */
function resident(): { file: number; anon: number } {
  const status = readFileSync("/proc/self/status", "utf8");
  const kb = (key: string) => Number(new RegExp(`${key}:\\s+(\\d+) kB`).exec(status)?.[1] ?? NaN) * 1024;
  return { file: kb("RssFile"), anon: kb("RssAnon") };
}

describe.runIf(process.platform === "linux")("model memory", () => {
  it("holds the packed weights, not the mapped file as well", async () => {
    const path = await resolveModel();
    const fileBytes = statSync(path).size;
    addon(); // the addon's own pages are not the model's
    const before = resident();
    const model = await loadModel(path);
    const engine = new Engine(model, { threads: 1 });
    const seq = engine.createSequence(64);
    await engine.prefill(seq, [1, 2, 3, 4, 5, 6, 7, 8]);
    seq.release();
    const after = resident();
    const fileGrowth = after.file - before.file;
    // The packed weights are anonymous memory about the file's size; of the file itself only the
    // pages read since the repack stay (the norms and 8 embedding rows: a few pages).
    expect(after.anon - before.anon).toBeGreaterThan(0.5 * fileBytes);
    expect(
      fileGrowth,
      `file-backed growth ${(fileGrowth / 2 ** 20).toFixed(1)} MiB for a ${(fileBytes / 2 ** 20).toFixed(0)} MiB GGUF`,
    ).toBeLessThan(0.1 * fileBytes);
  });
});
