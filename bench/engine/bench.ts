// The engine benchmark: ours vs llama.cpp (node-llama-cpp) on the same GGUF, the same token ids,
// the same thread counts and batch size, in one process, strictly one measurement at a time.
//
// For every thread count and prompt length: a session per engine; per repetition each engine in
// turn (ABBA order) prefills the prompt (timed, chunk by chunk) and, at the decode thread count,
// then greedy-decodes N steps from there (timed): prefill to L then N steps is the decode point
// at context L. Each timed run is preceded by a short wait for the machine to be quiet and is
// retried once if other processes used a lot of CPU while it ran.
import { otherLoad, CpuMeter, linearFit, median, summarize, waitForQuiet, type CpuWindow, type Summary } from "../../tools/lib/timing.ts";
import type { Backend, FlashAttention, Session } from "./engines.ts";

export interface BenchOptions {
  /** Nominal prompt lengths; a length plus the decode steps is capped at the context. */
  lengths: number[];
  prefillThreads: number[];
  decodeThreads: number[];
  steps: number;
  /** Decode runs per repetition: after the first, the KV is rolled back to the prompt and the same steps decoded again. */
  decodeRuns: number;
  /** Repetitions per nominal length (a length missing here uses `defaultReps`). */
  reps: Record<number, number>;
  defaultReps: number;
  /** Prefill chunk (tokens per call); 0 = the whole prompt in one call. */
  chunk: number;
  maxContext: number;
  warmupTokens: number;
  warmupSteps: number;
  /**
   * Contention: a run counts as contended when other processes spilled onto the cores it needs
   * (their load > cpus − threads + quietThreshold) or it got less than 85% of `threads` cores.
   */
  quietThreshold: number;
  /** CPUs of the machine. */
  cpus: number;
  /** Max seconds to wait for quiet before each timed run (0 = don't wait). */
  quietWaitS: number;
  /** Extra seconds the run may spend redoing contended measurements. */
  retryBudgetS: number;
  /** Runs longer than this (seconds) are flagged when contended but not redone. */
  retryMaxRunS: number;
  flashAttention: FlashAttention[];
  log: (line: string) => void;
}

export interface RepRecord {
  rep: number;
  attempts: number;
  waitedMs: number;
  prefill: { ms: number; tokPerS: number; chunkMs: number[]; cpu: CpuWindow };
  /** Decode: the median run (by ms/token) of `decodeRuns`, plus every run's ms/token. */
  decode?: { ms: number; msPerToken: number; stepMedianMs: number; cpu: CpuWindow; tokens: number[]; runsMsPerToken: number[] };
  contended: boolean;
  first: number;
}

export interface PointRecord {
  engine: string;
  threads: number;
  actualThreads?: number;
  nominalLength: number;
  promptTokens: number;
  steps: number;
  prefillTimed: boolean;
  decodeTimed: boolean;
  reps: RepRecord[];
  prefill?: { tokPerS: Summary; ms: Summary; chunkMsMedian: number[] };
  decode?: { msPerToken: Summary; contextStart: number; contextEnd: number };
}

export interface BenchResult {
  points: PointRecord[];
  warmup: Array<{ engine: string; threads: number; ms: number }>;
  retrySpentS: number;
}

/**
 * Prompt length actually used for a nominal length: prompt + decode steps must fit the context,
 * with one spare cell: node-llama-cpp keeps one cell free and would otherwise shift the context
 * (erase its beginning) on the last step, which is not what we want to time.
 */
export function effectiveLength(nominal: number, steps: number, maxContext: number): number {
  return Math.min(nominal, maxContext - steps - 1);
}

/** Context a session needs for a prompt of `prompt` tokens and `steps` decode steps. */
export function sessionTokens(prompt: number, steps: number): number {
  return prompt + steps + 1;
}

