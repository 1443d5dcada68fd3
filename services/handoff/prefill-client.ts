// Decode's side of the prefill call: pick a live prefill instance from the registry (this host's
// first, then round robin), POST /v1/prefill over a keep-alive undici pool, and turn its answer
// into a validated handle. A refused or broken connection moves on to the next instance; an
// instance's 4xx is the client's error and is passed on as it is.
//
// Calls wait their turn in a bounded queue that is fair across keys (a full one answers 429
// queue_full with Retry-After), so waiting is visible here rather than hidden in the pool. Each
// call has a deadline (504 prefill_timeout) and is aborted as soon as the registry declares its
// instance dead (502 prefill_failed). The key travels in the call's signed capability, so the prefill's own queue is fair too.
import { Pool } from "undici";
import { LOCAL_TENANT } from "../../shared/platform/auth/api-keys.ts";
import { InternalAuth } from "../../shared/platform/auth/capability.ts";
import { ApiError, type ApiErrorCode, type ApiStatus } from "../../shared/platform/http/errors.ts";
import { HandleSchema, type Handle, type PrefillRequest } from "../../shared/platform/http/wire.ts";
import { FairQueue } from "../../shared/platform/queue/fair-queue.ts";
import { handleLines, type HandleProgress } from "./handle-stream.ts";
import type { InstanceRow } from "../../shared/platform/registry/registry.ts";
import type { Runtime } from "../runtime.ts";
import { PeerDeadError, type PeerWatch } from "./peer-watch.ts";

const PASS_THROUGH = new Set([400, 404, 409, 413, 429]);
/** How long a prefill capability is valid: it only has to reach the instance. */
const CAPABILITY_MS = 60_000;

/** The default deadline of a prefill call: a minute of queueing plus a full context at ~50 tokens/s. */
export function defaultPrefillTimeoutMs(maxContext: number): number {
  return 60_000 + 20 * maxContext;
}

export class PrefillClient {
  private readonly pools = new Map<string, Pool>();
  private turn = 0;
  readonly queue: FairQueue;
  private readonly peers: PeerWatch;
  readonly timeoutMs: number;
  /** HTTP calls made to prefill instances since the start. */
  calls = 0;

  constructor(
    private readonly rt: Runtime,
    private readonly auth: InternalAuth | undefined,
    peers: PeerWatch,
  ) {
    const c = rt.config;
    // One key holds all prefill calls but one: another key's prompt is sent at once.
    this.queue = new FairQueue({
      stage: "prefill_calls",
      limit: c.maxPrefillCalls,
      capacity: c.maxPrefillCallQueue,
      perTenant: Math.max(1, c.maxPrefillCalls - 1),
    });
    this.peers = peers;
    this.timeoutMs = c.prefillTimeoutMs ?? defaultPrefillTimeoutMs(rt.engine.maxContext);
  }

  /**
   * Prefills `body` on some instance's internal listener for `tenant` (a signed capability says so); `signal` is the client's.
   * With `progress`, the handle is streamed (services/handoff/handle-stream.ts): its start and each chunk are reported as they commit.
   */
  async prefill(body: PrefillRequest, signal: AbortSignal, tenant: string = LOCAL_TENANT, progress?: HandleProgress): Promise<Handle> {
    const deadline = AbortSignal.timeout(this.timeoutMs);
    const bounded = AbortSignal.any([signal, deadline]);
    const timedOut = () =>
      new ApiError(504, "prefill_timeout", `the prefill did not answer within ${this.timeoutMs} ms (--prefill-timeout-ms); retry later`);
    let leave: () => void;
    try {
      leave = await this.queue.enter(tenant, bounded);
    } catch (e) {
      throw deadline.aborted && !signal.aborted ? timedOut() : e;
    }
    try {
      return await this.call(progress ? { ...body, stream: true } : body, bounded, tenant, progress);
    } catch (e) {
      if (deadline.aborted && !signal.aborted) throw timedOut();
      throw e;
    } finally {
      leave();
    }
  }

