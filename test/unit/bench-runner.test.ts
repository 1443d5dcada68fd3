// The bench runner (tools/lib/bench-runner.ts): the common flags, where results go, the recorded
// command, and the results writer.
import { mkdtemp, readdir, readFile, rm } from "node:fs/promises";
import os from "node:os";
import { join } from "node:path";
import { describe, expect, it } from "vitest";

import { benchCli, REPO_ROOT, Results } from "../../tools/lib/bench-runner.ts";

const spec = {
  name: "demo",
  script: "npm run bench:demo --",
  options: { steps: { type: "string", default: "8" } },
  quick: "a smoke run",
  replot: true,
} as const;

describe("benchCli", () => {
  it("writes to results/<name> by default, a quick run to a temporary folder, --out where it says", () => {
    expect(benchCli(spec, []).results.dir).toBe(join(REPO_ROOT, "results/demo"));
    const quick = benchCli(spec, ["--quick"]);
    expect(quick.quick).toBe(true);
    expect(quick.results.dir).toBe(join(os.tmpdir(), "ctxbank-bench/demo"));
    expect(benchCli(spec, ["--quick", "--out", "/tmp/x"]).results.dir).toBe("/tmp/x");
  });

  it("parses the bench's own options beside the common ones and records the command", () => {
    const bench = benchCli(spec, ["--steps", "4", "--replot"]);
    expect(bench.values.steps).toBe("4");
    expect(bench.replot).toBe(true);
    expect(bench.command).toBe("npm run bench:demo -- --steps 4 --replot");
    expect(benchCli(spec, []).values.steps).toBe("8");
    expect(benchCli(spec, []).command).toBe("npm run bench:demo");
    const record = benchCli(spec, []).record(["tools"]);
    expect(Object.keys(record)).toEqual(["command", "date", "machine", "git"]);
    expect(record.git.changesUnder).toHaveProperty("tools");
  });

  it("refuses options the bench does not have", () => {
    expect(() => benchCli(spec, ["--nope"])).toThrow(/nope/);
    expect(() => benchCli({ name: "plain", script: "npm run plain --" }, ["--quick"])).toThrow(/quick/);
  });
});

describe("Results", () => {
  it("writes JSON (rounded), markdown and SVG charts, and reads the JSON back", async () => {
    const dir = await mkdtemp(join(os.tmpdir(), "ctxbank-results-"));
    try {
      const results = new Results(join(dir, "nested"));
      await results.json("r", { x: 1 / 3, n: 7 });
      await results.markdown("r", "| a |\n");
      await results.chart("r", "<svg/>");
      expect((await readdir(results.dir)).sort()).toEqual(["r.json", "r.md", "r.svg"]);
      expect(await results.readJson("r")).toEqual({ x: 0.333333, n: 7 });
      expect(await readFile(join(results.dir, "r.svg"), "utf8")).toBe("<svg/>");
      expect(String(new Results(join(REPO_ROOT, "results/engine")))).toBe("results/engine");
    } finally {
      await rm(dir, { recursive: true, force: true });
    }
  });
});
