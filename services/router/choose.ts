// Which decode gets a request. In order: the decode holding the request's session (named by the
// client, or by a stored response it continues), else the one holding the session whose messages
// are the longest prefix of the request's; either unless that decode has `imbalance` more requests
// than the least loaded, when the least loaded takes it (and recomputes the history) — SGLang's
// cache-aware routing rule. Without a holder: the least loaded, more free KV breaking a tie, then
// the id (so equal decodes are used in turn as load moves). `round_robin` ignores both, one
// decode after another: the baseline the benchmark compares with.
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
  const least = leastLoaded(targets);
  if (!least) return undefined;
  if (!holder) return { target: least, reason: "load" };
  const held = targets.find((t) => t.id === holder.instanceId);
  if (!held) return { target: least, reason: "holder_gone" };
  if (held.load > least.load + imbalance) return { target: least, reason: "holder_busy" };
  return { target: held, reason: holder.by };
}

function leastLoaded(targets: readonly DecodeTarget[]): DecodeTarget | undefined {
  let best: DecodeTarget | undefined;
  for (const t of targets) {
    if (!best || t.load < best.load || (t.load === best.load && t.kvFree > best.kvFree)) best = t;
  }
  return best;
}
