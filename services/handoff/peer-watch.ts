// Aborts calls to an instance as soon as the registry says it is dead: while calls are in flight
// (decode's prefill calls, its chunk reads over HTTP), the instances they go to are looked up
// every heartbeat period, and one that is marked dead, gone, or silent past the heartbeat timeout
// (what the membership sweep declares dead) has its calls aborted with a PeerDeadError. A
// SIGSTOPped peer keeps its sockets open and never answers; without this a call to it would wait
// for its whole deadline.
import { CtxbankError } from "../../shared/inference/errors.ts";
import type { Runtime } from "../runtime.ts";

/** The reason a watched call was aborted: its instance is dead. */
export class PeerDeadError extends CtxbankError<"peer_dead"> {
  static override readonly codes = ["peer_dead"] as const;
  override readonly name = "PeerDeadError";
  constructor(
    readonly instanceId: string,
    message: string,
  ) {
    super("peer_dead", message);
  }
}

export class PeerWatch {
  private readonly calls = new Map<string, Set<AbortController>>();
  private timer: NodeJS.Timeout | undefined;
  private checking = false;

  constructor(private readonly rt: Pick<Runtime, "registry" | "config" | "log">) {}

  /** Watches `instanceId` for the call `ac` until the returned function is called. */
  track(instanceId: string, ac: AbortController): () => void {
    let set = this.calls.get(instanceId);
    if (!set) this.calls.set(instanceId, (set = new Set()));
    set.add(ac);
    if (!this.timer) {
      this.timer = setInterval(() => void this.check(), this.rt.config.heartbeatMs);
      this.timer.unref();
    }
    return () => {
      set.delete(ac);
      if (set.size === 0 && this.calls.get(instanceId) === set) this.calls.delete(instanceId);
      if (this.calls.size === 0) this.stop();
    };
  }

  private async check(): Promise<void> {
    if (this.checking) return;
    this.checking = true;
    try {
      const { heartbeatTimeoutMs } = this.rt.config;
      for (const [id, set] of [...this.calls]) {
        const row = await this.rt.registry.instances.get(id).catch(() => "unknown" as const);
        if (row === "unknown") continue; // the registry itself is down: the call's deadline still bounds it
        const silentMs = row ? Date.now() - row.lastHeartbeatAt.getTime() : Infinity;
        if (row && row.state !== "dead" && silentMs < heartbeatTimeoutMs) continue;
        const why = !row
          ? "is no longer registered"
          : row.state === "dead"
            ? "was declared dead"
            : `has been silent for ${Math.round(silentMs)} ms`;
        this.rt.log.warn({ instance: id, calls: set.size }, "aborting calls to a dead instance");
        for (const ac of set) ac.abort(new PeerDeadError(id, `instance ${id} ${why} (no heartbeat within ${heartbeatTimeoutMs} ms)`));
      }
    } finally {
      this.checking = false;
    }
  }

  stop(): void {
    clearInterval(this.timer);
    this.timer = undefined;
  }
}
