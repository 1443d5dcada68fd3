// Crash cleanup, run by every live prefill: what a dead instance (crashed, killed, or restarted
// under another id) left behind — its shard files in this host's shard directory, its chunk rows
// and refs, the requests it left open — and old rows past their retention. Only instances dead
// for longer than the heartbeat timeout are touched, every step is idempotent, and several
// sweepers (one per prefill) may run at once.
import { lstat, unlink } from "node:fs/promises";
import path from "node:path";
import type { Logger } from "pino";
import { removeOwnerMark } from "./shard/owner-mark.ts";
import { parseShardFileName, removeOrphanShardFiles } from "./shard/shard.ts";
import type { Registry } from "../../shared/platform/registry/registry.ts";

export interface SweepSettings {
  hostId: string;
  shardDir: string;
  /** An instance must be dead this long (past its last heartbeat) before its litter is swept. */
  graceMs: number;
  /** A handle not taken this long after its prefill is abandoned. */
  unclaimedMs: number;
  /** Ended requests, and instances dead this long, are deleted. */
  retentionMs: number;
}

export interface SweepReport {
  files: string[];
  chunks: number;
  requestsEnded: number;
  requestsPruned: number;
  instancesPruned: number;
}

export class Sweeper {
  constructor(
    private readonly registry: Registry,
    private readonly settings: SweepSettings,
    private readonly log: Logger,
  ) {}

  async sweep(): Promise<SweepReport> {
    const { graceMs, unclaimedMs, retentionMs } = this.settings;
    const files = await this.sweepFiles();
    const chunks = await this.registry.sweep.deleteDeadChunks(graceMs);
    const requestsEnded = await this.registry.sweep.finaliseOrphans({ graceMs, unclaimedMs });
    // A dead instance's shard rows name the files to sweep: never prune them before the grace,
    // whatever the retention (a retention shorter than the grace left the files forever).
    const pruned = await this.registry.sweep.prune(retentionMs, Math.max(retentionMs, 2 * graceMs));
    const report = { files, chunks, requestsEnded, requestsPruned: pruned.requests, instancesPruned: pruned.instances };
    if (files.length + chunks + requestsEnded + pruned.requests + pruned.instances > 0)
      this.log.info(report, "swept dead instances' litter");
    return report;
  }

  /**
   * Deletes dead instances' shard files on this host: only a file in our shard directory, named
   * for that shard and epoch, that is still the very file (device:inode) its owner registered;
   * and the files whose marked owner process is gone.
   */
  private async sweepFiles(): Promise<string[]> {
    const dir = path.resolve(this.settings.shardDir);
    const removed: string[] = [];
    for (const s of await this.registry.sweep.deadShards(this.settings.hostId, this.settings.graceMs)) {
      const file = path.resolve(s.path);
      const named = parseShardFileName(path.basename(file));
      if (!s.fileId || path.dirname(file) !== dir || named?.shardId !== s.shardId || named.epoch !== s.epoch) continue;
      const st = await lstat(file, { bigint: true }).catch((e: NodeJS.ErrnoException) =>
        e.code === "ENOENT" ? undefined : Promise.reject(e),
      );
      if (!st?.isFile() || `${st.dev}:${st.ino}` !== s.fileId) continue;
      // A decode that still maps it keeps its pages until it unmaps; nobody new can open it.
      const gone = await unlink(file).then(
        () => true,
        (e: NodeJS.ErrnoException) => (e.code === "ENOENT" ? false : Promise.reject(e)), // another sweeper was first
      );
      if (gone) removed.push(file);
      await removeOwnerMark(file);
    }
    // Files of owners that died without the registry knowing them (owner-mark.ts).
    removed.push(...(await removeOrphanShardFiles(dir)));
    return removed;
  }
}
