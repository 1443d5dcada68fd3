// Fault points as an object: a Faults holds the first request at an armed point once, logging it,
// and lets every other pass at once; a `ctxbank` process builds one only from CTXBANK_FAULT_PAUSE,
// at its boundary (bin/faults.ts), refusing a malformed one; and nothing in services/ or shared/
// reads a fault, or any test switch, from the environment.
import { readdirSync, readFileSync, statSync } from "node:fs";
import { join } from "node:path";
import type { Logger } from "pino";
import { describe, expect, it } from "vitest";
import { faultsFromEnv } from "../../bin/faults.ts";
import { ConfigError } from "../../shared/platform/config.ts";
import { Faults } from "../../shared/platform/faults.ts";

const ROOT = join(import.meta.dirname, "../..");

function recordingLog(): { log: Logger; warned: unknown[] } {
  const warned: unknown[] = [];
  return { log: { warn: (obj: unknown) => void warned.push(obj) } as unknown as Logger, warned };
}

describe("Faults", () => {
  it("holds the first request at an armed point for its pause, once, and logs it; other points pass at once", async () => {
    const faults = new Faults({ "decode.load": 150 });
    const { log, warned } = recordingLog();
    let t = performance.now();
    await faults.pause("prefill.write", log);
    expect(performance.now() - t).toBeLessThan(50);
    t = performance.now();
    await faults.pause("decode.load", log);
    expect(performance.now() - t).toBeGreaterThanOrEqual(140);
    expect(warned).toEqual([{ point: "decode.load", ms: 150 }]);
    t = performance.now();
    await faults.pause("decode.load", log); // once
    expect(performance.now() - t).toBeLessThan(50);
    expect(warned).toHaveLength(1);
  });
});

describe("CTXBANK_FAULT_PAUSE, read at the process boundary", () => {
  it("unset or empty: no faults", () => {
    expect(faultsFromEnv(undefined)).toBeUndefined();
    expect(faultsFromEnv(" ")).toBeUndefined();
  });

  it("arms the named points", async () => {
    const faults = faultsFromEnv("prefill.write:40, decode.load:0")!;
    const { log, warned } = recordingLog();
    await faults.pause("prefill.last", log);
    await faults.pause("prefill.write", log);
    await faults.pause("decode.load", log);
    expect(warned).toEqual([
      { point: "prefill.write", ms: 40 },
      { point: "decode.load", ms: 0 },
    ]);
  });

  it("refuses an unknown point or a malformed pause, naming the variable", () => {
    for (const bad of ["prefill.writes:10", "decode.load", "decode.load:-1", "decode.load:1,", "x"]) {
      expect(() => faultsFromEnv(bad), bad).toThrow(ConfigError);
      expect(() => faultsFromEnv(bad), bad).toThrow(/CTXBANK_FAULT_PAUSE/);
    }
  });
});

describe("no fault or test switch in the environment of the product", () => {
  function sources(dir: string): string[] {
    return readdirSync(join(ROOT, dir)).flatMap((name) => {
      const rel = join(dir, name);
      if (statSync(join(ROOT, rel)).isDirectory()) return sources(rel);
      return /\.(ts|mjs|js)$/.test(name) ? [rel] : [];
    });
  }

  it("services/ and shared/ name no CTXBANK_*FAULT* or *TEST* variable in a process.env read", () => {
    const reads = ["services", "shared"]
      .flatMap(sources)
      .flatMap((file) =>
        [...readFileSync(join(ROOT, file), "utf8").matchAll(/process\.env(?:\.([A-Z0-9_]+)|\[["']([A-Z0-9_]+)["']\])/g)].map(
          (m) => `${file}: ${m[1] ?? m[2]}`,
        ),
      );
    expect(reads.length).toBeGreaterThan(0); // the scan sees the reads there are (the UCX library's defaults)
    expect(reads.filter((r) => /FAULT|TEST/.test(r.split(": ")[1]!))).toEqual([]);
  });

  it("only bin/faults.ts turns CTXBANK_FAULT_PAUSE into faults, and only bin/serve.ts reads it", () => {
    const files = ["bin", "services", "shared"]
      .flatMap(sources)
      .filter((f) => readFileSync(join(ROOT, f), "utf8").includes("process.env.CTXBANK_FAULT"));
    expect(files).toEqual(["bin/serve.ts"]);
  });
});
