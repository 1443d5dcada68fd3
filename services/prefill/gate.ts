// Admission for prefills: `limit` run at once, up to `queue` wait (FIFO), beyond that 429.
// A waiter whose client goes away leaves the queue at once.
import { ApiError } from "../../shared/http/errors.ts";

export class Gate {
  private active = 0;
  private readonly waiting: Array<{ go: () => void }> = [];

  constructor(
    private readonly limit: number,
    private readonly queue: number,
  ) {}

  get running(): number {
    return this.active;
  }
  get queued(): number {
    return this.waiting.length;
  }

  /** Resolves with a release function once a slot is free. */
  async enter(signal: AbortSignal): Promise<() => void> {
    signal.throwIfAborted();
    if (this.active < this.limit) {
      this.active++;
      return this.releaser();
    }
    if (this.waiting.length >= this.queue) {
      throw new ApiError(429, "queue_full", `${this.active} prefills are running and ${this.waiting.length} waiting; retry later`);
    }
    await new Promise<void>((resolve, reject) => {
      const entry = {
        go: () => {
          signal.removeEventListener("abort", onAbort);
          resolve();
        },
      };
      const onAbort = () => {
        const i = this.waiting.indexOf(entry);
        if (i >= 0) this.waiting.splice(i, 1);
        reject(signal.reason);
      };
      signal.addEventListener("abort", onAbort, { once: true });
      this.waiting.push(entry);
    });
    return this.releaser();
  }

  private releaser(): () => void {
    let done = false;
    return () => {
      if (done) return;
      done = true;
      const next = this.waiting.shift();
      if (next) next.go(); // the slot passes straight to the next waiter
      else this.active--;
    };
  }
}
