// Runs one load: warm-up requests (not recorded), then jobs started by the arrival process until
// the request cap or the duration cap; requests still in flight get `drainS` more, then are
// aborted and counted as timeouts. Open-loop jobs are built before the clock starts, so building
// a 4K-token prompt never delays a send.
import { setTimeout as sleep } from "node:timers/promises";
import type { ChatMessage } from "../../shared/inference/tokenizer/chat-template.ts";
import { offeredRate, openLoopSchedule, type ArrivalSpec } from "./arrivals.ts";
import type { RequestSpec, StreamingClient } from "./client.ts";
import { runProgress } from "./progress.ts";
import { seededRng } from "../lib/random.ts";
import { meetsSlo, roundStats, runStats, serverCounts, type RoundStats, type RunStats, type ServerCounts } from "./stats.ts";
import type { RequestResult, Slo } from "./types.ts";
import { sendsSessionIds, type Job, type WorkloadFactory } from "./workloads.ts";

export interface RunOptions {
  arrivals: ArrivalSpec;
  /** Request cap (session rounds count as requests). */
  maxRequests: number;
  /** Duration cap for starting requests, s. */
  durationS: number;
  /** After the duration cap, how long requests in flight may still run, s. */
  drainS: number;
  warmup: number;
  seed: number;
  slo?: Slo;
  label?: string;
  progress?: boolean;
}

export interface RunResult {
  startedAt: string;
  wallS: number;
  warmup: { sent: number; ok: number; errors: string[] };
  results: RequestResult[];
  stats: RunStats;
  sessions?: { started: number; completed: number; roundsPerS: number; sessionsPerS: number; sessionIds: boolean };
  /** Multi-turn: statistics per round index (the last entry is the last turn). */
  rounds?: RoundStats[];
  /** What a ctxbank server reported per request (router reasons, prefill placements, session reuse), counted. */
  server?: ServerCounts;
  qa?: { checked: number; correct: number };
}

