// A bounded, per-tenant fair queue in front of a stage: `limit` requests run at once, up to
// `capacity` wait, and a free place goes to the tenants in turn (round robin over the tenants
// that have someone waiting, FIFO within a tenant), so one client's burst of long prompts does not
// make another client's short request wait behind all of it. When the queue is full, a newcomer
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

/** A 429 queue_full that tells the client when to come back. */
export function queueFull(message: string, retryAfterS: number): ApiError {
  return retryAfter(retryAfterS, new ApiError(429, "queue_full", message));
}

export class FairQueue {
  private active = 0;
  /** Waiters per tenant; the map's order is the round-robin order (a served tenant moves to the back). */
  private readonly byTenant = new Map<string, Waiter[]>();
  private size = 0;
  private lastRelease: number | undefined;
  /** EWMA of the time between two releases (ms): how fast the stage drains. */
  private gapMs: number | undefined;
  /** Refused for want of a place (429), since the start. */
  rejected = 0;

  constructor(readonly options: FairQueueOptions) {}

  get running(): number {
    return this.active;
  }
  get queued(): number {
    return this.size;
  }
  queuedFor(tenant: string): number {
    return this.byTenant.get(tenant)?.length ?? 0;
  }

  /** Seconds until a place is likely free for a newcomer: the queue ahead at the measured drain rate. */
  retryAfterSeconds(): number {
    if (this.gapMs === undefined) return MIN_RETRY_S;
    const s = Math.ceil(((this.size + 1) * this.gapMs) / 1000);
    return Math.min(MAX_RETRY_S, Math.max(MIN_RETRY_S, s));
  }

  /** Resolves with a release function once the tenant has a place; throws 429 when there is none to wait for. */
  async enter(tenant: string, signal: AbortSignal): Promise<() => void> {
    signal.throwIfAborted();
    if (this.active < this.options.limit && this.size === 0) {
      this.active++;
      return this.releaser();
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
    });
    return this.releaser();
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

  /** The next waiter in round-robin order over the tenants; its tenant moves to the back of the turn. */
  private next(): Waiter | undefined {
    for (const [tenant, list] of this.byTenant) {
      const w = list.shift()!;
      this.size--;
      this.byTenant.delete(tenant);
      if (list.length > 0) this.byTenant.set(tenant, list);
      return w;
    }
    return undefined;
  }

  private releaser(): () => void {
    let done = false;
    return () => {
      if (done) return;
      done = true;
      const now = performance.now();
      // Only a saturated stage's releases tell its drain rate (an idle gap says nothing).
      if (this.size > 0 && this.lastRelease !== undefined) {
        const gap = now - this.lastRelease;
        this.gapMs = this.gapMs === undefined ? gap : ALPHA * gap + (1 - ALPHA) * this.gapMs;
      }
      this.lastRelease = now;
      const next = this.next();
      if (next) next.go(); // the place passes straight to the next waiter
      else this.active--;
    };
  }
}