export async function runBench(backends: Backend[], tokens: readonly number[], o: BenchOptions): Promise<BenchResult> {
  const threadList = [...new Set([...o.prefillThreads, ...o.decodeThreads])].sort((a, b) => a - b);
  const result: BenchResult = { points: [], warmup: [], retrySpentS: 0 };

  // Warm-up: every engine at every thread count, untimed for the results (page in the weights,
  // spin up thread pools, let llama.cpp build its graphs).
  for (const t of threadList) {
    for (const b of backends) {
      const s = await b.open(t, sessionTokens(o.warmupTokens, o.warmupSteps));
      const t0 = performance.now();
      const p = await s.prefill(tokens.slice(0, o.warmupTokens), o.chunk);
      await s.decode(p.next, o.warmupSteps);
      const ms = performance.now() - t0;
      await s.dispose();
      result.warmup.push({ engine: b.id, threads: t, ms });
      o.log(`warm-up  ${b.label.padEnd(22)} threads=${t}  ${(ms / 1000).toFixed(2)} s`);
    }
  }

  let retrySpentMs = 0;
  for (const t of threadList) {
    const doPrefill = o.prefillThreads.includes(t);
    const doDecode = o.decodeThreads.includes(t);
    for (const nominal of o.lengths) {
      const L = effectiveLength(nominal, o.steps, o.maxContext);
      const prompt = tokens.slice(0, L);
      if (prompt.length < L) throw new Error(`bench: only ${tokens.length} prompt tokens prepared, need ${L}`);
      const nReps = o.reps[nominal] ?? o.defaultReps;
      const sessions: Session[] = [];
      for (const b of backends) sessions.push(await b.open(t, sessionTokens(L, o.steps)));
      const points: PointRecord[] = backends.map((b, i) => ({
        engine: b.id,
        threads: t,
        actualThreads: sessions[i]!.actualThreads(),
        nominalLength: nominal,
        promptTokens: L,
        steps: o.steps,
        prefillTimed: doPrefill,
        decodeTimed: doDecode,
        reps: [],
      }));
      try {
        for (let r = 0; r < nReps; r++) {
          const order = backends.map((_, i) => i);
          if (r % 2 === 1) order.reverse(); // ABBA: neither engine always runs first
          for (const i of order) {
            const rec = await measureRep(
              sessions[i]!,
              t,
              prompt,
              doDecode ? o.steps : 0,
              o,
              () => retrySpentMs,
              (ms) => {
                retrySpentMs += ms;
              },
            );
            rec.rep = r;
            points[i]!.reps.push(rec);
            points[i]!.actualThreads ??= sessions[i]!.actualThreads();
            o.log(describeRep(backends[i]!.label, t, L, rec, doPrefill, doDecode));
          }
        }
      } finally {
        for (const s of sessions) await s.dispose();
      }
      for (const p of points) {
        summarizePoint(p);
        result.points.push(p);
      }
    }
  }
  result.retrySpentS = retrySpentMs / 1000;
  return result;
}

/** Other processes' load (cores) that starts to take CPU from a run on `threads` threads. */
export function spillLimit(o: Pick<BenchOptions, "cpus" | "quietThreshold">, threads: number): number {
  return Math.max(0, o.cpus - threads) + o.quietThreshold;
}

export function isContended(cpu: CpuWindow, threads: number, o: Pick<BenchOptions, "cpus" | "quietThreshold">): boolean {
  return (cpu.otherCores ?? 0) > spillLimit(o, threads) || cpu.selfCores < 0.85 * threads;
}

