// npm run bench:handoff [-- options]   (tsx bench/handoff/run.ts)
//
// Prefill → decode KV handoff, with the services as they are deployed: a `ctxbank prefill`
// process and two `ctxbank decode` processes (both over shm: one loading the KV while the
// prefill runs (the streamed handle), one after it) against a PostgreSQL 15 started for the run.
//   * For each KV length (--lengths): bytes/s per transport (TRANSPORTS below; one that is not
//     available is skipped with a note): the transport read alone (every chunk of a handle into
//     buffers, as many in flight as decode uses) and the whole load decode does (lease, read,
//     verify checksum + fingerprint, import into a sequence's cache, release: lease → ready to
//     decode), a few repetitions each, plus a memcpy of the same bytes as the floor. Each
//     repetition is a first load as in service: the shard's pages are renewed before it
//     (fresh-pages.ts) and the whole load goes into a new sequence;
//   * for each TTFT length (--ttft-lengths): TTFT colocated (the engine alone in a process of its
//     own: the same prefill + first token) against disaggregated (client → decode's
//     /v1/completions → prefill process → first token streamed), with and without streaming,
//     and the time to the second token, the first that needs the handed-over KV.
// Lengths past the model's context run with the context raised (timings only). Writes
// results/handoff/handoff.json, handoff.svg, handoff.md and PostgreSQL's log, postgres.log.
import { spawn } from "node:child_process";
import { readdirSync, readFileSync, writeFileSync } from "node:fs";
import os from "node:os";
import { mkdir, mkdtemp, rm, writeFile } from "node:fs/promises";
import { dirname, join } from "node:path";
import { fileURLToPath } from "node:url";
import { Agent, fetch, type Response } from "undici";
import { loadConfig } from "../../shared/platform/config.ts";
import { loadModel } from "../../shared/inference/engine/engine.ts";
import { resolveModel } from "../../shared/inference/model/resolve.ts";
import type { Handle } from "../../shared/platform/http/wire.ts";
import { KvLoader } from "../../services/handoff/reader.ts";
import { renewPages } from "./fresh-pages.ts";
import type { KvTransport } from "../../services/handoff/transport/types.ts";
import { createLogger, openRuntime, type Runtime } from "../../services/runtime.ts";
import { startPostgres } from "../../tools/lib/postgres.ts";
import { InternalAuth } from "../../shared/platform/auth/capability.ts";
import { tenantOf } from "../../shared/platform/auth/tenant.ts";
import { TEST_INTERNAL_SECRET, startService, type ServiceProcess } from "../../tools/lib/services.ts";
import { benchTokens } from "../../tools/lib/bench-text.ts";
import { benchCli, REPO_ROOT } from "../../tools/lib/bench-runner.ts";
import { setProcessNice } from "../../tools/lib/machine.ts";
import { renderChart, type Panel } from "../../tools/lib/svg-chart.ts";
import { fmtNum, markdownTable } from "../../shared/platform/table.ts";
import { CpuMeter, summarize, waitForQuiet, type Summary } from "../../tools/lib/timing.ts";

const here = dirname(fileURLToPath(import.meta.url));

/**
 * The transports measured, by name: each opens its reader on the bench's KvLoader, or says why it
 * is not available here (then skipped with that note). Adding one is one line.
 */
const TRANSPORTS: { name: string; note: string; open: (loader: KvLoader) => KvTransport | string }[] = [
  { name: "shm", note: "the owner's tmpfs shard mapped in place (same host)", open: (l) => l.shm },
  {
    name: "socket",
    note: "HTTP/1.1 over keep-alive sockets, bodies read straight into the staging buffer (decode's reader for http:// owners)",
    open: (l) => l.http,
  },
  { name: "http", note: "undici (decode's reader for https:// owners)", open: (l) => l.https },
  {
    name: "ucx",
    note: "UCX active-message rendezvous: the decode asks, pulls the owner's answer into its buffer (on one host: CMA)",
    open: (l) => l.ucx ?? "the UCX transport addon is not built (CTXBANK_UCX, libucx-dev)",
  },
];

interface TransportPoint {
  /** Transport read alone: bytes/s per repetition. */
  readBps: Summary;
  /** The whole load decode does (lease → ready to decode): bytes/s per repetition. */
  loadBps: Summary;
  loadMs: Summary;
  /**
   * CPU time per GB (ms), summed over all repetitions: the reader (this process) for the read
   * alone and for the whole load, and the chunk's owner (the prefill process; HTTP only). Unlike
   * wall time this hardly depends on what else runs on the machine.
   */
  cpuMsPerGB: { readerRead: number; readerLoad: number; owner?: number };
}

