// A service's life in the registry: register, heartbeat (and sweep instances that went silent,
// so their shards are retired and their chunks failed), drain, and leave.
import { FailureLog } from "../shared/platform/failure-log.ts";
import { RegistryError } from "../shared/platform/registry/registry.ts";
import type { Runtime } from "./runtime.ts";

export class Membership {
  private timer: NodeJS.Timeout | undefined;
  private beating = false;
  private failures: FailureLog | undefined;

  constructor(
    private readonly rt: Pick<Runtime, "registry" | "config" | "log">,
    readonly role: "prefill" | "decode" | "router",
    readonly id: string,
    readonly baseUrl: string,
    /** A decode's public API, for the router; prefills have none. */
    readonly publicUrl: string | undefined,
    /** Called after the registry declared us dead and we registered again (a prefill needs a new shard epoch). */
    private readonly onRejoined?: () => Promise<void>,
  ) {}

  async start(): Promise<void> {
    const startedAt = this.rt.registry.clock();
    await this.register();
    // Requests of this id's previous life (a restart under the same id) end now, not never.
    const ended = await this.rt.registry.sweep.endPreviousLife(this.id, startedAt);
    if (ended > 0) this.rt.log.warn({ requests: ended }, "ended the open requests this instance's previous life left");
    this.timer = setInterval(() => void this.beat(), this.rt.config.heartbeatMs);
    this.timer.unref();
  }

  private register() {
    return this.rt.registry.instances.register({
      id: this.id,
      role: this.role,
      baseUrl: this.baseUrl,
      ...(this.publicUrl ? { publicUrl: this.publicUrl } : {}),
      hostId: this.rt.config.hostId,
    });
  }

  private async beat(): Promise<void> {
    if (this.beating) return;
    this.beating = true;
    try {
      await this.rt.registry.instances.heartbeat(this.id);
      const dead = await this.rt.registry.instances.markDead(this.rt.config.heartbeatTimeoutMs);
      this.failures?.succeeded();
      if (dead.length > 0) this.rt.log.warn({ dead }, "declared silent instances dead (their shards are retired)");
    } catch (err) {
      if (err instanceof RegistryError && (err.code === "instance_dead" || err.code === "not_found")) {
        this.rt.log.warn("the registry declared this instance dead; registering again");
        try {
          await this.register();
          await this.onRejoined?.();
        } catch (e) {
          this.rt.log.error({ err: e }, "could not register again");
        }
      } else {
        (this.failures ??= new FailureLog(this.rt.log, "heartbeat failed")).failed(err);
      }
    } finally {
      this.beating = false;
    }
  }

  /** No new work is routed here; heartbeats go on while in-flight work finishes. */
  async drain(): Promise<void> {
    await this.rt.registry.instances.markDraining(this.id).catch((err) => this.rt.log.warn({ err }, "could not mark draining"));
  }

  /** Stops heartbeating and marks the instance dead at once (a graceful exit; a crash is found by the sweep). */
  async leave(): Promise<void> {
    clearInterval(this.timer);
    this.timer = undefined;
    await this.rt.registry.instances.leave(this.id).catch((err: unknown) => this.rt.log.warn({ err }, "could not leave the registry"));
  }
}