async function measureRep(
  s: Session,
  threads: number,
  prompt: readonly number[],
  steps: number,
  o: BenchOptions,
  retrySpent: () => number,
  addRetry: (ms: number) => void,
): Promise<RepRecord> {
  let attempts = 0;
  let waitedMs = 0;
  for (;;) {
    attempts++;
    if (o.quietWaitS > 0) waitedMs += (await waitForQuiet(spillLimit(o, threads), o.quietWaitS * 1000)).waitedMs;
    await s.reset();
    const tStart = performance.now();
    const pm = new CpuMeter().start();
    const p = await s.prefill(prompt, o.chunk);
    const pcpu = pm.stop();
    let decode: RepRecord["decode"];
    let decodeContended = false;
    if (steps > 0) {
      const runs: NonNullable<RepRecord["decode"]>[] = [];
      for (let k = 0; k < Math.max(1, o.decodeRuns); k++) {
        if (k > 0) await s.rollback(prompt.length);
        const dm = new CpuMeter().start();
        const d = await s.decode(p.next, steps);
        const dcpu = dm.stop();
        decodeContended ||= isContended(dcpu, threads, o);
        runs.push({ ms: d.ms, msPerToken: d.ms / steps, stepMedianMs: median(d.stepMs), cpu: dcpu, tokens: d.tokens, runsMsPerToken: [] });
      }
      const byTime = [...runs].sort((x, y) => x.msPerToken - y.msPerToken);
      decode = { ...byTime[(byTime.length - 1) >> 1]!, tokens: runs[0]!.tokens, runsMsPerToken: runs.map((r) => r.msPerToken) };
    }
    const contended = isContended(pcpu, threads, o) || decodeContended;
    const spent = performance.now() - tStart;
    const retry = spent <= o.retryMaxRunS * 1000 && retrySpent() + spent <= o.retryBudgetS * 1000 && attempts < 3;
    if (contended && retry) {
      addRetry(spent);
      o.log(
        `  (contended: others used ${fmtCores(pcpu.otherCores)} / ${fmtCores(decode?.cpu.otherCores)} cores, ` +
          `we got ${fmtCores(pcpu.selfCores)} / ${fmtCores(decode?.cpu.selfCores)} (prefill / decode); retrying)`,
      );
      continue;
    }
    return {
      rep: 0,
      attempts,
      waitedMs,
      prefill: { ms: p.ms, tokPerS: (prompt.length / p.ms) * 1000, chunkMs: p.chunkMs, cpu: pcpu },
      decode,
      contended,
      first: p.next,
    };
  }
}

function fmtCores(x: number | undefined): string {
  return x === undefined ? "?" : x.toFixed(2);
}

function describeRep(label: string, t: number, L: number, r: RepRecord, doPrefill: boolean, doDecode: boolean): string {
  const parts = [`${label.padEnd(22)} threads=${t} L=${String(L).padStart(5)} rep ${r.rep}:`];
  if (doPrefill) parts.push(`prefill ${r.prefill.tokPerS.toFixed(1)} tok/s (${(r.prefill.ms / 1000).toFixed(2)} s)`);
  else parts.push(`(prefill ${(r.prefill.ms / 1000).toFixed(2)} s, untimed)`);
  if (doDecode && r.decode) parts.push(`decode ${r.decode.msPerToken.toFixed(2)} ms/tok`);
  const other = Math.max(r.prefill.cpu.otherCores ?? 0, r.decode?.cpu.otherCores ?? 0);
  const self = Math.min(r.prefill.cpu.selfCores, r.decode?.cpu.selfCores ?? Infinity);
  parts.push(
    `[cores: ours ${self.toFixed(2)}, others ${other.toFixed(2)}${r.contended ? ", CONTENDED" : ""}${r.attempts > 1 ? `, ${r.attempts} tries` : ""}]`,
  );
  return parts.join("  ");
}

function summarizePoint(p: PointRecord): void {
  if (p.prefillTimed) {
    const nChunks = Math.max(...p.reps.map((r) => r.prefill.chunkMs.length));
    const chunkMsMedian = Array.from({ length: nChunks }, (_, c) =>
      median(p.reps.map((r) => r.prefill.chunkMs[c]).filter((x): x is number => x !== undefined)),
    );
    p.prefill = {
      tokPerS: summarize(p.reps.map((r) => r.prefill.tokPerS)),
      ms: summarize(p.reps.map((r) => r.prefill.ms)),
      chunkMsMedian,
    };
  }
  if (p.decodeTimed) {
    p.decode = {
      msPerToken: summarize(p.reps.flatMap((r) => (r.decode ? [r.decode.msPerToken] : []))),
      contextStart: p.promptTokens,
      contextEnd: p.promptTokens + p.steps,
    };
  }
}

