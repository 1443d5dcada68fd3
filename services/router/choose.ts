// Which decode gets a request. In order: the decode holding the request's session (named by the
// client, or by a stored response it continues), else the one holding the session whose messages
// are the longest prefix of the request's; either unless that decode has `imbalance` more requests
// than the least loaded, when another takes it (and recomputes the history) — SGLang's
// cache-aware routing rule. Without a holder (a new conversation, or its holder gone or busy): of
// the decodes with at most `imbalance` requests beyond the least loaded, the one with the fewest
// conversations — requests in flight plus sessions parked there, whose next turns come back to it
// (a turn in flight is not parked, so each conversation counts once) — then fewer session bytes,
// more free KV, then the id (so equal decodes are used in turn as load moves). Requests in flight
// alone would put every conversation that starts while the decodes are idle on the same one.
// `round_robin` ignores all this, one decode after another: the baseline the benchmark compares with.
import type { Config } from "../../shared/platform/config.ts";
import type { DecodeTarget } from "./decode-pool.ts";

/** Why a request went where it did: a label of the router's metrics and the x-ctxbank-route header. */
export type RouteReason = "session" | "prefix" | "load" | "holder_busy" | "holder_gone" | "round_robin";

export type RouterPolicy = Config["routerPolicy"];

export interface Holder {
  /** The decode instance holding the KV. */
  instanceId: string;
  /** How it was found: the session the request names, or the longest shared message prefix. */
  by: "session" | "prefix";
}

export interface Route {
  target: DecodeTarget;
  reason: RouteReason;
}

/** Round robin's turn: which of the decodes (in id order) is next. */
export class Turns {
  private next = 0;
  take(targets: readonly DecodeTarget[]): DecodeTarget | undefined {
    if (targets.length === 0) return undefined;
    return targets[this.next++ % targets.length];
  }
}

export function chooseDecode(targets: readonly DecodeTarget[], holder: Holder | undefined, imbalance: number): Route | undefined {
  if (targets.length === 0) return undefined;
  // The most requests a decode may have in flight and still be chosen: the holder, or a decode placed by load.
  const ceiling = Math.min(...targets.map((t) => t.load)) + imbalance;
  const least = leastLoaded(targets, ceiling)!;
  if (!holder) return { target: least, reason: "load" };
  const held = targets.find((t) => t.id === holder.instanceId);
  if (!held) return { target: least, reason: "holder_gone" };
  if (held.load > ceiling) return { target: least, reason: "holder_busy" };
  return { target: held, reason: holder.by };
}

/** The conversations a decode has: requests in flight and sessions parked (a turn in flight is not parked). */
function conversations(t: DecodeTarget): number {
  return t.load + t.sessions;
}

/** Of the decodes with at most `ceiling` requests in flight (the least loaded always is one), the first of the best. */
function leastLoaded(targets: readonly DecodeTarget[], ceiling: number): DecodeTarget | undefined {
  let best: DecodeTarget | undefined;
  for (const t of targets) if (t.load <= ceiling && (!best || better(t, best))) best = t;
  return best;
}

/** Fewer conversations, then fewer session bytes, then more free KV. */
function better(a: DecodeTarget, b: DecodeTarget): boolean {
  const ca = conversations(a);
  const cb = conversations(b);
  if (ca !== cb) return ca < cb;
  if (a.sessionBytes !== b.sessionBytes) return a.sessionBytes < b.sessionBytes;
  return a.kvFree > b.kvFree;
}
