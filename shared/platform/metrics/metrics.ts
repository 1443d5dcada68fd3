// One Prometheus registry per service process (`serve` runs both services over one), the metric
// set with the fixed names, and what the services call to record into it. Latency histograms and
// SLO verdicts are per successfully finished request; failures are counted once per request, by
// error code; gauges are read from the services when Prometheus scrapes.
import { Registry, collectDefaultMetrics } from "prom-client";
import { CtxbankError } from "../../inference/errors.ts";
import { defineMetrics, type GaugeSources, type KvTier, type MetricSet, type PlacementCause, type Service } from "./definitions.ts";
import { configuredSlos, evaluateSlo, SLO_NAMES, type SloTargets, type SloVerdict } from "./slo.ts";
import type { RequestTimings } from "./timings.ts";

export interface MetricsOptions {
  /** The model label on every ctxbank series. */
  model: string;
  slo: SloTargets;
  /** Where the engine runs ("cpu", "cuda:0"): ctxbank:engine_device_info. */
  device?: string;
  /** prom-client's process metrics (CPU, memory, event loop, GC); default true. */
  processMetrics?: boolean;
}

const FINISH_REASONS = ["stop", "length", "stop_string"] as const;
const TRANSPORTS = ["http", "shm", "ucx"] as const;

export class ServiceMetrics {
  readonly registry = new Registry();
  readonly model: string;
  readonly slo: SloTargets;
  private readonly m: MetricSet;
  private readonly sources: GaugeSources & { queues: NonNullable<GaugeSources["queues"]> } = {
    requests: new Map(),
    kv: new Map(),
    queues: new Map(),
  };
  /** Errors whose request is already counted as a failure (so the HTTP layer does not count it again). */
  private readonly counted = new WeakSet<object>();

  constructor(opts: MetricsOptions) {
    this.model = opts.model;
    this.slo = opts.slo;
    if (opts.processMetrics !== false) collectDefaultMetrics({ register: this.registry });
    this.m = defineMetrics([this.registry], this.model, this.sources);
    // Every label value known up front starts at 0, so rate() and ratios have a series from the first scrape.
    const model = this.model;
    for (const r of FINISH_REASONS) this.m.success.inc({ model, finished_reason: r }, 0);
    for (const t of TRANSPORTS) this.m.transferBytes.inc({ model, transport: t }, 0);
    for (const slo of [...configuredSlos(this.slo), "all"]) {
      this.m.sloMet.inc({ model, slo }, 0);
      this.m.sloMissed.inc({ model, slo }, 0);
    }
    for (const name of SLO_NAMES) {
      const ms = name === "ttft" ? this.slo.ttftMs : name === "tpot" ? this.slo.tpotMs : this.slo.e2eMs;
      if (ms !== undefined) this.m.sloTarget.set({ model, slo: name }, ms / 1000);
    }
    for (const c of [this.m.promptTokens, this.m.generationTokens, this.m.prefillTokens, this.m.leaseExpiries, this.m.sessionReusedTokens])
      c.inc({ model }, 0);
    if (opts.device !== undefined) this.m.engineDevice.set({ model, device: opts.device }, 1);
  }

  get contentType(): string {
    return this.registry.contentType;
  }

  /** The exposition text for GET /metrics. */
  text(): Promise<string> {
    return this.registry.metrics();
  }

  /** A service's running/waiting counts, read at every scrape. */
  watchRequests(service: Service, read: () => { running: number; waiting: number }): void {
    this.sources.requests.set(service, read);
  }

  /** A KV tier's bytes in use and capacity, read at every scrape. */
  watchKv(tier: KvTier, read: () => { inUse: number; capacity: number }): void {
    this.sources.kv.set(tier, read);
  }

  /** A stage's bounded queue: waiting now and refused so far, read at every scrape. */
  watchQueue(stage: string, read: () => { queued: number; rejected: number }): void {
    this.sources.queues.set(stage, read);
  }

  /** The decode's session store, read at every scrape. */
  watchSessions(read: NonNullable<GaugeSources["sessions"]>): void {
    this.sources.sessions = read;
  }

  /** Where a prompt was computed, and why (conditional disaggregation). */
  placed(where: string, cause: PlacementCause): void {
    this.m.placements.inc({ model: this.model, where, cause });
  }

  /** Prompt tokens a session's turn took from its parked KV. */
  sessionReused(tokens: number): void {
    if (tokens > 0) this.m.sessionReusedTokens.inc({ model: this.model }, tokens);
  }

  watchPrefillThroughput(read: () => number | undefined): void {
    this.sources.prefillTokensPerSecond = read;
  }

  /** A request finished: its latencies, finish reason and SLO verdicts. Returns the verdict. */
  requestFinished(finish: string, t: RequestTimings): SloVerdict {
    const model = this.model;
    this.m.success.inc({ model, finished_reason: finish });
    this.m.ttft.observe({ model }, t.ttftMs / 1000);
    if (t.tpotMs !== null) this.m.tpot.observe({ model }, t.tpotMs / 1000);
    for (const gap of t.itlMs) this.m.itl.observe({ model }, gap / 1000);
    this.m.e2e.observe({ model }, t.e2eMs / 1000);
    this.m.queue.observe({ model }, t.queueMs / 1000);
    const verdict = evaluateSlo(this.slo, t);
    for (const [slo, met] of Object.entries(verdict)) (met ? this.m.sloMet : this.m.sloMissed).inc({ model, slo });
    return verdict;
  }

  /** A generation request did not finish; counted once per error object. Returns its code. */
  requestFailed(err: unknown): string {
    const code = errorCode(err);
    if (typeof err === "object" && err !== null) {
      if (this.counted.has(err)) return code;
      this.counted.add(err);
    }
    this.m.failure.inc({ model: this.model, code });
    return code;
  }

  /** For the HTTP layer: an error response whose code is known but no request failure was counted. */
  responseFailed(code: string, err: unknown): void {
    if (typeof err === "object" && err !== null && this.counted.has(err)) return;
    this.m.failure.inc({ model: this.model, code });
  }

  /** Tokens of a request admitted to decode, when it ends. */
  tokens(prompt: number, generated: number): void {
    this.m.promptTokens.inc({ model: this.model }, prompt);
    this.m.generationTokens.inc({ model: this.model }, generated);
  }

  prefillTokens(n: number): void {
    this.m.prefillTokens.inc({ model: this.model }, n);
  }

  transferBytes(transport: string, bytes: number): void {
    this.m.transferBytes.inc({ model: this.model, transport }, bytes);
  }

  transferDone(transport: string, seconds: number): void {
    this.m.transferSeconds.observe({ model: this.model, transport }, seconds);
  }

  transferFailed(transport: string, reason: string): void {
    this.m.transferFailures.inc({ model: this.model, transport, reason });
  }

  leaseExpiries(n: number): void {
    if (n > 0) this.m.leaseExpiries.inc({ model: this.model }, n);
  }
}

/** The machine-readable code of whatever ended a request. */
export function errorCode(err: unknown): string {
  return err instanceof CtxbankError ? err.code : "internal_error";
}
