// A bounded, per-tenant fair queue in front of a stage: `limit` requests run at once, up to
// `capacity` wait, and a free place goes to the waiting tenant served least recently (FIFO within
// a tenant). "Served" counts every place a tenant takes, straight away or after waiting, so a
// tenant that holds places never keeps its turn ahead of a newcomer: a newcomer waits for at most
// one of the places in use to free. `perTenant` caps the places one tenant holds (below `limit`,
// a place is always left for the others). When the queue is full, a newcomer
// whose tenant waits less than the heaviest one takes the place of that tenant's newest waiter
// (who gets the 429): the tenant over its share is refused, the others still fit. Refusals are
// 429 `queue_full` with a Retry-After estimated from the stage's drain rate. A waiter whose
// signal fires leaves the queue at once.
import { ApiError, retryAfter } from "../http/errors.ts";

export interface FairQueueOptions {
  /** Names the stage in messages and metrics (prefill, decode, prefill_calls). */
  stage: string;
  /** Requests running at once. */
  limit: number;
  /** Requests waiting at most (0 = none: a full stage refuses at once). */
  capacity: number;
  /** Places one tenant holds at most (default: limit). Its further requests wait even when places are free. */
  perTenant?: number;
}

interface Waiter {
  tenant: string;
  go(): void;
  refuse(error: ApiError): void;
}

/** Retry-After bounds (seconds): at least one, and never more than a minute of advice. */
const MIN_RETRY_S = 1;
const MAX_RETRY_S = 60;
/** Weight of the newest gap between two releases in the drain-rate estimate. */
const ALPHA = 0.2;

/**
 * How fast a saturated stage frees places: an EWMA of the time between two places coming free
 * while the stage was full (an idle stage's gaps say nothing about its drain rate).
 */
export class DrainRate {
  private last: number | undefined;
  private gapMs: number | undefined;

  /** A place came free; `saturated`: someone was waiting for it (or the stage was full). */
  freed(saturated: boolean, now: number = performance.now()): void {
    if (saturated && this.last !== undefined) {
      const gap = now - this.last;
      this.gapMs = this.gapMs === undefined ? gap : ALPHA * gap + (1 - ALPHA) * this.gapMs;
    }
    this.last = now;
  }

  /** Seconds until `ahead` more places are likely free: 1 to 60, and 1 without an estimate yet. */
  retryAfterSeconds(ahead: number): number {
    if (this.gapMs === undefined) return MIN_RETRY_S;
    return Math.min(MAX_RETRY_S, Math.max(MIN_RETRY_S, Math.ceil((ahead * this.gapMs) / 1000)));
  }
}

/** A 429 queue_full that tells the client when to come back. */
export function queueFull(message: string, retryAfterS: number): ApiError {
  return retryAfter(retryAfterS, new ApiError(429, "queue_full", message));
}

export class FairQueue {
  private active = 0;
  /** Places held per tenant (tenants holding none are absent). */
  private readonly activeBy = new Map<string, number>();
  /** Waiters per tenant, FIFO. */
  private readonly byTenant = new Map<string, Waiter[]>();
  /** When each tenant last took a place (a counter); the least recent waiting tenant goes next. */
  private readonly lastServed = new Map<string, number>();
  private serves = 0;
  private size = 0;
  private readonly drain = new DrainRate();
  /** Refused for want of a place (429), since the start. */
  rejected = 0;

  constructor(readonly options: FairQueueOptions) {}

  get running(): number {
    return this.active;
  }
  runningFor(tenant: string): number {
    return this.activeBy.get(tenant) ?? 0;
  }
  private get perTenant(): number {
    return this.options.perTenant ?? this.options.limit;
  }
  get queued(): number {
    return this.size;
  }
  queuedFor(tenant: string): number {
    return this.byTenant.get(tenant)?.length ?? 0;
  }

  /** Seconds until a place is likely free for a newcomer: the queue ahead at the measured drain rate. */
  retryAfterSeconds(): number {
    return this.drain.retryAfterSeconds(this.size + 1);
  }

