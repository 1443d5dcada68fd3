// llama.cpp's own vocabulary-only GGUFs and their test vectors (models/ggml-vocab-<name>.gguf,
// .gguf.inp, .gguf.out), taken from the llama.cpp git bundle node-llama-cpp ships, extracted once
// into the user cache (~/.cache/ctxbank/llama-vocab/<commit>/). Never committed to this repository.
import { execFileSync } from "node:child_process";
import { existsSync, mkdirSync, mkdtempSync, readFileSync, renameSync, rmSync, writeFileSync } from "node:fs";
import { homedir } from "node:os";
import { join } from "node:path";
import { fileURLToPath } from "node:url";

const BUNDLE = fileURLToPath(new URL("../../node_modules/node-llama-cpp/llama/gitRelease.bundle", import.meta.url));

function cacheRoot(): string {
  const xdg = process.env.XDG_CACHE_HOME;
  return join(xdg?.startsWith("/") ? xdg : join(homedir(), ".cache"), "ctxbank", "llama-vocab");
}

/** The bundle's commit, which names the cache directory (a new node-llama-cpp gets fresh files). */
function bundleCommit(): string {
  const heads = execFileSync("git", ["bundle", "list-heads", BUNDLE], { encoding: "utf8" });
  const m = /^([0-9a-f]{40}) HEAD$/m.exec(heads);
  if (!m) throw new Error(`no HEAD in ${BUNDLE}: ${heads}`);
  return m[1]!;
}

let dirOnce: string | undefined;

/** The directory holding the extracted files named, extracting whatever is missing. */
function extracted(files: readonly string[]): string {
  dirOnce ??= join(cacheRoot(), bundleCommit());
  const dir = dirOnce;
  const missing = files.filter((f) => !existsSync(join(dir, f)));
  if (missing.length === 0) return dir;
  mkdirSync(dir, { recursive: true });
  // A bare scratch repository fetches the bundle (a bundle is not a repository `git show` can read).
  const repo = mkdtempSync(join(dir, ".repo-"));
  try {
    execFileSync("git", ["init", "-q", "--bare", repo]);
    execFileSync("git", ["-C", repo, "fetch", "-q", BUNDLE, "HEAD"]);
    for (const f of missing) {
      const bytes = execFileSync("git", ["-C", repo, "show", `FETCH_HEAD:models/${f}`], { maxBuffer: 1 << 30 });
      const tmp = join(dir, `.${f}.${process.pid}.part`);
      writeFileSync(tmp, bytes);
      renameSync(tmp, join(dir, f)); // atomic: a concurrent reader sees the whole file or none
    }
  } finally {
    rmSync(repo, { recursive: true, force: true });
  }
  return dir;
}

/** Path of llama.cpp's `models/ggml-vocab-<name>.gguf`. */
export function llamaCppVocab(name: string): string {
  const f = `ggml-vocab-${name}.gguf`;
  return join(extracted([f]), f);
}

/** llama.cpp's test vectors for a vocabulary: each input text and the ids it must give (no BOS, no special parsing). */
export function llamaCppVectors(name: string): { text: string; ids: number[] }[] {
  const f = `ggml-vocab-${name}.gguf`;
  const dir = extracted([`${f}.inp`, `${f}.out`]);
  // Parsed as llama.cpp's tests/test-tokenizer-0.cpp parses them.
  const inputs = readFileSync(join(dir, `${f}.inp`), "utf8").split("\n__ggml_vocab_test__\n");
  if (inputs.at(-1) === "") inputs.pop();
  const outputs = readFileSync(join(dir, `${f}.out`), "utf8").split("\n");
  if (outputs.at(-1) === "") outputs.pop();
  if (inputs.length !== outputs.length) throw new Error(`${f}: ${inputs.length} inputs but ${outputs.length} outputs`);
  return inputs.map((text, i) => {
    const line = outputs[i]!.trim();
    return { text, ids: line === "" ? [] : line.split(/\s+/).map(Number) };
  });
}
