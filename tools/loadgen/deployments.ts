// The two ways the suite deploys ctxbank on this machine, as processes (tools/lib/services.ts):
//   colocated     — `ctxbank serve`: prefill and decode share one engine in one process, PGlite;
//   disaggregated — `ctxbank prefill` + `ctxbank decode` as two processes sharing a PostgreSQL 15
//                   started for the run (tools/lib/postgres.ts); KV handed over through shm.
// Every process may be reniced (all threads, and its autogroup) so other work on the shared box
// disturbs the measurement less.
import { readdirSync, writeFileSync } from "node:fs";
import { mkdtemp, rm } from "node:fs/promises";
import os from "node:os";
import { startPostgres, type TestPostgres } from "../lib/postgres.ts";
import { startService, type ServiceProcess } from "../lib/services.ts";
import type { Slo } from "./types.ts";

export type DeploymentKind = "colocated" | "disaggregated";

export interface Deployment {
  kind: DeploymentKind;
  /** OpenAI base URL (…/v1) of the process clients talk to. */
  baseUrl: string;
  processes: Array<{ role: string; pid: number; threads: number; reniced: boolean }>;
  stop(): Promise<void>;
}

export interface DeploymentOptions {
  /** Engine threads of `ctxbank serve` (colocated). */
  serveThreads: number;
  /** Engine threads of the disaggregated prefill and decode processes. */
  prefillThreads: number;
  decodeThreads: number;
  nice?: number;
  /** Passed to the services so their own SLO verdicts and /metrics use the same objectives. */
  slo?: Slo;
}

/** Sets the nice value of every thread of a process and its autogroup (Linux; best effort). */
export function reniceProcess(pid: number | undefined, nice: number): boolean {
  if (pid === undefined) return false;
  try {
    for (const tid of readdirSync(`/proc/${pid}/task`)) os.setPriority(Number(tid), nice);
    writeFileSync(`/proc/${pid}/autogroup`, String(nice));
    return true;
  } catch {
    return false;
  }
}

export async function startDeployment(kind: DeploymentKind, o: DeploymentOptions): Promise<Deployment> {
  const shardDir = await mkdtemp("/dev/shm/ctxbank-loadgen-");
  const slo = o.slo ? ["--slo-ttft-ms", String(o.slo.ttftMs), "--slo-tpot-ms", String(o.slo.tpotMs)] : [];
  const procs: Array<{ role: string; p: ServiceProcess; threads: number }> = [];
  let pg: TestPostgres | undefined;
  const stop = async () => {
    await Promise.all(procs.map(({ p }) => p.stop()));
    await pg?.stop();
    await rm(shardDir, { recursive: true, force: true });
  };
  try {
    let front: ServiceProcess;
    if (kind === "colocated") {
      front = await startService("serve", [
        "--threads",
        String(o.serveThreads),
        "--shard-dir",
        shardDir,
        "--instance-id",
        "loadgen-serve",
        ...slo,
      ]);
      procs.push({ role: "serve", p: front, threads: o.serveThreads });
    } else {
      pg = await startPostgres("ctxbank_loadgen");
      const db = ["--database-url", pg.url, "--shard-dir", shardDir];
      const prefill = await startService("prefill", [
        ...db,
        "--threads",
        String(o.prefillThreads),
        "--instance-id",
        "loadgen-prefill",
        ...slo,
      ]);
      procs.push({ role: "prefill", p: prefill, threads: o.prefillThreads });
      front = await startService("decode", [...db, "--threads", String(o.decodeThreads), "--instance-id", "loadgen-decode", ...slo]);
      procs.push({ role: "decode", p: front, threads: o.decodeThreads });
    }
    const reniced = procs.map(({ p }) => (o.nice !== undefined ? reniceProcess(p.child.pid, o.nice) : false));
    return {
      kind,
      baseUrl: `${front.url}/v1`,
      processes: procs.map(({ role, p, threads }, i) => ({ role, pid: p.child.pid!, threads, reniced: reniced[i]! })),
      stop,
    };
  } catch (e) {
    await stop();
    throw e;
  }
}
