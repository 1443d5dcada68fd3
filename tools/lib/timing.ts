// Timing helpers shared by the benchmarks: robust summaries, and a CPU-contention probe so a
// result taken while something else was hogging the (2-core) machine can be spotted and retried.
import { readFileSync } from "node:fs";
import { setTimeout as sleep } from "node:timers/promises";

export interface Summary {
  n: number;
  median: number;
  min: number;
  max: number;
  mean: number;
}

export function median(xs: readonly number[]): number {
  if (xs.length === 0) return Number.NaN;
  const s = [...xs].sort((a, b) => a - b);
  const mid = s.length >> 1;
  return s.length % 2 === 1 ? s[mid]! : (s[mid - 1]! + s[mid]!) / 2;
}

export function summarize(xs: readonly number[]): Summary {
  if (xs.length === 0) return { n: 0, median: Number.NaN, min: Number.NaN, max: Number.NaN, mean: Number.NaN };
  let min = Infinity;
  let max = -Infinity;
  let sum = 0;
  for (const x of xs) {
    min = Math.min(min, x);
    max = Math.max(max, x);
    sum += x;
  }
  return { n: xs.length, median: median(xs), min, max, mean: sum / xs.length };
}

/** Least-squares fit y = a + b·x. */
export function linearFit(xs: readonly number[], ys: readonly number[]): { a: number; b: number; r2: number } {
  const n = xs.length;
  if (n < 2) return { a: ys[0] ?? Number.NaN, b: 0, r2: Number.NaN };
  const mx = xs.reduce((s, x) => s + x, 0) / n;
  const my = ys.reduce((s, y) => s + y, 0) / n;
  let sxx = 0;
  let sxy = 0;
  let syy = 0;
  for (let i = 0; i < n; i++) {
    const dx = xs[i]! - mx;
    const dy = ys[i]! - my;
    sxx += dx * dx;
    sxy += dx * dy;
    syy += dy * dy;
  }
  const b = sxx === 0 ? 0 : sxy / sxx;
  const a = my - b * mx;
  const r2 = syy === 0 ? 1 : (sxy * sxy) / (sxx * syy);
  return { a, b, r2 };
}

// ---------------------------------------------------------------------------------------------
// CPU accounting. Linux /proc/stat gives machine-wide busy time; process.cpuUsage() gives ours
// (all threads of this process, so the engines' worker threads count as ours). The difference is
// what other processes used while we measured. "steal" is time the hypervisor gave to others.

const TICK_MS = 10; // USER_HZ is 100 on every Linux x86-64 kernel in practice

interface ProcStat {
  busyMs: number;
  stealMs: number;
}

function readProcStat(): ProcStat | undefined {
  try {
    const line = readFileSync("/proc/stat", "utf8").split("\n", 1)[0]!;
    // cpu user nice system idle iowait irq softirq steal guest guest_nice
    const f = line.trim().split(/\s+/).slice(1).map(Number);
    const [user = 0, nice = 0, system = 0, , , irq = 0, softirq = 0, steal = 0] = f;
    return { busyMs: (user + nice + system + irq + softirq) * TICK_MS, stealMs: steal * TICK_MS };
  } catch {
    return undefined;
  }
}

export interface CpuWindow {
  wallMs: number;
  /** CPU time of this process (all threads) during the window, ms. */
  selfCpuMs: number;
  /** Average number of cores this process kept busy. */
  selfCores: number;
  /** Average number of cores other processes kept busy (undefined off Linux). */
  otherCores?: number;
  /** Average hypervisor steal, in cores (undefined off Linux). */
  stealCores?: number;
}

export class CpuMeter {
  private t0 = 0;
  private cpu0: NodeJS.CpuUsage = { user: 0, system: 0 };
  private stat0: ProcStat | undefined;

  start(): this {
    this.stat0 = readProcStat();
    this.cpu0 = process.cpuUsage();
    this.t0 = performance.now();
    return this;
  }

  stop(): CpuWindow {
    const wallMs = performance.now() - this.t0;
    const cpu = process.cpuUsage(this.cpu0);
    const stat1 = readProcStat();
    const selfCpuMs = (cpu.user + cpu.system) / 1000;
    const out: CpuWindow = { wallMs, selfCpuMs, selfCores: wallMs > 0 ? selfCpuMs / wallMs : 0 };
    if (this.stat0 && stat1 && wallMs > 0) {
      const busy = stat1.busyMs - this.stat0.busyMs;
      // Tick granularity is 10 ms: clamp the small negative values short windows can produce.
      out.otherCores = Math.max(0, (busy - selfCpuMs) / wallMs);
      out.stealCores = Math.max(0, (stat1.stealMs - this.stat0.stealMs) / wallMs);
    }
    return out;
  }
}

/** Cores used by other processes over a short idle window (undefined off Linux). */
export async function otherLoad(windowMs = 500): Promise<number | undefined> {
  const m = new CpuMeter().start();
  await sleep(windowMs);
  return m.stop().otherCores;
}

export interface QuietWaitResult {
  waitedMs: number;
  /** Other processes' load in the last probe window, cores. */
  otherCores?: number;
  quiet: boolean;
}

/**
 * Waits (up to maxWaitMs) until other processes use less than `threshold` cores, so a timed
 * run does not start while e.g. a compiler or test suite is running next to it.
 */
export async function waitForQuiet(threshold: number, maxWaitMs: number, windowMs = 500): Promise<QuietWaitResult> {
  const t0 = performance.now();
  let load = await otherLoad(windowMs);
  while (load !== undefined && load > threshold && performance.now() - t0 < maxWaitMs) {
    load = await otherLoad(windowMs);
  }
  return { waitedMs: performance.now() - t0, otherCores: load, quiet: load === undefined || load <= threshold };
}
