// Fault points: named stages of the services where a test holds one request for a while, so that
// a kill, SIGSTOP or outage lands at that exact stage (test/services/security-fault-matrix.test.ts,
// test/services/handoff-stream.test.ts). They are armed by a Faults object in the services'
// configuration (Config.faults), which only a test gives: in its own process it passes one to
// startServices; a `ctxbank` process builds one from CTXBANK_FAULT_PAUSE, read once at the process
// boundary (bin/serve.ts). Without one (always, in production) a fault point is an absent optional
// call. The wait is asynchronous: the process keeps serving everything else meanwhile.
import type { Logger } from "pino";

/** The points the services pass. */
export const FAULT_POINTS = {
  /** The prefill registered a chunk row (state `writing`) and is about to write its bytes. */
  "prefill.write": true,
  /** The prefill computed its prompt and is about to write its last block (the earlier ones are committing). */
  "prefill.last": true,
  /** The decode holds read leases on a handle's chunks (state `reading`) and is about to read them. */
  "decode.load": true,
} as const;

export type FaultPoint = keyof typeof FAULT_POINTS;

/** How long the first request to pass each point waits there, in milliseconds. */
export type FaultPauses = Partial<Record<FaultPoint, number>>;

export class Faults {
  private readonly armed: Map<FaultPoint, number>;

  constructor(pauses: FaultPauses) {
    this.armed = new Map(Object.entries(pauses) as [FaultPoint, number][]);
  }

  /** Waits at `point`, logging "fault point reached" first, when a pause is armed there: once (the first request to pass it). */
  async pause(point: FaultPoint, log: Logger): Promise<void> {
    const ms = this.armed.get(point);
    if (ms === undefined) return;
    this.armed.delete(point);
    log.warn({ point, ms }, "fault point reached");
    await new Promise((r) => setTimeout(r, ms));
  }
}