  private async call(body: PrefillRequest, signal: AbortSignal, tenant: string, progress?: HandleProgress): Promise<Handle> {
    const alive = await this.rt.registry.instances.findAlive("prefill", this.rt.config.heartbeatTimeoutMs);
    signal.throwIfAborted();
    if (alive.length === 0) {
      throw new ApiError(503, "no_prefill_instance", "no prefill instance is alive in the registry; start one (ctxbank prefill) or retry");
    }
    const failures: string[] = [];
    let serverError = false;
    for (const inst of this.order(alive).slice(0, 3)) {
      signal.throwIfAborted();
      // Aborted by the client, the deadline, or the registry declaring the instance dead.
      const ac = new AbortController();
      const onAbort = () => ac.abort(signal.reason);
      signal.addEventListener("abort", onAbort, { once: true });
      const untrack = this.peers.track(inst.id, ac);
      try {
        let res;
        try {
          this.calls++;
          res = await this.poolFor(inst.baseUrl).request({
            method: "POST",
            path: new URL(inst.baseUrl).pathname.replace(/\/+$/, "") + "/v1/prefill",
            headers: {
              "content-type": "application/json",
              ...(this.auth
                ? {
                    authorization: `Bearer ${this.auth.sign({ route: "prefill", tenant, exp: Date.now() + CAPABILITY_MS, nonce: InternalAuth.nonce() })}`,
                  }
                : {}),
            },
            body: JSON.stringify(body),
            signal: ac.signal,
          });
        } catch (e) {
          if (signal.aborted) throw signal.reason;
          if (ac.signal.aborted) throw peerDead(ac.signal.reason); // the work is lost with it: not redone blindly
          failures.push(`${inst.id} (${inst.baseUrl}): ${(e as { code?: string }).code ?? (e as Error).message}`);
          continue;
        }
        if (res.statusCode === 200 && progress) {
          try {
            return await readStreamedHandle(res.body, inst.id, progress);
          } catch (e) {
            if (signal.aborted) throw signal.reason;
            if (ac.signal.aborted) throw peerDead(ac.signal.reason);
            throw e;
          }
        }
        let text: string;
        try {
          text = await res.body.text();
        } catch (e) {
          if (signal.aborted) throw signal.reason;
          if (ac.signal.aborted) throw peerDead(ac.signal.reason);
          throw new ApiError(502, "prefill_failed", `prefill instance ${inst.id} broke off its answer: ${(e as Error).message}`);
        }
        if (res.statusCode === 200) {
          const parsed = HandleSchema.safeParse(parseJson(text));
          if (!parsed.success) throw new ApiError(502, "prefill_failed", `prefill instance ${inst.id} answered a malformed handle`);
          return parsed.data;
        }
        const err = parseError(text);
        if (PASS_THROUGH.has(res.statusCode)) {
          const passed = new ApiError(
            res.statusCode as ApiStatus,
            (err?.code ?? "invalid_request") as ApiErrorCode,
            err?.message ?? text.slice(0, 300),
            err?.param ?? null,
          );
          const retryAfter = res.headers["retry-after"];
          if (typeof retryAfter === "string") passed.headers["retry-after"] = retryAfter;
          throw passed;
        }
        failures.push(`${inst.id}: ${res.statusCode} ${err?.message ?? text.slice(0, 200)}`);
        if (res.statusCode !== 503) {
          serverError = true;
          break; // a 500 from the instance is not a reason to redo the work elsewhere
        }
      } finally {
        untrack();
        signal.removeEventListener("abort", onAbort);
      }
    }
    throw new ApiError(
      serverError ? 502 : 503,
      serverError ? "prefill_failed" : "no_prefill_instance",
      `no prefill instance could take the request: ${failures.join("; ")}`,
    );
  }

  private order(alive: InstanceRow[]): InstanceRow[] {
    const start = this.turn++ % alive.length;
    const rotated = [...alive.slice(start), ...alive.slice(0, start)];
    const local = rotated.filter((i) => i.hostId === this.rt.config.hostId);
    return [...local, ...rotated.filter((i) => i.hostId !== this.rt.config.hostId)];
  }

  private poolFor(baseUrl: string): Pool {
    const origin = new URL(baseUrl).origin;
    let pool = this.pools.get(origin);
    if (!pool) {
      // A long prompt takes long to prefill: no header/body timeouts here; the call's deadline and
      // the peer watch bound it. The queue above keeps at most maxPrefillCalls in flight.
      pool = new Pool(origin, {
        connections: this.rt.config.maxPrefillCalls,
        pipelining: 1,
        headersTimeout: 0,
        bodyTimeout: 0,
        keepAliveTimeout: 30_000,
      });
      this.pools.set(origin, pool);
    }
    return pool;
  }

  async close(): Promise<void> {
    const pools = [...this.pools.values()];
    this.pools.clear();
    await Promise.all(pools.map((p) => p.close()));
  }
}

/** The streamed handle's lines, reported to `progress`; the handle (or the prefill's error) ends it. */
async function readStreamedHandle(body: AsyncIterable<Uint8Array>, instanceId: string, progress: HandleProgress): Promise<Handle> {
  let started = false;
  try {
    for await (const line of handleLines(body)) {
      if ("started" in line && !started) {
        started = true;
        progress.started(line.started);
      } else if ("chunk" in line && started) progress.chunk(line.chunk);
      else if ("handle" in line && started) return line.handle;
      else if ("error" in line) {
        const { status, code, message } = line.error;
        throw new ApiError(
          (PASS_THROUGH.has(status) ? status : 502) as ApiStatus,
          (PASS_THROUGH.has(status) ? code : "prefill_failed") as ApiErrorCode,
          `prefill instance ${instanceId}: ${message}`,
        );
      } else throw new Error("lines out of order");
    }
  } catch (e) {
    if (e instanceof ApiError) throw e;
    throw new ApiError(
      502,
      "prefill_failed",
      `prefill instance ${instanceId} broke off its streamed answer: ${(e as Error).message}`,
      null,
      undefined,
      { cause: e },
    );
  }
  throw new ApiError(502, "prefill_failed", `prefill instance ${instanceId} ended its streamed answer without a handle`);
}

function peerDead(reason: unknown): unknown {
  if (!(reason instanceof PeerDeadError)) return reason;
  return new ApiError(502, "prefill_failed", `prefill ${reason.message}; the request was lost with it, retry`, null, undefined, {
    cause: reason,
  });
}

function parseJson(text: string): unknown {
  try {
    return JSON.parse(text);
  } catch {
    return undefined;
  }
}

function parseError(text: string): { code?: string; message?: string; param?: string | null } | undefined {
  try {
    return (JSON.parse(text) as { error?: { code?: string; message?: string; param?: string | null } }).error;
  } catch {
    return undefined;
  }
}
