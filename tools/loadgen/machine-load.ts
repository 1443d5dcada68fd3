// Who used the CPU during a measurement: the whole machine (/proc/stat), this process, and the
// service processes under test (/proc/<pid>/stat); what is left is other work on the shared box
// ("foreign" load), recorded next to every sweep point together with the load averages.
import { readFileSync } from "node:fs";
import os from "node:os";

const TICK_MS = 10; // USER_HZ = 100 on Linux x86-64

function machineBusyMs(): number | undefined {
  try {
    const f = readFileSync("/proc/stat", "utf8").split("\n", 1)[0]!.trim().split(/\s+/).slice(1).map(Number);
    const [user = 0, nice = 0, system = 0, , , irq = 0, softirq = 0] = f;
    return (user + nice + system + irq + softirq) * TICK_MS;
  } catch {
    return undefined;
  }
}

function processCpuMs(pid: number): number {
  try {
    const stat = readFileSync(`/proc/${pid}/stat`, "utf8");
    const f = stat.slice(stat.lastIndexOf(")") + 2).split(" ");
    return (Number(f[11]) + Number(f[12])) * TICK_MS;
  } catch {
    return 0; // exited
  }
}

export interface CpuSnapshot {
  at: number;
  machineMs?: number;
  selfMs: number;
  servicesMs: number;
  loadAvg: number[];
}

export function cpuSnapshot(servicePids: readonly number[]): CpuSnapshot {
  const u = process.cpuUsage();
  return {
    at: performance.now(),
    machineMs: machineBusyMs(),
    selfMs: (u.user + u.system) / 1000,
    servicesMs: servicePids.reduce((s, p) => s + processCpuMs(p), 0),
    loadAvg: os.loadavg(),
  };
}

export interface CpuUse {
  wallS: number;
  /** Average cores busy: the services under test, the load generator, everything else. */
  servicesCores: number;
  loadgenCores: number;
  foreignCores?: number;
  loadAvgBefore: number[];
  loadAvgAfter: number[];
}

export function cpuUse(a: CpuSnapshot, b: CpuSnapshot): CpuUse {
  const wallMs = Math.max(1, b.at - a.at);
  const services = (b.servicesMs - a.servicesMs) / wallMs;
  const self = (b.selfMs - a.selfMs) / wallMs;
  const out: CpuUse = {
    wallS: wallMs / 1000,
    servicesCores: services,
    loadgenCores: self,
    loadAvgBefore: a.loadAvg,
    loadAvgAfter: b.loadAvg,
  };
  // Tick granularity (10 ms) makes short windows slightly negative at times: clamp.
  if (a.machineMs !== undefined && b.machineMs !== undefined)
    out.foreignCores = Math.max(0, (b.machineMs - a.machineMs) / wallMs - services - self);
  return out;
}
