// The registry the services share: instances, shards, chunks and requests over one database.
import { systemClock, type Clock } from "./clock.ts";
import type { Database } from "./db.ts";
import { ChunkStore } from "./chunks.ts";
import { InstanceStore } from "./instances.ts";
import { RequestStore } from "./requests.ts";
import { ResponseStore } from "./responses.ts";
import { SessionRegistry } from "./sessions.ts";
import { ShardStore } from "./shards.ts";
import { SweepStore } from "./sweep.ts";

export class Registry {
  readonly instances: InstanceStore;
  readonly shards: ShardStore;
  readonly chunks: ChunkStore;
  readonly requests: RequestStore;
  readonly sweep: SweepStore;
  readonly sessions: SessionRegistry;
  readonly responses: ResponseStore;
  /** The registry's time (the system clock, or a test's). */
  readonly clock: Clock;

  constructor(db: Database, options: { clock?: Clock } = {}) {
    const clock = options.clock ?? systemClock;
    this.clock = clock;
    this.instances = new InstanceStore(db, clock);
    this.shards = new ShardStore(db, clock);
    this.chunks = new ChunkStore(db, clock);
    this.requests = new RequestStore(db, clock);
    this.sweep = new SweepStore(db, clock);
    this.sessions = new SessionRegistry(db, clock);
    this.responses = new ResponseStore(db, clock);
  }
}

export { RegistryError, type RegistryErrorCode } from "./errors.ts";
export type { BeginChunkInput, BeginChunkResult, FreedRange, LeasedChunk } from "./chunks.ts";
export type { RegisterInstanceInput } from "./instances.ts";
export type { RequestMilestone } from "./requests.ts";
export type { DeadShard } from "./sweep.ts";
export type { ChunkRow, InstanceRow, RequestRow, ResponseRow, SessionRow, ShardRow } from "./schema.ts";
export type { PrefixHolder } from "./sessions.ts";
