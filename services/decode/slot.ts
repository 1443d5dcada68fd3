// A request's place in the decode scheduler: the sequence being decoded and the events it sends
// to its stream (Slot), and the KV memory and batch place it reserved (Reservation).
import type { NativeSequence } from "../../shared/inference/engine/engine.ts";
import type { Sampler } from "../../shared/inference/engine/sampler.ts";
import type { FinishReason } from "../../shared/inference/generate.ts";
import type { TokenTextStream } from "../../shared/inference/text-stream.ts";

export type SlotEvent =
  | { type: "token"; id: number; text: string; index: number }
  | { type: "done"; finish: FinishReason }
  | { type: "error"; error: unknown };

/** A sequence being decoded: its cache, the token to feed next, its sampler and text stream. */
export class Slot {
  private readonly events: SlotEvent[] = [];
  private wake: (() => void) | undefined;
  cancelled = false;
  ended = false;
  /** performance.now() when it last started waiting for a batch place (undefined while in the batch). */
  private waitingSince: number | undefined;
  /** Time spent waiting for a batch place before now: at the start, and while paused for another key. */
  private waitedMs = 0;
  private everWaited = false;
  /** Whose request it is (the API key id): batch places go to the keys in turn. */
  tenant = "local";
  /** When it finishes, the sequence is not freed: its owner keeps it (`kept` then says so). A cancel frees it anyway. */
  keep = false;
  kept = false;

  constructor(
    readonly seq: NativeSequence,
    public last: number,
    readonly sampler: Sampler,
    readonly text: TokenTextStream,
    /** performance.now() when the first token was sent: the pace of the next ones counts from here. */
    readonly firstTokenAt: number = performance.now(),
  ) {}

  push(ev: SlotEvent): void {
    this.events.push(ev);
    const wake = this.wake;
    this.wake = undefined;
    wake?.();
  }

  /** It waits for a batch place (handed to the scheduler, or paused to give its place to another key). */
  wait(now: number = performance.now()): void {
    this.waitingSince = now;
    this.everWaited = true;
  }

  /** It has a place in the batch. */
  join(now: number = performance.now()): void {
    if (this.waitingSince !== undefined) this.waitedMs += now - this.waitingSince;
    this.waitingSince = undefined;
  }

  /** How long it has waited for a batch place in all (so far, if it is waiting now). */
  batchWaitMs(now: number = performance.now()): number {
    if (!this.everWaited) return 0;
    return this.waitedMs + (this.waitingSince === undefined ? 0 : now - this.waitingSince);
  }

  /** The next event; rejects with the signal's reason once the signal fires. */
  async next(signal: AbortSignal): Promise<SlotEvent> {
    while (this.events.length === 0) {
      signal.throwIfAborted();
      await new Promise<void>((resolve) => {
        const onAbort = () => resolve();
        this.wake = () => {
          signal.removeEventListener("abort", onAbort);
          resolve();
        };
        signal.addEventListener("abort", onAbort, { once: true });
      });
    }
    return this.events.shift()!;
  }
}

export class Reservation {
  private released = false;
  constructor(
    private readonly scheduler: { unreserve(bytes: number): void },
    readonly bytes: number,
  ) {}
  release(): void {
    if (this.released) return;
    this.released = true;
    this.scheduler.unreserve(this.bytes);
  }
}