interface LengthPoint {
  tokens: number;
  chunks: number;
  kvBytes: number;
  memcpyBps: number;
  /** By transport name; a transport not available here holds the reason. */
  transports: Record<string, TransportPoint | { skipped: string }>;
  otherCores: number[];
}

interface DisaggRun {
  /** First token at the client (it comes with the handle, sampled by the prefill). */
  firstMs: number;
  /** Second token: the first that needs the handed-over KV (lease, read, verify, import, one step). */
  secondMs: number;
}

interface TtftPoint {
  tokens: number;
  /** Best of the repetitions (least disturbed by other load); every repetition is in `runs`. */
  colocatedMs: number;
  streamed: DisaggRun;
  unstreamed: DisaggRun;
  /** Disaggregated TTFT / colocated TTFT, best against best. */
  ratio: { streamed: number; unstreamed: number };
  runs: { colocatedMs: number; streamed: DisaggRun; unstreamed: DisaggRun }[];
  otherCores: number[];
}

function parse() {
  const bench = benchCli({
    name: "handoff",
    script: "npm run bench:handoff --",
    options: {
      lengths: { type: "string" },
      "ttft-lengths": { type: "string" },
      transports: { type: "string" },
      reps: { type: "string" },
      "ttft-reps": { type: "string" },
      threads: { type: "string" },
      "block-tokens": { type: "string" },
      nice: { type: "string" },
      "transfer-only": { type: "boolean" },
    },
    help: `  --lengths LIST     KV lengths in tokens for the transfers (default 4096,8192,32768)
  --ttft-lengths L   prompt lengths for TTFT (default 4096,32768)
  --transports LIST  transports to measure (default shm,socket,http,ucx); one not available is skipped with a note
  --reps N           transfer repetitions per transport and length (default 5)
  --ttft-reps N      TTFT runs per length and kind up to 4K, best kept (default 2; longer: 1)
  --threads N        engine threads for prefill, colocated and disaggregated alike (default 2)
  --block-tokens N   tokens per KV chunk (default 512)
  --nice=N           run this process and the service processes at nice N (default -10; needs root)
  --transfer-only    skip the TTFT runs (prints the transfer numbers; writes nothing)`,
    quick: "lengths 512,1024, TTFT at 1024, 2 reps",
    replot: true,
  });
  const { values, quick } = bench;
  const options = {
    lengths: (values.lengths ?? (quick ? "512,1024" : "4096,8192,32768")).split(",").filter(Boolean).map(Number),
    ttftLengths: (values["ttft-lengths"] ?? (quick ? "1024" : "4096,32768")).split(",").filter(Boolean).map(Number),
    transports: (values.transports ?? TRANSPORTS.map((t) => t.name).join(",")).split(","),
    reps: Number(values.reps ?? (quick ? 2 : 5)),
    ttftReps: Number(values["ttft-reps"] ?? (quick ? 1 : 2)),
    threads: Number(values.threads ?? 2),
    blockTokens: Number(values["block-tokens"] ?? 512),
    nice: Number(values.nice ?? -10),
    transferOnly: values["transfer-only"] ?? false,
  };
  return { bench, options };
}

const log = (msg: string) => process.stderr.write(`[handoff] ${msg}\n`);

/** Sets the nice value of every thread of another process (and its autogroup). Best effort. */
function reniceProcess(pid: number | undefined, nice: number): void {
  if (pid === undefined) return;
  try {
    for (const tid of readdirSync(`/proc/${pid}/task`)) os.setPriority(Number(tid), nice);
    writeFileSync(`/proc/${pid}/autogroup`, String(nice));
  } catch {
    // not Linux, or not allowed: the run is then just less protected from other load
  }
}

/**
 * Renices a process and, every 500 ms, each child it has started since (reniceProcess). For the
 * registry: every PostgreSQL backend starts a session of its own (setsid), so it is an autogroup
 * at nice 0 whatever the postmaster's nice; behind the services' autogroups at -10, with the
 * prefill's engine threads on both cores, backends waited ~55 ms per wake-up on the run queue
 * (/proc schedstat) and single statements stalled 2-25 s, ending runs with 503 not_ready.
 */
