// One error vocabulary (docs/errors.md): every error class is a CtxbankError whose codes are
// snake_case and each has an HTTP status in the one table; the one error handler answers any
// thrown error in the shared shape and records its code. The classes are found in the source,
// not listed here, so a new one cannot be missed.
import { execFileSync } from "node:child_process";
import { readFileSync } from "node:fs";
import path from "node:path";
import { pathToFileURL } from "node:url";
import pino from "pino";
import { describe, expect, it } from "vitest";
import { SamplingError } from "../../shared/inference/engine/sampler.ts";
import { CtxbankError } from "../../shared/inference/errors.ts";
import { PolicyError } from "../../shared/inference/policy/request.ts";
import { createApp } from "../../shared/platform/http/app.ts";
import { ApiError, errorAnswer, HTTP_STATUS, retryAfter } from "../../shared/platform/http/errors.ts";
import { RegistryError } from "../../shared/platform/registry/errors.ts";
import { ChunkError } from "../../services/handoff/format/chunk.ts";

const ROOT = path.resolve(import.meta.dirname, "../..");
const SNAKE = /^[a-z][a-z0-9]*(_[a-z0-9]+)*$/;

/** Source files (not tests) that declare a class extending something named *Error. */
function filesDeclaringErrors(): string[] {
  const out = execFileSync(
    "git",
    ["grep", "-l", "-E", "class [A-Za-z0-9_]+(<[^>]*>)? extends [A-Za-z0-9_]*Error\\b", "--", "shared", "services", "bin", "tools"],
    {
      cwd: ROOT,
      encoding: "utf8",
    },
  );
  return out.split("\n").filter((f) => f.endsWith(".ts"));
}

type ErrorClass = (abstract new (...args: never[]) => Error) & { codes?: readonly string[] };

async function errorClasses(): Promise<Map<string, ErrorClass>> {
  const found = new Map<string, ErrorClass>();
  for (const file of filesDeclaringErrors()) {
    const mod = (await import(pathToFileURL(path.join(ROOT, file)).href)) as Record<string, unknown>;
    for (const [name, value] of Object.entries(mod)) {
      if (typeof value === "function" && value.prototype instanceof Error) found.set(`${file}:${name}`, value as ErrorClass);
    }
  }
  return found;
}

describe("the error vocabulary", () => {
  it("CtxbankError is the only class that extends Error directly", () => {
    const out = execFileSync("git", ["grep", "-n", "-E", "extends Error\\b", "--", "shared", "services", "bin", "tools"], {
      cwd: ROOT,
      encoding: "utf8",
    });
    expect(out.trim().split("\n")).toEqual([expect.stringMatching(/^shared\/inference\/errors\.ts:\d+:export class CtxbankError/)]);
  });

  it("every error class is a CtxbankError whose codes are snake_case and each have an HTTP status", async () => {
    const classes = await errorClasses();
    expect(classes.size).toBeGreaterThan(10); // the search found them (the library's, the platform's, the handoff's)
    const used = new Set<string>();
    for (const [where, cls] of classes) {
      if (cls === CtxbankError) continue;
      expect(cls.prototype instanceof CtxbankError, `${where} is not a CtxbankError`).toBe(true);
      const codes = cls.codes ?? [];
      expect(codes.length, `${where} lists no codes`).toBeGreaterThan(0);
      for (const code of codes) {
        expect(code, `${where}`).toMatch(SNAKE);
        expect(HTTP_STATUS, `${where}: code ${code} has no HTTP status`).toHaveProperty(code);
        used.add(code);
      }
    }
    // And the table has no code that nothing can throw.
    expect(Object.keys(HTTP_STATUS).filter((c) => !used.has(c))).toEqual([]);
  });

  it("docs/errors.md lists every code with its status", () => {
    const doc = readFileSync(path.join(ROOT, "docs/errors.md"), "utf8");
    for (const [code, status] of Object.entries(HTTP_STATUS)) expect(doc, code).toContain(`| ${status} | \`${code}\` |`);
  });

  it("the table's statuses are error statuses", () => {
    for (const [code, status] of Object.entries(HTTP_STATUS)) {
      expect(code).toMatch(SNAKE);
      expect(status, code).toBeGreaterThanOrEqual(400);
      expect(status, code).toBeLessThan(600);
    }
  });
});

