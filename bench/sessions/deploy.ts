// The deployments bench/sessions starts on this machine, as processes (tools/lib/services.ts):
//   serve         — `ctxbank serve` (one process, PGlite), with the given session settings;
//   disaggregated — PostgreSQL 15 (tools/lib/postgres.ts), P `ctxbank prefill` and D `ctxbank decode`
//                   processes sharing a tmpfs shard folder, and, with a router, `ctxbank router` in
//                   front of the decodes (clients talk to it); without one, clients talk to the
//                   first decode directly.
// Every process's log is kept: a failed run's logs are written next to its results.
import { mkdtemp, rm } from "node:fs/promises";
import { startPostgres, type TestPostgres } from "../../tools/lib/postgres.ts";
import { getJson, startService, until, type ServiceProcess } from "../../tools/lib/services.ts";

export interface Deployment {
  /** OpenAI base URL (…/v1) clients talk to. */
  baseUrl: string;
  processes: Array<{ role: string; id: string; pid: number; args: string[] }>;
  /** Each process's log (JSON lines), by instance id. */
  logs(): Record<string, string>;
  stop(): Promise<void>;
}

interface Started {
  role: string;
  id: string;
  args: string[];
  p: ServiceProcess;
}

async function deployment(
  start: (procs: Started[], shardDir: string) => Promise<string>,
  pgHolder: { pg?: TestPostgres },
): Promise<Deployment> {
  const shardDir = await mkdtemp("/dev/shm/ctxbank-bench-sessions-");
  const procs: Started[] = [];
  let stopping: Promise<void> | undefined;
  // Once, however many callers ask (an interrupted run and the measurement's own cleanup).
  const stop = () =>
    (stopping ??= (async () => {
      // The front first (a router), then the rest: nothing forwards to a stopped decode.
      for (const s of procs.filter((s) => s.role === "router")) await s.p.stop();
      await Promise.all(procs.filter((s) => s.role !== "router").map((s) => s.p.stop()));
      await pgHolder.pg?.stop();
      await rm(shardDir, { recursive: true, force: true });
    })());
  try {
    const baseUrl = await start(procs, shardDir);
    return {
      baseUrl,
      processes: procs.map((s) => ({ role: s.role, id: s.id, pid: s.p.child.pid!, args: s.args })),
      logs: () => Object.fromEntries(procs.map((s) => [s.id, s.p.log()])),
      stop,
    };
  } catch (e) {
    await stop();
    throw e;
  }
}

/** `ctxbank serve` with `args` (threads, session settings, ...). */
export function startServe(id: string, args: string[]): Promise<Deployment> {
  return deployment(async (procs, shardDir) => {
    const all = ["--shard-dir", shardDir, "--instance-id", id, ...args];
    const p = await startService("serve", all);
    procs.push({ role: "serve", id, args: all, p });
    return `${p.url}/v1`;
  }, {});
}

export interface DisaggregatedOptions {
  prefills: number;
  decodes: number;
  prefillArgs: string[];
  decodeArgs: string[];
  /** Start a router in front of the decodes with these arguments; without it clients talk to the first decode. */
  routerArgs?: string[];
  /** Heartbeat period and timeout of every process (a short timeout finds a dead decode sooner). */
  heartbeat?: { ms: number; timeoutMs: number };
}

/** PostgreSQL, the prefill and decode processes, and a router when asked. */
export function startDisaggregated(name: string, o: DisaggregatedOptions): Promise<Deployment> {
  const holder: { pg?: TestPostgres } = {};
  return deployment(async (procs, shardDir) => {
    holder.pg = await startPostgres(`ctxbank_${name.replace(/[^a-z0-9_]/gi, "_")}`);
    const beat = o.heartbeat ? ["--heartbeat-ms", String(o.heartbeat.ms), "--heartbeat-timeout-ms", String(o.heartbeat.timeoutMs)] : [];
    const common = ["--database-url", holder.pg.url, "--shard-dir", shardDir, ...beat];
    const start = async (role: "prefill" | "decode" | "router", id: string, args: string[]) => {
      const all = [...(role === "router" ? ["--database-url", holder.pg!.url, ...beat] : common), "--instance-id", id, ...args];
      const p = await startService(role, all);
      procs.push({ role, id, args: all, p });
      return p;
    };
    // One at a time: each loads the model, and two cores are all there is.
    for (let i = 0; i < o.prefills; i++) await start("prefill", `${name}-prefill-${i + 1}`, o.prefillArgs);
    const decodes: ServiceProcess[] = [];
    for (let i = 0; i < o.decodes; i++) decodes.push(await start("decode", `${name}-decode-${i + 1}`, o.decodeArgs));
    if (!o.routerArgs) return `${decodes[0]!.url}/v1`;
    const router = await start("router", `${name}-router`, o.routerArgs);
    await until("the router sees every decode", async () => (await getJson(`${router.url}/ready`)).body.decodes === o.decodes, 30_000);
    return `${router.url}/v1`;
  }, holder);
}