function keepChildrenReniced(pid: number | undefined, nice: number): () => void {
  if (pid === undefined) return () => {};
  const done = new Set<number>();
  const sweep = () => {
    for (const p of [pid, ...childrenOf(pid)]) {
      if (done.has(p)) continue;
      done.add(p);
      reniceProcess(p, nice);
    }
  };
  sweep();
  const timer = setInterval(sweep, 500);
  timer.unref();
  return () => clearInterval(timer);
}

function childrenOf(pid: number): number[] {
  try {
    return readFileSync(`/proc/${pid}/task/${pid}/children`, "utf8").split(" ").filter(Boolean).map(Number);
  } catch {
    return []; // gone, or not Linux
  }
}

/** Times SSE events of a streaming response: ms (from `t0`) at which each of the first `n` events arrived. */
async function eventTimes(res: Response, t0: number, n: number): Promise<number[]> {
  const times: number[] = [];
  const reader = res.body!.getReader();
  const dec = new TextDecoder();
  let buf = "";
  for (;;) {
    const { value, done } = await reader.read();
    if (done) break;
    buf += dec.decode(value, { stream: true });
    let i;
    while ((i = buf.indexOf("\n\n")) >= 0) {
      const block = buf.slice(0, i);
      buf = buf.slice(i + 2);
      if (/"error"/.test(block) && !/"text"/.test(block)) throw new Error(`stream error: ${block}`);
      if (times.length < n && /^(event: token|data: \{)/m.test(block)) times.push(performance.now() - t0);
    }
  }
  return times;
}

/**
 * TTFT of the same prefill in a process of its own (colocated.ts): started like the services,
 * reniced once the engine's threads exist, then timed from the sequence's creation to the first
 * token.
 */
async function colocated(ids: number[], threads: number, nice: number, maxContext: number): Promise<number> {
  const file = join(await mkdtemp("/tmp/ctxbank-colocated-"), "ids.json");
  await writeFile(file, JSON.stringify(ids));
  const child = spawn(process.execPath, ["--import", "tsx", join(here, "colocated.ts"), file, String(threads), String(maxContext)], {
    cwd: REPO_ROOT,
    stdio: ["pipe", "pipe", "inherit"],
  });
  let out = "";
  child.stdout.setEncoding("utf8");
  const exited = new Promise<number | null>((r) => child.once("exit", r));
  try {
    await new Promise<void>((resolve, reject) => {
      child.stdout.on("data", (d: string) => {
        out += d;
        if (out.includes("loaded\n")) resolve();
      });
      void exited.then((code) => reject(new Error(`colocated run exited with ${code}: ${out}`)));
    });
    reniceProcess(child.pid, nice);
    child.stdin.write("go\n");
    const code = await exited;
    const line = out.split("\n").find((l) => l.startsWith("{"));
    if (code !== 0 || !line) throw new Error(`colocated run failed (${code}): ${out}`);
    return (JSON.parse(line) as { ttftMs: number }).ttftMs;
  } finally {
    child.kill();
    await rm(dirname(file), { recursive: true, force: true });
  }
}

/** No header or body timeout: a 32K-token prefill answers after ~12 minutes (fetch's default gives up at 5). */
const patient = new Agent({ headersTimeout: 0, bodyTimeout: 0 });

async function post(url: string, body: unknown): Promise<Response> {
  return fetch(url, { method: "POST", headers: { "content-type": "application/json" }, body: JSON.stringify(body), dispatcher: patient });
}

/** utime + stime of a process in ms, from /proc (Linux). */
function processCpuMs(pid: number | undefined): number | undefined {
  if (pid === undefined) return undefined;
  try {
    const stat = readFileSync(`/proc/${pid}/stat`, "utf8");
    const f = stat.slice(stat.lastIndexOf(")") + 2).split(" ");
    return (Number(f[11]) + Number(f[12])) * 10;
  } catch {
    return undefined;
  }
}

const cpuMs = (since: NodeJS.CpuUsage) => {
  const u = process.cpuUsage(since);
  return (u.user + u.system) / 1000;
};

async function transferReps(
  rt: Runtime,
  loader: KvLoader,
  handle: Handle,
  transport: KvTransport,
  reps: number,
  ownerPid?: number,
): Promise<TransportPoint> {
  loader.override = transport;
  const readBps: number[] = [];
  const loadBps: number[] = [];
  const loadMs: number[] = [];
  let readCpu = 0;
  let loadCpu = 0;
  let readBytes = 0;
  let loadBytes = 0;
  const owner0 = processCpuMs(ownerPid);
  // The read-alone buffers, allocated and faulted in once: fresh ones every repetition would make
  // V8 collect them during the whole load timed next.
  const bufFor = new Map<string, Buffer>();
  try {
    for (let r = 0; r < reps; r++) {
      // The transport alone: every chunk into its own buffer, kvConcurrency reads in flight.
      const leased = await rt.registry.chunks.acquireRead(handle.chunk_ids, 60_000);
      // Every repetition is a decode's first load of a handle: new pages at the owner (below,
      // again before the whole load) and a new destination sequence.
      const renew = () =>
        renewPages(
          leased[0]!.location.shardPath,
          leased.map((l) => l.location),
        );
      renew();
      const bufs = leased.map(
        ({ chunk, location }) => bufFor.get(chunk.id) ?? bufFor.set(chunk.id, Buffer.alloc(location.length)).get(chunk.id)!,
      );
      const auth = new InternalAuth(TEST_INTERNAL_SECRET);
      const locs = leased.map(({ chunk, location }) => ({
        ...location,
        capability: auth.sign({
          route: "chunk",
          tenant: tenantOf(handle.request_id),
          request: handle.request_id,
          chunk: chunk.id,
          shard: location.shardId,
          epoch: location.epoch,
          offset: location.offset,
          length: location.length,
          exp: Date.now() + 60_000,
        }),
      }));
      let next = 0;
      const c0 = process.cpuUsage();
      const t0 = performance.now();
      await Promise.all(
        Array.from({ length: rt.config.kvConcurrency }, async () => {
          while (next < locs.length) {
            const i = next++;
            await transport.readChunk(locs[i]!, bufs[i]!, { deadlineMs: Date.now() + 60_000 });
          }
        }),
      );
      const readMs = performance.now() - t0;
      readCpu += cpuMs(c0);
      await rt.registry.chunks.releaseRead(handle.chunk_ids);
      const bytes = bufs.reduce((s, b) => s + b.byteLength, 0);
      readBytes += bytes;
      readBps.push(bytes / (readMs / 1000));
      // The whole load, as decode does it: lease → ready to decode, into a new sequence.
      renew();
      const seq = rt.engine.createSequence(handle.prompt_tokens + 1);
      const c1 = process.cpuUsage();
      const stats = await loader.load(handle, seq, new AbortController().signal).finally(() => seq.release());
      loadCpu += cpuMs(c1);
      loadBytes += stats.bytes;
      loadBps.push(stats.bytes / (stats.ms / 1000));
      loadMs.push(stats.ms);
    }
  } finally {
    loader.override = undefined;
  }
  const owner1 = processCpuMs(ownerPid);
  const cpuMsPerGB: TransportPoint["cpuMsPerGB"] = { readerRead: readCpu / (readBytes / 1e9), readerLoad: loadCpu / (loadBytes / 1e9) };
  if (ownerPid !== undefined && owner0 !== undefined && owner1 !== undefined)
    cpuMsPerGB.owner = (owner1 - owner0) / ((readBytes + loadBytes) / 1e9);
  return { readBps: summarize(readBps), loadBps: summarize(loadBps), loadMs: summarize(loadMs), cpuMsPerGB };
}

function memcpyBps(bytes: number): number {
  const src = Buffer.alloc(bytes, 1);
  const dst = Buffer.allocUnsafe(bytes);
  src.copy(dst); // warm the pages
  const t0 = performance.now();
  for (let i = 0; i < 3; i++) src.copy(dst);
  return (3 * bytes) / ((performance.now() - t0) / 1000);
}

async function main(): Promise<void> {
  const { bench, options: opts } = parse();
  const { results } = bench;
  if (bench.replot) {
    const saved = await results.readJson<{ points: LengthPoint[]; ttft: TtftPoint[]; skipped: string[]; options: { threads: number } }>(
      "handoff",
    );
    await results.chart("handoff", chart(saved.points, saved.ttft, saved.options.threads));
    await results.markdown("handoff", markdown(saved.points, saved.ttft, saved.skipped));
    log(`redrew ${results}/handoff.svg and handoff.md`);
    return;
  }
  const record = bench.record(["services", "shared"]);
  log(`lengths ${opts.lengths.join(",")}, ${opts.reps} reps, ${opts.threads} threads, blocks of ${opts.blockTokens}`);
  const niceError = setProcessNice(opts.nice);
  if (niceError) log(`could not set nice ${opts.nice}: ${niceError}`);
  // Lengths past the model's trained context are measured with the engine's context raised to
  // them (--max-context): the bytes moved and the compute are those of a model with that context,
  // the answers are not meaningful (2 tokens are generated, and only timed).
  const trained = (await loadModel(await resolveModel())).config.nCtxTrain;
  const maxContext = Math.max(trained, Math.max(...opts.lengths, ...(opts.transferOnly ? [] : opts.ttftLengths)) + 2);
  if (maxContext > trained) log(`context raised to ${maxContext} tokens (the model's is ${trained}): timings only, not answers`);
  await mkdir(results.dir, { recursive: true });
  // The registry's server log (slow statements, lock waits, connections) is kept beside the
  // results, and its files live in tmpfs, off the disk.
  const pg = await startPostgres("ctxbank_bench", { keepLogAt: join(results.dir, "postgres.log"), baseDir: "/dev/shm" });
  // The registry runs at the services' priority too, its backends included (keepChildrenReniced).
  const stopRenicing = keepChildrenReniced(pg.pid(), opts.nice);
  const shardDir = await mkdtemp("/dev/shm/ctxbank-bench-");
  const procs: ServiceProcess[] = [];
  let rt: Runtime | undefined;
  const cleanup = async () => {
    await Promise.all(procs.map((p) => p.stop()));
    await rt?.close();
    stopRenicing();
    await pg.stop();
    await rm(shardDir, { recursive: true, force: true });
  };
  for (const sig of ["SIGINT", "SIGTERM"] as const) {
    process.once(sig, () => {
      log(`${sig}: stopping the services and PostgreSQL`);
      void cleanup().finally(() => process.exit(130));
    });
  }
  try {
    // A 32K-token prefill takes ~12 min on 2 cores: the decode's prefill call and KV load
    // deadlines are raised to an hour so that only a real failure ends a run. The heartbeat
    // timeout (60 s) and the registry's statement deadline (2 min) too: the bench measures the
    // handoff, not failure detection (runs used to lose the prefill to a starved registry:
    // keepChildrenReniced).
    const long = String(3_600_000);
    const common = [
      "--database-url",
      pg.url,
      "--shard-dir",
      shardDir,
      "--retain-ms",
      long,
      "--kv-timeout-ms",
      long,
      "--prefill-timeout-ms",
      long,
      "--heartbeat-timeout-ms",
      "60000",
      "--db-timeout-ms",
      "120000",
      "--max-context",
      String(maxContext),
    ];
    log("starting prefill and two decode processes (KV over shm, streamed and not) against PostgreSQL 15");
    const prefill = await startService("prefill", [
      ...common,
      "--threads",
      String(opts.threads),
      "--block-tokens",
      String(opts.blockTokens),
      "--shard-bytes",
      String(2 * 2 ** 30),
      "--instance-id",
      "bench-prefill",
    ]);
    procs.push(prefill);
    const [streamed, unstreamed] = await Promise.all([
      startService("decode", [
        ...common,
        "--threads",
        "1",
        "--transport",
        "shm",
        "--kv-streaming",
        "true",
        "--instance-id",
        "bench-decode-streamed",
      ]),
      startService("decode", [
        ...common,
        "--threads",
        "1",
        "--transport",
        "shm",
        "--kv-streaming",
        "false",
        "--instance-id",
        "bench-decode-unstreamed",
      ]),
    ]);
    procs.push(streamed, unstreamed);
    for (const p of procs) reniceProcess(p.child.pid, opts.nice);
    const config = loadConfig(
      "serve",
      {},
      {},
      { databaseUrl: pg.url, shardDir, threads: opts.threads, logLevel: "warn", kvTimeoutMs: 3_600_000, maxContext },
    );
    rt = await openRuntime(config, createLogger(config));
    // The bench's own reads carry capabilities signed with the services' shared secret.
    const loader = new KvLoader(rt, undefined, new InternalAuth(TEST_INTERNAL_SECRET));
    const tok = rt.tokenizer;
    const allIds = benchTokens((text) => tok.encode(text), maxContext - 2);

    // One short request through the whole path first: connections, JIT and the engines' first
    // forward are then warm in every process, as in a running deployment.
    for (const [i, d] of [streamed, unstreamed].entries()) {
      const warm = await post(`${d.url}/v1/completions`, {
        model: "default",
        prompt: allIds.slice(64 * i, 64 * i + 64),
        max_tokens: 2,
        temperature: 0,
      });
      if (!warm.ok) throw new Error(`warm-up failed: ${await warm.text()}`);
      await warm.text();
    }
    const maxPrompt = rt.engine.maxContext - 2; // + the 2 generated tokens
    const skipped: string[] = [];
    const skip = (what: string, n: number) => {
      const note = `${what} at ${n} tokens skipped: the model's context is ${rt!.engine.maxContext} tokens`;
      skipped.push(note);
      log(note);
    };
    const other: number[] = [];
    const quiet = async () => other.push((await waitForQuiet(0.5, 30_000)).otherCores ?? 0);

    const points: LengthPoint[] = [];
    for (const wanted of opts.lengths) {
      const n = wanted;
      if (n > maxPrompt) {
        skip("transfer", wanted);
        continue;
      }
      log(`${n} tokens: prefill, then transfers (${opts.reps} reps per transport)`);
      await quiet();
      const pr = await post(`${prefill.url}/v1/prefill`, { prompt_token_ids: allIds.slice(0, n), max_tokens: 2 });
      const handle = (await pr.json()) as Handle;
      if (!pr.ok) throw new Error(`prefill failed: ${JSON.stringify(handle)}`);
      const cpu = new CpuMeter().start();
      const transports: LengthPoint["transports"] = {};
      let kvBytes = 0;
      for (const name of opts.transports) {
        const spec = TRANSPORTS.find((t) => t.name === name);
        const t = spec ? spec.open(loader) : `unknown transport (known: ${TRANSPORTS.map((x) => x.name).join(", ")})`;
        if (typeof t === "string") {
          transports[name] = { skipped: t };
          log(`${name}: skipped (${t})`);
          continue;
        }
        const point = await transferReps(rt, loader, handle, t, opts.reps, name === "shm" ? undefined : prefill.child.pid);
        transports[name] = point;
        kvBytes = Math.round(point.loadBps.median * (point.loadMs.median / 1000));
        log(`${n}: ${name} read ${gbps(point.readBps.median)}, whole load ${gbps(point.loadBps.median)}`);
      }
      const cores = cpu.stop().otherCores ?? 0;
      await post(`${unstreamed.url}/v1/decode`, { handle, max_tokens: 1 }).then((r) => r.text()); // releases the handle's chunks
      points.push({ tokens: n, chunks: handle.chunk_ids.length, kvBytes, memcpyBps: memcpyBps(kvBytes), transports, otherCores: [cores] });
    }

    const ttft: TtftPoint[] = [];
    for (const wanted of opts.transferOnly ? [] : opts.ttftLengths) {
      const n = wanted;
      if (n > maxPrompt) {
        skip("TTFT", wanted);
        continue;
      }
      const ids = allIds.slice(0, n);
      const runs: TtftPoint["runs"] = [];
      const otherHere: number[] = [];
      const reps = n <= 4096 ? opts.ttftReps : 1;
      const disagg = async (d: ServiceProcess): Promise<DisaggRun> => {
        await quiet();
        otherHere.push(other.at(-1)!);
        const t1 = performance.now();
        const res = await post(`${d.url}/v1/completions`, { model: "default", prompt: ids, max_tokens: 2, temperature: 0, stream: true });
        const [firstMs, secondMs] = await eventTimes(res, t1, 2);
        return { firstMs: firstMs!, secondMs: secondMs! };
      };
      for (let r = 0; r < reps; r++) {
        log(`${n} tokens: colocated, disaggregated streamed, disaggregated unstreamed (${r + 1}/${reps})`);
        await quiet();
        otherHere.push(other.at(-1)!);
        const colocatedMs = await colocated(ids, opts.threads, opts.nice, maxContext);
        const s1 = await disagg(streamed);
        const u1 = await disagg(unstreamed);
        runs.push({ colocatedMs, streamed: s1, unstreamed: u1 });
        log(
          `${n}: colocated ${fmtNum(colocatedMs)} ms; streamed ${fmtNum(s1.firstMs)} / 2nd ${fmtNum(s1.secondMs)} ms; unstreamed ${fmtNum(u1.firstMs)} / 2nd ${fmtNum(u1.secondMs)} ms`,
        );
      }
      const best = (f: (r: (typeof runs)[number]) => number) => Math.min(...runs.map(f));
      const colocatedMs = best((r) => r.colocatedMs);
      const s = { firstMs: best((r) => r.streamed.firstMs), secondMs: best((r) => r.streamed.secondMs) };
      const u = { firstMs: best((r) => r.unstreamed.firstMs), secondMs: best((r) => r.unstreamed.secondMs) };
      ttft.push({
        tokens: n,
        colocatedMs,
        streamed: s,
        unstreamed: u,
        ratio: { streamed: s.firstMs / colocatedMs, unstreamed: u.firstMs / colocatedMs },
        runs,
        otherCores: otherHere,
      });
    }

    if (opts.transferOnly) {
      process.stdout.write(markdown(points, [], skipped) + "\n");
      return;
    }
    const result = {
      benchmark: "handoff",
      ...record,
      finished: new Date().toISOString(),
      options: opts,
      model: { path: rt.modelPath, fingerprint: rt.model.fingerprint, kvBytesPerToken: rt.model.config.kvBytesPerToken },
      transports: Object.fromEntries(TRANSPORTS.map((t) => [t.name, t.note])),
      skipped,
      points,
      ttft,
    };
    await results.json("handoff", result);
    await results.chart("handoff", chart(points, ttft, opts.threads));
    await results.markdown("handoff", markdown(points, ttft, skipped));
    process.stdout.write(markdown(points, ttft, skipped) + "\n");
    log(`wrote ${results}/handoff.json, handoff.svg, handoff.md`);
    await loader.close();
  } catch (err) {
    // The services log at info into memory: their warnings and errors say why a run failed.
    for (const p of procs) {
      const bad = p
        .log()
        .split("\n")
        .filter((l) => /"level":(4|5|6)0/.test(l));
      if (bad.length > 0) log(`pid ${p.child.pid} warned or failed:\n${bad.slice(-20).join("\n")}`);
    }
    throw err;
  } finally {
    await cleanup();
  }
}

const gbps = (bps: number) => `${(bps / 1e9).toFixed(2)} GB/s`;
const medBest = (s: Summary) => `${gbps(s.median)} (${(s.max / 1e9).toFixed(2)})`;

const measured = (p: LengthPoint, name: string): TransportPoint | undefined => {
  const t = p.transports[name];
  return t && !("skipped" in t) ? t : undefined;
};
const namesIn = (points: LengthPoint[]) => [...new Set(points.flatMap((p) => Object.keys(p.transports)))];

export function markdown(points: LengthPoint[], ttft: TtftPoint[], skipped: string[]): string {
  const names = namesIn(points);
  const cell = (p: LengthPoint, name: string, f: (t: TransportPoint) => string) => {
    const t = p.transports[name];
    return !t ? "—" : "skipped" in t ? `skipped: ${t.skipped}` : f(t);
  };
  const load = markdownTable({
    headers: ["KV tokens", "KV", "chunks", ...names.map((n) => `${n} whole load`), "memcpy"],
    rows: points.map((p) => [
      String(p.tokens),
      `${(p.kvBytes / 2 ** 20).toFixed(1)} MiB`,
      String(p.chunks),
      ...names.map((n) => cell(p, n, (t) => medBest(t.loadBps))),
      gbps(p.memcpyBps),
    ]),
  });
  const read = markdownTable({
    headers: ["KV tokens", ...names.map((n) => `${n} read`)],
    rows: points.map((p) => [String(p.tokens), ...names.map((n) => cell(p, n, (t) => medBest(t.readBps)))]),
  });
  const cpu = markdownTable({
    headers: ["KV tokens", ...names.flatMap((n) => [`${n}: reader, read`, `${n}: reader, whole load`, `${n}: owner`])],
    rows: points.map((p) => [
      String(p.tokens),
      ...names.flatMap((n) => {
        const t = measured(p, n);
        if (!t) return ["—", "—", "—"];
        return [
          `${fmtNum(t.cpuMsPerGB.readerRead, 0)} ms`,
          `${fmtNum(t.cpuMsPerGB.readerLoad, 0)} ms`,
          t.cpuMsPerGB.owner === undefined ? "—" : `${fmtNum(t.cpuMsPerGB.owner, 0)} ms`,
        ];
      }),
    ]),
  });
  const ttftTable = markdownTable({
    headers: [
      "prompt",
      "TTFT colocated",
      "TTFT streamed",
      "ratio",
      "TTFT unstreamed",
      "ratio",
      "2nd token streamed",
      "2nd token unstreamed",
    ],
    rows: ttft.map((t) => [
      String(t.tokens),
      `${fmtNum(t.colocatedMs)} ms`,
      `${fmtNum(t.streamed.firstMs)} ms`,
      `${t.ratio.streamed.toFixed(3)}x`,
      `${fmtNum(t.unstreamed.firstMs)} ms`,
      `${t.ratio.unstreamed.toFixed(3)}x`,
      `${fmtNum(t.streamed.secondMs)} ms`,
      `${fmtNum(t.unstreamed.secondMs)} ms`,
    ]),
  });
  return [
    "### Whole load, lease → ready to decode (median of the repetitions, best in parentheses; GB = 10^9 bytes)",
    "What decode does: lease, read, verify (CRC-32C, fingerprint, shape), import into the cache, release. " +
      "Each repetition is a first load, as in service: the owner's pages are new (rewritten before each load) and the destination is a new sequence.",
    load,
    "### The transport read alone (every chunk of the handle into a buffer of its own)",
    read,
    "### CPU time per GB moved (all repetitions; reader = the decode side, owner = the prefill process serving the bytes)",
    cpu,
    "### Time to first and second token (best of the repetitions)",
    "Colocated = the engine alone in a fresh process doing the prefill service's computation. Disaggregated = decode's /v1/completions calling the prefill process, KV over shm; streamed = the decode loads the chunks while the prefill computes (the streamed handle), unstreamed = after the handle. The first token comes with the handle; the 2nd is the first that needs the handed-over KV.",
    ttftTable,
    ...(skipped.length ? ["### Not measured", skipped.map((s) => `* ${s}`).join("\n")] : []),
    "",
  ].join("\n\n");
}

const COLORS = ["#d62728", "#1f77b4", "#2ca02c", "#ff7f0e", "#9467bd", "#8c564b"];

function chart(points: LengthPoint[], ttft: TtftPoint[], threads: number): string {
  const xs = points.map((p) => p.tokens);
  const gb = (bps: number) => bps / 1e9;
  const names = namesIn(points);
  const line = (name: string, f: (t: TransportPoint) => number) =>
    points.flatMap((p): [number, number][] => {
      const t = measured(p, name);
      return t ? [[p.tokens, f(t)]] : [];
    });
  const tx = ttft.map((t) => t.tokens);
  const panels: Panel[] = [
    {
      title: "KV whole load, lease → ready to decode",
      xLabel: "KV tokens",
      yLabel: "GB/s",
      xLog2: true,
      xTicks: xs,
      series: names.flatMap((n, i) => [
        { name: `${n}: whole load`, color: COLORS[i % COLORS.length]!, points: line(n, (t) => gb(t.loadBps.median)), labels: true },
        { name: `${n}: transport read`, color: COLORS[i % COLORS.length]!, dash: "5,3", points: line(n, (t) => gb(t.readBps.median)) },
      ]),
      note: "goals: shm and UCX whole load >= 3 GB/s, HTTP >= 1 GB/s",
    },
    {
      title: "TTFT disaggregated / colocated",
      xLabel: "prompt tokens",
      yLabel: "ratio",
      xLog2: true,
      xTicks: tx,
      yMin: 0.9,
      yTickFormat: (y) => y.toFixed(2),
      series: [
        { name: "streamed handle", color: "#9467bd", points: ttft.map((t) => [t.tokens, t.ratio.streamed]), labels: true },
        { name: "unstreamed", color: "#8c564b", dash: "5,3", points: ttft.map((t) => [t.tokens, t.ratio.unstreamed]), labels: true },
        { name: "goal 1.05", color: "#999999", dash: "6,4", points: ttft.map((t) => [t.tokens, 1.05]) },
      ],
      note: `colocated = the same prefill, engine alone in its own process; best of runs; ${threads} threads`,
    },
    {
      title: "Second token − first (the handoff + one step)",
      xLabel: "prompt tokens",
      yLabel: "ms",
      xLog2: true,
      xTicks: tx,
      series: [
        {
          name: "streamed handle",
          color: "#9467bd",
          points: ttft.map((t) => [t.tokens, t.streamed.secondMs - t.streamed.firstMs]),
          labels: true,
        },
        {
          name: "unstreamed",
          color: "#8c564b",
          dash: "5,3",
          points: ttft.map((t) => [t.tokens, t.unstreamed.secondMs - t.unstreamed.firstMs]),
          labels: true,
        },
      ],
      note: "best runs; KV over shm",
    },
  ];
  return renderChart(panels, {
    title: "ctxbank prefill/decode handoff",
    subtitle: "prefill and decode in separate processes on one host, PostgreSQL 15 registry",
  });
}

main().catch((err: unknown) => {
  process.stderr.write(`[handoff] failed: ${(err as Error).stack ?? err}\n`);
  process.exit(1);
});