describe("errorAnswer", () => {
  it("answers a domain error below 500 with its code, message and param", () => {
    const a = errorAnswer(new PolicyError("policy.omnikv.budget is 99999, beyond the model's context", "policy.omnikv.budget"));
    expect(a.status).toBe(400);
    expect(a.unexpected).toBe(false);
    expect(a.body).toEqual({
      error: {
        message: "policy.omnikv.budget is 99999, beyond the model's context",
        type: "invalid_request_error",
        code: "invalid_policy",
        param: "policy.omnikv.budget",
      },
    });
    expect(errorAnswer(new RegistryError("not_found", "no request r1")).body.error).toMatchObject({
      code: "not_found",
      type: "not_found_error",
    });
  });

  it("keeps an operator's message out of a 5xx answer, and says it is unexpected", () => {
    const a = errorAnswer(new ChunkError("checksum_mismatch", "chunk at /dev/shm/ctxbank/secret-path failed its checksum"));
    expect(a.status).toBe(502);
    expect(a.unexpected).toBe(true);
    expect(a.body.error.code).toBe("checksum_mismatch");
    expect(a.body.error.message).not.toMatch(/secret-path/);
  });

  it("answers anything else as a 500 internal_error", () => {
    const a = errorAnswer(new Error("ECONNRESET at 10.0.0.7"));
    expect(a).toMatchObject({ status: 500, unexpected: true, body: { error: { code: "internal_error" } } });
    expect(a.body.error.message).not.toMatch(/10\.0\.0\.7/);
    expect(errorAnswer("a string").status).toBe(500);
  });

  it("answers an ApiError as it is, every 429 with a Retry-After", () => {
    expect(errorAnswer(new ApiError(429, "queue_full", "full")).headers).toEqual({ "retry-after": "1" });
    expect(errorAnswer(retryAfter(7, new ApiError(429, "queue_full", "full"))).headers).toEqual({ "retry-after": "7" });
    const a = errorAnswer(new ApiError(502, "prefill_failed", "the prefill instance p1 failed"));
    expect(a).toMatchObject({
      status: 502,
      unexpected: false,
      body: { error: { code: "prefill_failed", message: "the prefill instance p1 failed", type: "upstream_error" } },
    });
  });
});

describe("the error handler", () => {
  function app() {
    const lines: { level: number; msg: string }[] = [];
    const log = pino({ level: "debug" }, { write: (s: string) => lines.push(JSON.parse(s) as { level: number; msg: string }) });
    const codes: (string | undefined)[] = [];
    const a = createApp({ log, maxBodyBytes: 1024, onResponse: (c) => void codes.push(c.get("errorCode")) });
    a.get("/sampling", () => {
      throw new SamplingError("top_p must be in (0, 1]", "top_p");
    });
    a.get("/bug", () => {
      throw new TypeError("cannot read properties of undefined");
    });
    a.get("/ok", (c) => c.json({ ok: true }));
    return { app: a, lines, codes };
  }

  it("answers a domain error thrown by a route with its status and records its code", async () => {
    const { app: a, codes } = app();
    const res = await a.request("/sampling");
    expect(res.status).toBe(400);
    expect(await res.json()).toEqual({
      error: { message: "top_p must be in (0, 1]", type: "invalid_request_error", code: "invalid_request", param: "top_p" },
    });
    expect(codes).toEqual(["invalid_request"]);
  });

  it("answers an unexpected error as a 500 and logs it in full", async () => {
    const { app: a, lines, codes } = app();
    const res = await a.request("/bug");
    expect(res.status).toBe(500);
    expect(((await res.json()) as { error: { code: string } }).error.code).toBe("internal_error");
    expect(lines.some((l) => l.level === 50 && l.msg === "request failed")).toBe(true);
    expect(codes).toEqual(["internal_error"]);
  });

  it("classifies only errors no code meant to throw", async () => {
    const log = pino({ level: "silent" });
    const a = createApp({
      log,
      maxBodyBytes: 1024,
      classifyError: () => new ApiError(503, "not_ready", "the registry database is unreachable"),
    });
    const refused = Object.assign(new Error("connect ECONNREFUSED"), { code: "ECONNREFUSED" });
    a.get("/kv", () => {
      throw new ApiError(502, "kv_load_failed", "cannot read the KV (unreachable)", null, undefined, { cause: refused });
    });
    a.get("/db", () => {
      throw refused;
    });
    expect((await a.request("/kv")).status).toBe(502);
    const db = await a.request("/db");
    expect(db.status).toBe(503);
    expect(((await db.json()) as { error: { code: string } }).error.code).toBe("not_ready");
  });

  it("records the code of a route it does not have, and none for a success", async () => {
    const { app: a, codes } = app();
    expect((await a.request("/nowhere")).status).toBe(404);
    expect((await a.request("/ok")).status).toBe(200);
    expect(codes).toEqual(["not_found", undefined]);
  });
});
