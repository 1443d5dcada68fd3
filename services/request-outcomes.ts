// Records how a request ended — its hold on its chunks released, its row finished — and keeps
// retrying, every heartbeat period, when the registry cannot take it (a database outage, a query
// deadline). A row left open by an instance that stays alive is one no sweep ends (the sweep only
// ends dead instances' requests), and its chunks would be kept with it.
import type { Logger } from "pino";
import { RegistryError } from "../shared/platform/registry/registry.ts";
import type { Runtime } from "./runtime.ts";

export interface RequestOutcome {
  state: "done" | "failed" | "cancelled";
  error?: string;
  outputTokens?: number;
}

/** Retries are dropped after this many (about an hour at the default heartbeat) with an error logged. */
const MAX_ATTEMPTS = 1_800;

export class RequestOutcomes {
  private readonly pending = new Map<string, { outcome: RequestOutcome; attempts: number }>();
  private timer: NodeJS.Timeout | undefined;
  private retrying = false;

  constructor(private readonly rt: Pick<Runtime, "registry" | "config" | "log">) {}

  /** Requests whose outcome is still waiting for the registry. */
  get backlog(): number {
    return this.pending.size;
  }

  /** Releases the request's chunks and finishes its row now, or retries until the registry takes it. */
  async record(requestId: string, outcome: RequestOutcome, log: Logger = this.rt.log): Promise<void> {
    if (await this.attempt(requestId, outcome, log)) return;
    this.pending.set(requestId, { outcome, attempts: 1 });
    this.timer ??= setInterval(() => void this.retry(), this.rt.config.heartbeatMs);
    this.timer.unref();
  }

  private async attempt(requestId: string, outcome: RequestOutcome, log: Logger): Promise<boolean> {
    try {
      await this.rt.registry.chunks.releaseRequest(requestId);
      await this.rt.registry.requests.finish(requestId, outcome);
      return true;
    } catch (err) {
      // Ended already (by the sweep, or another path) or pruned: nothing left to record.
      if (err instanceof RegistryError && (err.code === "wrong_state" || err.code === "not_found")) return true;
      log.warn({ err, requestId }, "could not record the request's outcome; retrying");
      return false;
    }
  }

  private async retry(): Promise<void> {
    if (this.retrying) return;
    this.retrying = true;
    try {
      for (const [id, p] of this.pending) {
        if (await this.attempt(id, p.outcome, this.rt.log)) this.pending.delete(id);
        else if (++p.attempts >= MAX_ATTEMPTS) {
          this.pending.delete(id);
          this.rt.log.error({ requestId: id }, "gave up recording the request's outcome");
        }
      }
    } finally {
      this.retrying = false;
      if (this.pending.size === 0) this.stop();
    }
  }

  stop(): void {
    clearInterval(this.timer);
    this.timer = undefined;
  }
}
