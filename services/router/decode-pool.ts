// The decodes a router can send requests to, and how loaded each is. Every poll reads the live
// decodes from the registry (alive, heartbeating, with a public URL) and each one's status on its
// internal listener (requests in flight, KV reserved of its budget, sessions parked and their
// bytes). Between polls the router adds what it sent and subtracts what finished, and a new
// conversation's first turn that finished there counts as a parked session, so a burst does not
// all land on the decode that looked idle a second ago, nor do conversations that start within one
// poll. A decode that refuses connections is set aside until a poll finds it again.
import type { Logger } from "pino";
import { request } from "undici";
import { z } from "zod";
import type { Registry } from "../../shared/platform/registry/registry.ts";

/** What the router knows of one decode. */
export interface DecodeTarget {
  id: string;
  /** Where clients' requests go (the decode's public listener). */
  publicUrl: string;
  /** Its internal listener (status). */
  internalUrl: string;
  /** Requests in flight there at the last poll, plus those sent since, less those finished since. */
  load: number;
  /** KV bytes still free of its decode budget at the last poll (Infinity when its status was not read). */
  kvFree: number;
  /** Sessions parked there at the last poll, plus the new conversations the router placed there that finished since. */
  sessions: number;
  /** KV bytes of the sessions parked there at the last poll (memory and disk). */
  sessionBytes: number;
}

// The part of a decode's internal status the router reads (services/decode/service.ts status()).
const DecodeStatus = z.object({
  state: z.string(),
  requests_in_flight: z.number().int().min(0),
  kv_reserved_bytes: z.number().min(0),
  kv_budget_bytes: z.number().min(0),
  // Absent from a decode of a version before it (none counted).
  sessions: z.object({ count: z.number().int().min(0), bytes: z.number().min(0) }).optional(),
});

interface Entry extends DecodeTarget {
  /** Requests sent since the last poll that read this decode's status. */
  sent: number;
  /** New conversations sent there since the last poll whose first turn has finished (parked: not in flight). */
  parked: number;
  /** Set when a connection to it failed: skipped until a poll lists it again after this time. */
  downUntil: number;
}

export interface DecodePoolOptions {
  registry: Registry;
  /** Bearer token of the decodes' internal status (the shared secret). */
  internalSecret: string;
  heartbeatTimeoutMs: number;
  pollMs: number;
  log: Logger;
}

export class DecodePool {
  private entries = new Map<string, Entry>();
  private timer: NodeJS.Timeout | undefined;
  private polling: Promise<void> | undefined;
  private lastPollOk = false;

  constructor(private readonly o: DecodePoolOptions) {}

  /** Polls now and then every pollMs. */
  async start(): Promise<void> {
    await this.poll();
    this.timer = setInterval(() => void this.poll(), this.o.pollMs);
    this.timer.unref();
  }

  stop(): void {
    clearInterval(this.timer);
    this.timer = undefined;
  }

  /** The decodes requests may go to now, in id order. */
  targets(): DecodeTarget[] {
    const now = performance.now();
    return [...this.entries.values()]
      .filter((e) => e.downUntil <= now)
      .map(({ id, publicUrl, internalUrl, load, kvFree, sessions, sessionBytes }) => ({
        id,
        publicUrl,
        internalUrl,
        load,
        kvFree,
        sessions,
        sessionBytes,
      }));
  }

  /** Whether the registry answered the last poll (the router's /ready). */
  get healthy(): boolean {
    return this.lastPollOk;
  }

  /**
   * A request went to `id`; call the returned function when it ends, with `parked` true when it was
   * a new conversation's turn that left its session there (the decode did not hold it before).
   */
  dispatched(id: string): (parked?: boolean) => void {
    const e = this.entries.get(id);
    if (!e) return () => {};
    e.load++;
    e.sent++;
    let done = false;
    return (parked = false) => {
      if (done) return;
      done = true;
      // The next poll's counts replace the estimate; until then the finished request comes off the
      // load, and a conversation it started moves from in flight to parked (its next turn comes here).
      const now = this.entries.get(id);
      if (!now) return;
      now.load = Math.max(0, now.load - 1);
      if (parked) {
        now.sessions++;
        now.parked++;
      }
    };
  }

  /** A connection to `id` failed: no request goes there until a poll finds it alive after a pause. */
  markDown(id: string): void {
    const e = this.entries.get(id);
    if (e) e.downUntil = performance.now() + Math.max(this.o.pollMs, this.o.heartbeatTimeoutMs / 2);
  }

  /** One poll: the live decodes from the registry, then each one's status (in parallel, bounded by pollMs). */
  poll(): Promise<void> {
    this.polling ??= this.pollOnce().finally(() => (this.polling = undefined));
    return this.polling;
  }

  private async pollOnce(): Promise<void> {
    let rows;
    try {
      rows = await this.o.registry.instances.findAlive("decode", this.o.heartbeatTimeoutMs);
      this.lastPollOk = true;
    } catch (err) {
      this.lastPollOk = false;
      this.o.log.warn({ err }, "router: could not read the decodes from the registry (routing on the last known set)");
      return;
    }
    const next = new Map<string, Entry>();
    for (const row of rows) {
      if (!row.publicUrl) continue; // registered by a version that did not publish its public API
      const old = this.entries.get(row.id);
      next.set(
        row.id,
        old
          ? { ...old, publicUrl: row.publicUrl, internalUrl: row.baseUrl, sent: 0, parked: 0 }
          : {
              id: row.id,
              publicUrl: row.publicUrl,
              internalUrl: row.baseUrl,
              load: 0,
              kvFree: Infinity,
              sessions: 0,
              sessionBytes: 0,
              sent: 0,
              parked: 0,
              downUntil: 0,
            },
      );
    }
    this.entries = next;
    await Promise.all([...next.values()].map((e) => this.readStatus(e)));
  }

  private async readStatus(e: Entry): Promise<void> {
    const sentBefore = e.sent;
    const parkedBefore = e.parked;
    try {
      const res = await request(`${e.internalUrl}/v1/decode/status`, {
        headers: { authorization: `Bearer ${this.o.internalSecret}` },
        headersTimeout: this.o.pollMs,
        bodyTimeout: this.o.pollMs,
      });
      const body = await res.body.json();
      if (res.statusCode !== 200) throw new Error(`status ${res.statusCode}`);
      const s = DecodeStatus.parse(body);
      // What was sent while the status was on its way is not in it yet.
      e.load = s.requests_in_flight + (e.sent - sentBefore);
      e.kvFree = Math.max(0, s.kv_budget_bytes - s.kv_reserved_bytes);
      e.sessions = (s.sessions?.count ?? 0) + (e.parked - parkedBefore);
      e.sessionBytes = s.sessions?.bytes ?? 0;
      if (s.state === "ready") e.downUntil = 0;
    } catch (err) {
      // Alive in the registry but not answering: keep routing to it on the estimate (its
      // heartbeat says it lives); a refused connection on a request sets it aside.
      this.o.log.debug({ err, decode: e.id }, "router: decode status unreadable");
    }
  }
}