export async function runLoad(client: StreamingClient, factory: WorkloadFactory, opts: RunOptions): Promise<RunResult> {
  // Separate streams: arrivals, measured jobs and warm-up jobs do not shift each other.
  const arrivalRng = seededRng(opts.seed);
  const jobRng = seededRng((opts.seed ^ 0x5bd1e995) >>> 0);
  const warmRng = seededRng((opts.seed ^ 0x27d4eb2f) >>> 0);

  const warmup = { sent: 0, ok: 0, errors: [] as string[] };
  for (let i = 0; i < opts.warmup; i++) {
    const job = factory.next(warmRng);
    // A warm-up round names no session: nothing of it is kept on the server for the measured run.
    const { headers: _session, ...spec } = job.kind === "single" ? job.spec : job.round(0, []).spec;
    const r = await client.send(spec);
    warmup.sent++;
    if (r.ok) warmup.ok++;
    else warmup.errors.push(r.error ?? r.errorKind ?? "failed");
  }
  if (opts.warmup > 0 && warmup.ok === 0) throw new Error(`every warm-up request failed: ${warmup.errors[0]}`);

  const durationMs = opts.durationS * 1000;
  const isSession = factory.spec.kind === "multiturn";
  const roundsPerJob = factory.spec.kind === "multiturn" ? factory.spec.rounds : 1;
  const schedule =
    opts.arrivals.kind === "concurrency"
      ? undefined
      : openLoopSchedule(opts.arrivals, Math.ceil(opts.maxRequests / roundsPerJob), durationMs, arrivalRng);
  const prebuilt = schedule?.map(() => factory.next(jobRng));
  const planned = schedule ? Math.min(opts.maxRequests, schedule.length * roundsPerJob) : opts.maxRequests;

  const results: RequestResult[] = [];
  const qa = { checked: 0, correct: 0 };
  const sessions = { started: 0, completed: 0 };
  let issued = 0;
  const stop = new AbortController();
  const progress = runProgress(opts.label ?? "load", planned, opts.progress ?? true);
  const tally = { ok: 0, errors: 0, limited: 0, met: 0 };
  const startedAt = new Date().toISOString();
  const t0 = performance.now();
  const elapsed = () => performance.now() - t0;
  const hardStop = setTimeout(() => stop.abort(), durationMs + opts.drainS * 1000);

  const request = async (
    spec: RequestSpec,
    scheduledMs: number,
    where: { session?: number; round?: number; sessionId?: string },
    check?: (t: string) => boolean,
  ): Promise<RequestResult> => {
    const index = issued++;
    const { t0: sent, ...r } = await client.send(spec, stop.signal);
    const res: RequestResult = { index, ...where, scheduledMs, sentMs: sent - t0, ...r };
    if (check && res.ok) {
      qa.checked++;
      if (check(res.text ?? "")) qa.correct++;
    }
    results.push(res);
    if (res.ok) tally.ok++;
    else if (res.errorKind === "rate_limited") tally.limited++;
    else tally.errors++;
    if (opts.slo && meetsSlo(res, opts.slo)) tally.met++;
    progress.update(results.length, { ...tally, attainment: opts.slo ? tally.met / results.length : undefined });
    return res;
  };

  const runJob = async (job: Job, scheduledMs: number, sessionIndex: number): Promise<void> => {
    if (job.kind === "single") {
      await request(job.spec, scheduledMs, {}, job.check);
      return;
    }
    sessions.started++;
    let history: ChatMessage[] = [];
    for (let r = 0; r < job.rounds; r++) {
      if (r > 0) {
        try {
          await sleep(job.thinkMs(r), undefined, { signal: stop.signal });
        } catch {
          return; // hard stop during think time
        }
      }
      if (issued >= opts.maxRequests || elapsed() >= durationMs) return;
      const next = job.round(r, history);
      const res = await request(next.spec, r === 0 ? scheduledMs : elapsed(), {
        session: sessionIndex,
        round: r,
        ...(job.sessionId ? { sessionId: job.sessionId } : {}),
      });
      if (!res.ok) return;
      history = [...next.history, { role: "assistant", content: res.text ?? "" }];
    }
    sessions.completed++;
  };

  const inflight = new Set<Promise<void>>();
  try {
    if (schedule && prebuilt) {
      for (let i = 0; i < schedule.length; i++) {
        if (issued >= opts.maxRequests) break;
        const wait = schedule[i]! - elapsed();
        if (wait > 0) await sleep(wait);
        if (elapsed() >= durationMs) break;
        const p = runJob(prebuilt[i]!, schedule[i]!, i).finally(() => inflight.delete(p));
        inflight.add(p);
      }
    } else if (opts.arrivals.kind === "concurrency") {
      let sessionIndex = 0;
      // Multi-turn: as many sessions as the request cap holds whole (as open loop schedules), so
      // a new session never takes the rounds a running one still has to send.
      const maxJobs = Math.ceil(opts.maxRequests / roundsPerJob);
      const worker = async () => {
        while (issued < opts.maxRequests && sessionIndex < maxJobs && elapsed() < durationMs && !stop.signal.aborted) {
          await runJob(factory.next(jobRng), elapsed(), sessionIndex++);
        }
      };
      for (let w = 0; w < opts.arrivals.concurrency; w++) {
        const p = worker().finally(() => inflight.delete(p));
        inflight.add(p);
      }
    }
    await Promise.all([...inflight]);
  } finally {
    clearTimeout(hardStop);
    progress.stop();
  }
  const wallS = elapsed() / 1000;
  results.sort((a, b) => a.index - b.index);
  // Open-loop sessions arrive at the process's rate; each brings `rounds` requests.
  const jobsPerS = offeredRate(opts.arrivals);
  const out: RunResult = {
    startedAt,
    wallS,
    warmup,
    results,
    stats: runStats(results, opts.slo, jobsPerS === undefined ? undefined : jobsPerS * roundsPerJob),
  };
  if (isSession) {
    out.sessions = {
      ...sessions,
      roundsPerS: results.filter((r) => r.ok).length / wallS,
      sessionsPerS: sessions.completed / wallS,
      sessionIds: sendsSessionIds(factory.spec),
    };
    out.rounds = roundStats(results, opts.slo);
  }
  const server = serverCounts(results);
  if (server) out.server = server;
  if (qa.checked > 0) out.qa = qa;
  return out;
}