/** Cores other processes are using right now (for the report header). */
export async function currentOtherLoad(): Promise<number | undefined> {
  return otherLoad(1000);
}

// ---------------------------------------------------------------------------------------------
// Derived numbers: where the time goes as the context grows.

export interface DecodeBreakdown {
  engine: string;
  threads: number;
  /** ms/token = fixedMs + perKContextMs · (context / 1024), least squares over the decode points. */
  fixedMs: number;
  perKContextMs: number;
  r2: number;
  /** Share of a decode step spent on context-proportional work (≈ attention) at each point. */
  contextShare: Array<{ context: number; msPerToken: number; share: number }>;
}

export interface PrefillBreakdown {
  engine: string;
  threads: number;
  promptTokens: number;
  chunk: number;
  /** Chunk time = baseMs + perKPositionMs · (chunk-middle position / 1024). */
  baseMs: number;
  perKPositionMs: number;
  r2: number;
  firstChunkMs: number;
  lastChunkMs: number;
  /** 1 − nChunks·baseMs / total: the part of the prompt's time that grows with position (≈ attention). */
  positionShare: number;
}

export function decodeBreakdown(points: PointRecord[]): DecodeBreakdown[] {
  const groups = new Map<string, PointRecord[]>();
  for (const p of points) {
    if (!p.decode) continue;
    const k = `${p.engine}\u0000${p.threads}`;
    groups.set(k, [...(groups.get(k) ?? []), p]);
  }
  const out: DecodeBreakdown[] = [];
  for (const ps of groups.values()) {
    const ctx = ps.map((p) => (p.decode!.contextStart + p.decode!.contextEnd) / 2);
    const ms = ps.map((p) => p.decode!.msPerToken.median);
    const fit = linearFit(
      ctx.map((c) => c / 1024),
      ms,
    );
    out.push({
      engine: ps[0]!.engine,
      threads: ps[0]!.threads,
      fixedMs: fit.a,
      perKContextMs: fit.b,
      r2: fit.r2,
      contextShare: ps.map((p, i) => ({
        context: p.promptTokens,
        msPerToken: ms[i]!,
        share: Math.max(0, Math.min(1, (fit.b * ctx[i]!) / 1024 / ms[i]!)),
      })),
    });
  }
  return out;
}

export function prefillBreakdown(points: PointRecord[], chunk: number): PrefillBreakdown[] {
  const out: PrefillBreakdown[] = [];
  const longest = new Map<string, PointRecord>();
  for (const p of points) {
    if (!p.prefill || p.prefill.chunkMsMedian.length < 3) continue;
    const k = `${p.engine}\u0000${p.threads}`;
    const cur = longest.get(k);
    if (!cur || p.promptTokens > cur.promptTokens) longest.set(k, p);
  }
  for (const p of longest.values()) {
    const c = p.prefill!.chunkMsMedian;
    // The last chunk may be short: fit on full chunks only.
    const full = c.slice(0, Math.floor(p.promptTokens / chunk));
    const mid = full.map((_, i) => (i * chunk + chunk / 2) / 1024);
    const fit = linearFit(mid, full);
    const total = c.reduce((s, x) => s + x, 0);
    const baseTotal = fit.a * (p.promptTokens / chunk);
    out.push({
      engine: p.engine,
      threads: p.threads,
      promptTokens: p.promptTokens,
      chunk,
      baseMs: fit.a,
      perKPositionMs: fit.b,
      r2: fit.r2,
      firstChunkMs: full[0] ?? Number.NaN,
      lastChunkMs: full[full.length - 1] ?? Number.NaN,
      positionShare: Math.max(0, 1 - baseTotal / total),
    });
  }
  return out;
}
