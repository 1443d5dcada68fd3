// The router's one job per request: find where the request's KV already is (a session's holder,
// from the registry), pick a decode (choose.ts), forward it (forward.ts), and try the next choice
// when the picked decode turns out to be gone or draining. The answer carries the choice in
// `x-ctxbank-route: <decode id>; reason=<reason>`, and the metrics count every reason.
import type { HttpBindings } from "@hono/node-server";
import type { Context } from "hono";
import type { Logger } from "pino";
import { collectDefaultMetrics, Registry as Metrics } from "prom-client";
import { defineRouterMetrics } from "../../shared/platform/metrics/definitions.ts";
import type { AppEnv } from "../../shared/platform/http/app.ts";
import { ApiError, withHeaders } from "../../shared/platform/http/errors.ts";
import type { Registry } from "../../shared/platform/registry/registry.ts";
import { messageHashes, type HashedMessage } from "../sessions/message-hashes.ts";
import { chooseDecode, Turns, type Holder, type Route, type RouterPolicy } from "./choose.ts";
import type { DecodePool, DecodeTarget } from "./decode-pool.ts";
import { forward, Unreachable } from "./forward.ts";

/** What in a request can name where its KV is. */
export type KvHint =
  /** A session the client names (x-session-id, session_id; GET/DELETE /v1/sessions/{id}). */
  | { session: string }
  /** A stored response: its chain's session (previous_response_id; DELETE /v1/responses/{id}). */
  | { response: string }
  /** A conversation without a session: the session it continues, if any, by its messages. */
  | { messages: HashedMessage[] }
  | Record<string, never>;

/** Decodes tried for one request at most (the first choice and the next ones when it is gone). */
const MAX_TRIES = 3;

export interface RouterOptions {
  pool: DecodePool;
  registry: Registry;
  /** kv: by where the KV is, then load (choose.ts); round_robin: one decode after another. */
  policy: RouterPolicy;
  /** Requests a holder may have beyond the least loaded decode (choose.ts). */
  imbalance: number;
  /** Deadline for a decode's answer headers and each gap in its body. */
  timeoutMs: number;
  log: Logger;
}

export class Router {
  readonly metrics = new Metrics();
  private readonly m: ReturnType<typeof defineRouterMetrics>;
  private readonly turns = new Turns();

  constructor(private readonly o: RouterOptions) {
    collectDefaultMetrics({ register: this.metrics }); // the process: CPU, memory, event loop
    this.m = defineRouterMetrics([this.metrics], { decodes: () => o.pool.targets() });
  }

  /** Forwards the request in `c` (its body already read as `body`) to the decode `hint` points to. */
  async send(c: Context<AppEnv>, body: string | undefined, hint: KvHint): Promise<Response> {
    const tenant = c.get("tenant");
    const found = this.o.policy === "kv" ? await this.holderOf(tenant, hint) : undefined;
    const tried = new Set<string>();
    const url = new URL(c.req.url);
    const out = {
      method: c.req.method,
      path: url.pathname + url.search,
      headers: c.req.raw.headers,
      body,
      signal: c.req.raw.signal,
      timeoutMs: this.o.timeoutMs,
    };
    // A turn that will park a session where it runs (a named session, a Responses chain); on a
    // decode that did not hold it, a conversation that decode holds from now on (decode-pool.ts).
    const keeps = c.req.method === "POST" && ("session" in hint || "response" in hint || url.pathname === "/v1/responses");
    for (let attempt = 0; attempt < MAX_TRIES; attempt++) {
      const route = this.choose(
        this.o.pool.targets().filter((t) => !tried.has(t.id)),
        found?.holder,
      );
      if (!route) break;
      tried.add(route.target.id);
      // A conversation found by its messages continues the session it repeats: the holder resumes it.
      const extra: Record<string, string> = found?.continues && route.reason === "prefix" ? { "x-session-id": found.continues } : {};
      const done = this.o.pool.dispatched(route.target.id);
      const opens = keeps && route.reason !== "session" && route.reason !== "prefix";
      try {
        const res = await forward(route.target.publicUrl, out, extra);
        this.m.routed.inc({ reason: route.reason });
        res.headers.set("x-ctxbank-route", `${route.target.id}; reason=${route.reason}`);
        releaseWhenSent(c, () => done(opens && res.ok));
        return res;
      } catch (err) {
        done();
        if (!(err instanceof Unreachable)) throw err;
        this.m.retried.inc({ kind: err.kind });
        if (err.kind === "connect") this.o.pool.markDown(route.target.id);
        this.o.log.warn(
          { decode: route.target.id, err: err.message },
          "router: the decode could not take the request; trying the next one",
        );
        if (found?.holder.instanceId === route.target.id) found.holder = { ...found.holder, instanceId: "" }; // gone: the next choice is holder_gone, by load
      }
    }
    this.m.unrouted.inc();
    throw withHeaders(new ApiError(503, "not_ready", "no decode instance can take the request now; retry shortly"), { "retry-after": "1" });
  }

  private choose(targets: DecodeTarget[], holder: Holder | undefined): Route | undefined {
    if (this.o.policy === "kv") return chooseDecode(targets, holder, this.o.imbalance);
    const target = this.turns.take(targets);
    return target && { target, reason: "round_robin" };
  }

  /** The decode holding the hinted KV (from the registry), and the session a conversation continues. */
  private async holderOf(tenant: string, hint: KvHint): Promise<{ holder: Holder; continues?: string } | undefined> {
    const { sessions, responses } = this.o.registry;
    if ("session" in hint) {
      const row = await sessions.get(`${tenant}:${hint.session}`);
      return row && { holder: { instanceId: row.holderInstanceId, by: "session" } };
    }
    if ("response" in hint) {
      const stored = await responses.get(`${tenant}:${hint.response}`, tenant);
      const row = stored && (await sessions.get(stored.sessionId));
      return row && { holder: { instanceId: row.holderInstanceId, by: "session" } };
    }
    if ("messages" in hint && hint.messages.length > 1) {
      const match = await sessions.longestPrefix(tenant, messageHashes(hint.messages), { continued: true });
      return (
        match && {
          holder: { instanceId: match.session.holderInstanceId, by: "prefix" },
          continues: match.session.id.slice(tenant.length + 1),
        }
      );
    }
    return undefined;
  }

  /** Where requests can go now (the router's /ready and its status). */
  targets(): DecodeTarget[] {
    return this.o.pool.targets();
  }
}

/** Calls `done` when the answer's last byte is sent (or the client left); at once without a Node response. */
function releaseWhenSent(c: Context<AppEnv>, done: () => void): void {
  const outgoing = (c.env as Partial<HttpBindings> | undefined)?.outgoing;
  if (outgoing && "once" in outgoing) outgoing.once("close", done);
  else done();
}
