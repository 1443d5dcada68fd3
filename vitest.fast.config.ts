// `npm run test:fast`: the suites that need no model, no service process and no PostgreSQL server,
// in well under two minutes. A test file is slow when its imports (static or dynamic, not
// type-only, followed through helpers) reach one of SLOW_MODULES; the list is worked out from the
// import graph on each run, so a new test file lands on the right side without being listed.
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
  const json = execFileSync(`${root}node_modules/.bin/depcruise`, ["test", "--output-type", "json"], { cwd: root, maxBuffer: 256 << 20, encoding: "utf8" });
  const { modules } = JSON.parse(json) as ICruiseResult;
  const imports = new Map(
    modules.map((m) => [m.source, m.dependencies.filter((d) => !d.dependencyTypes.includes("type-only")).map((d) => d.resolved)]),
  );
  const reachesSlow = (file: string) => {
    const seen = new Set([file]);
    const todo = [file];
    while (todo.length > 0) {
      for (const next of imports.get(todo.pop()!) ?? []) {
        if (SLOW_MODULES.includes(next)) return true;
        if (!seen.has(next)) todo.push(next), seen.add(next);
      }
    }
    return false;
  };
  const tests = modules.map((m) => m.source).filter((s) => /^test\/.*\.test\.ts$/.test(s));
  return tests.filter((t) => !reachesSlow(t)).sort();
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
