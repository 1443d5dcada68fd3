// Test-only fault points: `CTXBANK_FAULT_PAUSE=<point>:<ms>[,<point>:<ms>…]` makes the first
// request (per process) that passes a named point wait there `ms` milliseconds, logging
// "fault point reached" first, so a test can land a kill, SIGSTOP or outage at that exact stage
// (test/services/security-fault-matrix.test.ts). Unset (the default), a fault point costs one map lookup.
// The wait is asynchronous: the process keeps serving everything else meanwhile.
import type { Logger } from "pino";

/** The points the services pass. */
export type FaultPoint =
  /** The prefill registered a chunk row (state `writing`) and is about to write its bytes. */
  | "prefill.write"
  /** The prefill computed its prompt and is about to write its last block (the earlier ones are committing). */
  | "prefill.last"
  /** The decode holds read leases on a handle's chunks (state `reading`) and is about to read them. */
  | "decode.load";

let armed: Map<string, number> | undefined;

function parse(spec: string | undefined): Map<string, number> {
  const points = new Map<string, number>();
  for (const part of (spec ?? "").split(",")) {
    const m = /^\s*([a-z]+\.[a-z]+):(\d+)\s*$/.exec(part);
    if (m) points.set(m[1]!, Number(m[2]));
  }
  return points;
}

/** Waits here once when CTXBANK_FAULT_PAUSE names this point. */
export async function faultPoint(point: FaultPoint, log: Logger): Promise<void> {
  armed ??= parse(process.env.CTXBANK_FAULT_PAUSE);
  const ms = armed.get(point);
  if (ms === undefined) return;
  armed.delete(point); // once per process
  log.warn({ point, ms }, "fault point reached");
  await new Promise((r) => setTimeout(r, ms));
}
