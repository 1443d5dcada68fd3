// The import rules as a test. dependency-cruiser checks the rules in .dependency-cruiser.cjs (no
// import loop; the database only behind the registry's stores; shared/inference standalone;
// shared/platform below services; the KV handoff entered only through its face, never reaching
// back into the prefill or decode service; bench, tools and the product never import test code,
// tools never import bench; bin/ reaches services only lazily). The handoff's two rules are also checked on
// the import graph itself, so they cannot be dropped with the configuration. Then `ctxbank
// generate` must not load the HTTP stack: checked on the static import graph from bin/ctxbank.ts
// and on the modules a real run of the CLI resolves.
import { execFile } from "node:child_process";
import { mkdtemp, readFile, rm } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { fileURLToPath, pathToFileURL } from "node:url";
import { promisify } from "node:util";
import type { ICruiseResult } from "dependency-cruiser";
import { describe, expect, it } from "vitest";

const root = fileURLToPath(new URL("../..", import.meta.url));
const run = promisify(execFile);
const CLI = "bin/ctxbank.ts";
const HTTP = /(^|\/)node_modules\/(hono|@hono\/[^/]+)\//;

type Edge = { from: string; to: string };

/** The modules reachable from `entry` over `edges`. */
function reachable(entry: string, edges: Edge[]): Set<string> {
  const next = new Map<string, string[]>();
  for (const e of edges) next.set(e.from, [...(next.get(e.from) ?? []), e.to]);
  const seen = new Set([entry]);
  const todo = [entry];
  while (todo.length > 0) for (const to of next.get(todo.pop()!) ?? []) if (!seen.has(to) && seen.add(to)) todo.push(to);
  return seen;
}

let cruised: Promise<ICruiseResult> | undefined;
/** One dependency-cruiser run over the repository, shared by the tests below. */
function cruise(): Promise<ICruiseResult> {
  cruised ??= runCruise();
  return cruised;
}

async function runCruise(): Promise<ICruiseResult> {
  const args = ["bin", "shared", "services", "tools", "bench", "test", "--output-type", "json"];
  // depcruise exits non-zero when it finds violations; its report is on stdout either way.
  const { stdout } = await run(join(root, "node_modules/.bin/depcruise"), args, { cwd: root, maxBuffer: 256 << 20 }).catch(
    (e: { stdout?: string }) => {
      if (!e.stdout) throw e;
      return { stdout: e.stdout };
    },
  );
  return JSON.parse(stdout) as ICruiseResult;
}

describe("import rules", () => {
  it("dependency-cruiser finds no violation of .dependency-cruiser.cjs", async () => {
    const result = await cruise();
    expect(result.summary.totalCruised).toBeGreaterThan(100); // it really read the repository
    const violations = result.summary.violations.map((v) =>
      v.cycle ? `${v.rule.name}: ${[v.from, ...v.cycle.map((c) => c.name)].join(" → ")}` : `${v.rule.name}: ${v.from} → ${v.to}`,
    );
    expect(violations).toEqual([]);
  });

  it("services/ reaches the KV handoff only through services/handoff/index.ts, and the handoff never reaches into prefill/ or decode/", async () => {
    const result = await cruise();
    const edges = result.modules.flatMap((m) => m.dependencies.map((d) => ({ from: m.source, to: d.resolved })));
    const intoHandoff = edges.filter(
      (e) => e.from.startsWith("services/") && !e.from.startsWith("services/handoff/") && e.to.startsWith("services/handoff/"),
    );
    expect(intoHandoff.length).toBeGreaterThan(0); // the services do use it
    expect(intoHandoff.filter((e) => e.to !== "services/handoff/index.ts")).toEqual([]);
    expect(edges.filter((e) => e.from.startsWith("services/handoff/") && /^services\/(prefill|decode)\//.test(e.to))).toEqual([]);
  });

  it("`ctxbank generate` does not import Hono: the static import graph", async () => {
    const result = await cruise();
    // What loads when bin/ctxbank.ts loads: static imports, not dynamic ones, not type-only ones.
    const edges = result.modules.flatMap((m) =>
      m.dependencies
        .filter((d) => !d.dynamic && !d.dependencyTypes.some((t) => t === "type-only" || t === "type-import"))
        .map((d) => ({ from: m.source, to: d.resolved })),
    );
    const loaded = reachable(CLI, edges);
    expect(loaded.has("shared/inference/generate.ts")).toBe(true);
    expect([...loaded].filter((m) => HTTP.test(m))).toEqual([]);
  });

  it("`ctxbank generate` does not load Hono: the modules a run resolves", async () => {
    const dir = await mkdtemp(join(tmpdir(), "ctxbank-imports-"));
    try {
      const log = join(dir, "imports.tsv");
      // --help runs after every static import of the CLI has loaded, and needs no model.
      const { stdout } = await run(
        process.execPath,
        ["--import", "tsx", "--import", "./test/harness/record-imports.mjs", CLI, "generate", "--help"],
        {
          cwd: root,
          env: { ...process.env, CTXBANK_IMPORT_LOG: log },
        },
      );
      expect(stdout).toMatch(/^Usage: ctxbank generate/);
      const prefix = pathToFileURL(root).href;
      const local = (url: string) => (url.startsWith(prefix) ? url.slice(prefix.length) : url);
      const edges = (await readFile(log, "utf8"))
        .split("\n")
        .filter((line) => line !== "")
        .map((line) => line.split("\t"))
        .map(([from, to]) => ({ from: local(from!), to: local(to!) }));
      const loaded = reachable(CLI, edges);
      expect(loaded.has("shared/inference/generate.ts"), "the hook recorded the CLI's imports").toBe(true);
      expect([...loaded].filter((m) => HTTP.test(m))).toEqual([]);
    } finally {
      await rm(dir, { recursive: true, force: true });
    }
  });
});
