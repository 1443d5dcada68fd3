// A periodic task's failures are logged without flooding (shared/platform/failure-log.ts): the
// first whole, then one line per interval with the count, then one line when it works again.
import pino from "pino";
import { describe, expect, it } from "vitest";
import { FailureLog } from "../../shared/platform/failure-log.ts";

describe("FailureLog", () => {
  it("logs the first failure, then a summary per interval, then the recovery", async () => {
    const lines: { level: number; msg: string; failures?: number }[] = [];
    const log = pino({ level: "info" }, { write: (s: string) => void lines.push(JSON.parse(s)) });
    const f = new FailureLog(log, "reaper failed", 200);
    for (let i = 0; i < 50; i++) f.failed(new Error(`db down ${i}`)); // a second's worth, at once
    expect(lines.map((l) => l.msg)).toEqual(["reaper failed"]);
    await new Promise((r) => setTimeout(r, 250));
    f.failed(new Error("db down again"));
    expect(lines.at(-1)).toMatchObject({ msg: "reaper failed (still failing)", failures: 50 });
    f.succeeded();
    f.succeeded();
    expect(lines.map((l) => l.msg)).toEqual(["reaper failed", "reaper failed (still failing)", "reaper failed: works again"]);
  });
});
