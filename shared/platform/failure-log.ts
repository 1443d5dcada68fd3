// A periodic task's failures, logged without flooding the log: during a database outage a task
// that runs every second would otherwise write a warning with a stack trace every second. The
// first failure is logged whole; then one line per interval with how many failed since and the
// latest message; and one line when the task works again.
import type { Logger } from "pino";
import { safeErrorMessage } from "./http/error-log.ts";

export class FailureLog {
  private failing = false;
  private since = 0;
  private lastLoggedAt = 0;

  constructor(
    private readonly log: Logger,
    /** What failed, as the log line says it ("reaper failed"). */
    private readonly what: string,
    private readonly everyMs = 30_000,
  ) {}

  failed(err: unknown): void {
    const now = Date.now();
    if (!this.failing) {
      this.failing = true;
      this.since = 0;
      this.lastLoggedAt = now;
      this.log.warn({ err }, this.what);
      return;
    }
    this.since++;
    if (now - this.lastLoggedAt < this.everyMs) return;
    this.log.warn({ failures: this.since, latest: safeErrorMessage(err, 300) }, `${this.what} (still failing)`);
    this.since = 0;
    this.lastLoggedAt = now;
  }

  succeeded(): void {
    if (!this.failing) return;
    this.failing = false;
    this.log.info(`${this.what}: works again`);
  }
}
