// `npm run test:fast`: the suites that need no model, no service process and no PostgreSQL server,
// in well under two minutes: test/unit/, and the test/deploy/ files that load none of them (the
// dashboard's browser test starts services). A test file is slow when its imports (static or
// dynamic, not type-only, followed through the harness) reach one of SLOW_MODULES; the import graph
// is worked out on each run, and a test/unit/ file that is slow fails the run, naming what it
// reaches: it belongs in test/engine/ or test/services/ (docs/development.md: the test layout).
import { execFileSync } from "node:child_process";
import { fileURLToPath } from "node:url";
import type { ICruiseResult } from "dependency-cruiser";
import { defineConfig } from "vitest/config";
import base from "./vitest.config.ts";

const SLOW_MODULES = [
  "shared/inference/model/resolve.ts", // finds (or downloads) the real model GGUF
  "tools/lib/services.ts", // runs service processes, which load the model
  "tools/lib/postgres.ts", // starts a PostgreSQL server
];

function fastTestFiles(): string[] {
  const root = fileURLToPath(new URL(".", import.meta.url));
  const json = execFileSync(`${root}node_modules/.bin/depcruise`, ["test/unit", "test/deploy", "--output-type", "json"], {
    cwd: root,
    maxBuffer: 256 << 20,
    encoding: "utf8",
  });
  const { modules } = JSON.parse(json) as ICruiseResult;
  const imports = new Map(
    modules.map((m) => [m.source, m.dependencies.filter((d) => !d.dependencyTypes.includes("type-only")).map((d) => d.resolved)]),
  );
  /** The first slow module `file` reaches, if any. */
  const slowReached = (file: string): string | undefined => {
    const seen = new Set([file]);
    const todo = [file];
    while (todo.length > 0) {
      for (const next of imports.get(todo.pop()!) ?? []) {
        if (SLOW_MODULES.includes(next)) return next;
        if (seen.has(next)) continue;
        todo.push(next);
        seen.add(next);
      }
    }
    return undefined;
  };
  const tests = modules.map((m) => m.source).filter((s) => /^test\/(unit|deploy)\/.*\.test\.ts$/.test(s));
  const misplaced = tests.filter((t) => t.startsWith("test/unit/") && slowReached(t) !== undefined);
  if (misplaced.length > 0) {
    throw new Error(
      `test/unit/ holds tests that need no model, services or PostgreSQL, but ${misplaced.map((t) => `${t} reaches ${slowReached(t)}`).join("; ")}: move it to test/engine/ or test/services/`,
    );
  }
  return tests.filter((t) => slowReached(t) === undefined).sort();
}

export default defineConfig({
  ...base,
  test: {
    ...base.test,
    include: fastTestFiles(),
    // No real model is loaded here: two files at a time fit the smallest machine.
    fileParallelism: true,
    maxWorkers: 2,
  },
});