  /** Resolves with a release function once the tenant has a place; throws 429 when there is none to wait for. */
  async enter(tenant: string, signal: AbortSignal): Promise<() => void> {
    signal.throwIfAborted();
    if (this.active < this.options.limit && this.size === 0 && this.runningFor(tenant) < this.perTenant) {
      this.take(tenant);
      return this.releaser(tenant);
    }
    if (this.size >= this.options.capacity) this.makeRoom(tenant);
    await new Promise<void>((resolve, reject) => {
      const onAbort = () => {
        this.remove(waiter);
        reject(signal.reason);
      };
      const waiter: Waiter = {
        tenant,
        go: () => {
          signal.removeEventListener("abort", onAbort);
          resolve();
        },
        refuse: (error) => {
          signal.removeEventListener("abort", onAbort);
          reject(error);
        },
      };
      signal.addEventListener("abort", onAbort, { once: true });
      const list = this.byTenant.get(tenant);
      if (list) list.push(waiter);
      else this.byTenant.set(tenant, [waiter]);
      this.size++;
      this.dispatch(); // places may be free (a tenant at its cap was holding the queue)
    });
    return this.releaser(tenant);
  }

  /** The queue is full: push out the newest waiter of a tenant holding more places than `tenant` would, or refuse. */
  private makeRoom(tenant: string): void {
    let heaviest: Waiter[] | undefined;
    for (const list of this.byTenant.values()) if (!heaviest || list.length > heaviest.length) heaviest = list;
    const mine = this.queuedFor(tenant);
    if (this.options.capacity > 0 && heaviest && heaviest.length > mine + 1) {
      const victim = heaviest[heaviest.length - 1]!;
      this.remove(victim);
      this.rejected++;
      victim.refuse(this.full(`its client holds ${heaviest.length + 1} of the ${this.options.capacity} waiting places`));
      return;
    }
    this.rejected++;
    throw this.full(`${this.active} running and ${this.size} waiting`);
  }

  private full(why: string): ApiError {
    const { stage } = this.options;
    const retry = this.retryAfterSeconds();
    return queueFull(`the ${stage} queue is full (${why}); retry in ${retry} s`, retry);
  }

  private remove(waiter: Waiter): void {
    const list = this.byTenant.get(waiter.tenant);
    const i = list?.indexOf(waiter) ?? -1;
    if (!list || i < 0) return;
    list.splice(i, 1);
    this.size--;
    if (list.length === 0) this.byTenant.delete(waiter.tenant);
  }

  /** A place goes to `tenant`: counted, and its turn moves behind every other tenant's. */
  private take(tenant: string): void {
    this.active++;
    this.activeBy.set(tenant, this.runningFor(tenant) + 1);
    this.lastServed.delete(tenant); // re-inserted last: the map stays ordered by recency
    this.lastServed.set(tenant, this.serves++);
    if (this.lastServed.size > 4 * (this.options.limit + this.options.capacity) + 16) {
      // Forget the tenant served longest ago that holds and awaits nothing (it counts as never served).
      for (const t of this.lastServed.keys())
        if (!this.activeBy.has(t) && !this.byTenant.has(t)) {
          this.lastServed.delete(t);
          break;
        }
    }
  }

  /** Gives free places to waiters: each to the least recently served tenant under its cap. */
  private dispatch(): void {
    while (this.active < this.options.limit) {
      let chosen: string | undefined;
      let turn = Infinity;
      for (const tenant of this.byTenant.keys()) {
        if (this.runningFor(tenant) >= this.perTenant) continue;
        const t = this.lastServed.get(tenant) ?? -1;
        if (t < turn) {
          chosen = tenant;
          turn = t;
        }
      }
      if (chosen === undefined) return;
      const list = this.byTenant.get(chosen)!;
      const w = list.shift()!;
      this.size--;
      if (list.length === 0) this.byTenant.delete(chosen);
      this.take(chosen);
      w.go();
    }
  }

  private releaser(tenant: string): () => void {
    let done = false;
    return () => {
      if (done) return;
      done = true;
      this.drain.freed(this.size > 0);
      this.active--;
      const held = this.runningFor(tenant) - 1;
      if (held > 0) this.activeBy.set(tenant, held);
      else this.activeBy.delete(tenant);
      this.dispatch();
    };
  }
}
