// npm run bench:handoff [-- options]   (tsx bench/handoff/run.ts)
//
// Prefill → decode KV handoff, with the services as they are deployed: a `ctxbank prefill`
// process and two `ctxbank decode` processes (one reading over HTTP, one over shm) against a
// PostgreSQL 15 started for the run. For each prompt length it measures
//   * KV bytes/s per transport: the transport read alone (every chunk of a handle into buffers,
//     as many in flight as decode uses) and the whole load decode does (lease, read, verify
//     checksum + fingerprint, import into a sequence's cache, release), a few repetitions each,
//     plus a memcpy of the same bytes as the floor;
//   * TTFT: colocated (the engine alone in a process of its own: the same prefill + first token) against disaggregated
//     (client → decode's /v1/completions → prefill process over HTTP → first token streamed),
//     and the time to the second token, which is when the handed-over KV is first used.
// Writes results/handoff.json, results/handoff.svg, results/handoff.md.
import { spawn } from "node:child_process";
import { readdirSync, readFileSync, writeFileSync } from "node:fs";
import os from "node:os";
import { mkdtemp, rm, writeFile } from "node:fs/promises";
import { dirname, join, resolve } from "node:path";
import { fileURLToPath } from "node:url";
import { parseArgs } from "node:util";
import { loadConfig } from "../../shared/platform/config.ts";
import type { Handle } from "../../shared/platform/http/wire.ts";
import { KvLoader } from "../../services/handoff/reader.ts";
import { createLogger, openRuntime, type Runtime } from "../../services/runtime.ts";
import { startPostgres } from "../../tools/lib/postgres.ts";
import { InternalAuth } from "../../shared/platform/auth/capability.ts";
import { TEST_INTERNAL_SECRET, startService, type ServiceProcess } from "../../tools/lib/services.ts";
import { benchText } from "../engine/text.ts";
import { writeFileAtomic, writeJson } from "../../tools/lib/json.ts";
import { gitInfo, machineInfo, setProcessNice } from "../../tools/lib/machine.ts";
import { renderChart, type Panel } from "../../tools/lib/svg-chart.ts";
import { fmtNum, markdownTable } from "../../tools/lib/table.ts";
import { CpuMeter, summarize, waitForQuiet, type Summary } from "../../tools/lib/timing.ts";

const here = dirname(fileURLToPath(import.meta.url));
const repoRoot = resolve(here, "../..");

const HELP = `Usage: npm run bench:handoff -- [options]

  --lengths LIST     prompt lengths in tokens (default 1024,4096,8192)
  --reps N           transfer repetitions per transport and length (default 5)
  --ttft-reps N      colocated/disaggregated TTFT pairs per length up to 4K, best kept (default 2; 8K: 1)
  --threads N        engine threads for prefill, colocated and disaggregated alike (default 2)
  --block-tokens N   tokens per KV chunk (default 512)
  --nice=N           run this process and the service processes at nice N (default -10; needs root)
  --quick            lengths 512,1024, 2 reps; writes to bench/handoff/tmp/
  --render FILE      only redraw the chart and tables from a saved handoff.json
  --transfer-only    skip the TTFT runs (prints the transfer numbers; writes nothing)
  --out DIR          results directory (default bench/handoff/results)
`;

interface TransportPoint {
  /** Transport read alone: bytes/s per repetition. */
  readBps: Summary;
  /** The whole load decode does: bytes/s per repetition. */
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
  transports: { http: TransportPoint; shm: TransportPoint };
  ttft: {
    /** Best of the repetitions (least disturbed by other load); every repetition is in `runs`. */
    colocatedMs: number;
    /** Through decode's OpenAI route (prefill process over HTTP), KV over shm. Best of the repetitions. */
    disaggregatedMs: number;
    ratio: number;
    runs: { colocatedMs: number; disaggregatedMs: number; disaggregatedSecondTokenMs: number }[];
    /** Prefill process: POST /v1/prefill wall time as the client sees it, and the service's own prefill_ms. */
    prefillCallMs: number;
    prefillServiceMs: number;
    /** Second token of the disaggregated run (shm: from the request; http: /v1/decode with a ready handle). */
    secondTokenMs: { shm: number; http: number };
    /** Second minus first token of the disaggregated run over shm: the KV handoff plus one decode step. */
    handoffAndStepMs: number;
  };
  otherCores: number[];
}

function parse() {
  const { values } = parseArgs({
    options: {
      lengths: { type: "string" },
      reps: { type: "string" },
      "ttft-reps": { type: "string" },
      threads: { type: "string" },
      "block-tokens": { type: "string" },
      quick: { type: "boolean" },
      nice: { type: "string" },
      render: { type: "string" },
      "transfer-only": { type: "boolean" },
      out: { type: "string" },
      help: { type: "boolean", short: "h" },
    },
  });
  if (values.help) {
    process.stdout.write(HELP);
    process.exit(0);
  }
  const quick = values.quick ?? false;
  return {
    lengths: (values.lengths ?? (quick ? "512,1024" : "1024,4096,8192")).split(",").map(Number),
    reps: Number(values.reps ?? (quick ? 2 : 5)),
    ttftReps: Number(values["ttft-reps"] ?? (quick ? 1 : 2)),
    threads: Number(values.threads ?? 2),
    blockTokens: Number(values["block-tokens"] ?? 512),
    out: resolve(values.out ?? join(here, quick ? "tmp" : "results")),
    nice: Number(values.nice ?? -10),
    render: values.render,
    transferOnly: values["transfer-only"] ?? false,
  };
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
async function colocated(ids: number[], threads: number, nice: number): Promise<number> {
  const file = join(await mkdtemp("/tmp/ctxbank-colocated-"), "ids.json");
  await writeFile(file, JSON.stringify(ids));
  const child = spawn(process.execPath, ["--import", "tsx", join(here, "colocated.ts"), file, String(threads)], { cwd: repoRoot, stdio: ["pipe", "pipe", "inherit"] });
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

async function post(url: string, body: unknown): Promise<Response> {
  return fetch(url, { method: "POST", headers: { "content-type": "application/json" }, body: JSON.stringify(body) });
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

async function transferReps(rt: Runtime, loader: KvLoader, handle: Handle, transport: "http" | "shm", reps: number, ownerPid?: number): Promise<TransportPoint> {
  rt.config.transport = transport;
  const readBps: number[] = [];
  const loadBps: number[] = [];
  const loadMs: number[] = [];
  let readCpu = 0;
  let loadCpu = 0;
  let readBytes = 0;
  let loadBytes = 0;
  const owner0 = processCpuMs(ownerPid);
  const seq = rt.engine.createSequence(handle.prompt_tokens + 1);
  try {
    for (let r = 0; r < reps; r++) {
      // The transport alone: every chunk into its own buffer, kvConcurrency reads in flight.
      const leased = await rt.registry.chunks.acquireRead(handle.chunk_ids, 60_000);
      const t = loader.pick(leased[0]!.location);
      const bufs = leased.map((l) => Buffer.allocUnsafe(l.location.length));
      bufs.forEach((b) => b.fill(0)); // fault the pages in before timing
      let next = 0;
      const c0 = process.cpuUsage();
      const t0 = performance.now();
      await Promise.all(
        Array.from({ length: rt.config.kvConcurrency }, async () => {
          while (next < leased.length) {
            const i = next++;
            await t.readChunk(leased[i]!.location, bufs[i]!, { deadlineMs: Date.now() + 60_000 });
          }
        }),
      );
      const readMs = performance.now() - t0;
      readCpu += cpuMs(c0);
      await rt.registry.chunks.releaseRead(handle.chunk_ids);
      const bytes = bufs.reduce((s, b) => s + b.byteLength, 0);
      readBytes += bytes;
      readBps.push(bytes / (readMs / 1000));
      // The whole load, as decode does it.
      seq.truncate(0);
      const c1 = process.cpuUsage();
      const stats = await loader.load(handle, seq, new AbortController().signal);
      loadCpu += cpuMs(c1);
      loadBytes += stats.bytes;
      if (stats.transport !== transport) throw new Error(`expected ${transport}, loaded over ${stats.transport}`);
      loadBps.push(stats.bytes / (stats.ms / 1000));
      loadMs.push(stats.ms);
    }
  } finally {
    seq.release();
  }
  const owner1 = processCpuMs(ownerPid);
  const cpuMsPerGB: TransportPoint["cpuMsPerGB"] = { readerRead: readCpu / (readBytes / 1e9), readerLoad: loadCpu / (loadBytes / 1e9) };
  if (transport === "http" && owner0 !== undefined && owner1 !== undefined) cpuMsPerGB.owner = (owner1 - owner0) / ((readBytes + loadBytes) / 1e9);
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
  const opts = parse();
  if (opts.render) {
    const saved = JSON.parse(readFileSync(opts.render, "utf8")) as { points: LengthPoint[]; options: { threads: number } };
    const dir = dirname(resolve(opts.render));
    await writeFileAtomic(join(dir, "handoff.svg"), chart(saved.points, saved.options.threads));
    await writeFileAtomic(join(dir, "handoff.md"), markdown(saved.points));
    log(`redrew ${join(dir, "handoff.svg")} and handoff.md`);
    return;
  }
  const started = new Date().toISOString();
  log(`lengths ${opts.lengths.join(",")}, ${opts.reps} reps, ${opts.threads} threads, blocks of ${opts.blockTokens}`);
  const niceError = setProcessNice(opts.nice);
  if (niceError) log(`could not set nice ${opts.nice}: ${niceError}`);
  const pg = await startPostgres("ctxbank_bench");
  const shardDir = await mkdtemp("/dev/shm/ctxbank-bench-");
  const procs: ServiceProcess[] = [];
  let rt: Runtime | undefined;
  const cleanup = async () => {
    await Promise.all(procs.map((p) => p.stop()));
    await rt?.close();
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
    const common = ["--database-url", pg.url, "--shard-dir", shardDir, "--retain-ms", "3600000", "--kv-timeout-ms", "600000"];
    log("starting prefill and two decode processes against PostgreSQL 15");
    const prefill = await startService("prefill", [...common, "--threads", String(opts.threads), "--block-tokens", String(opts.blockTokens), "--shard-bytes", String(2 * 2 ** 30), "--instance-id", "bench-prefill"]);
    procs.push(prefill);
    const [viaShm, viaHttp] = await Promise.all([
      startService("decode", [...common, "--threads", "1", "--transport", "shm", "--instance-id", "bench-decode-shm"]),
      startService("decode", [...common, "--threads", "1", "--transport", "http", "--instance-id", "bench-decode-http"]),
    ]);
    procs.push(viaShm, viaHttp);
    for (const p of procs) reniceProcess(p.child.pid, opts.nice);
    const config = loadConfig("serve", {}, {}, { databaseUrl: pg.url, shardDir, threads: opts.threads, logLevel: "warn", kvTimeoutMs: 600_000 });
    rt = await openRuntime(config, createLogger(config));
    // The bench's own reads carry capabilities signed with the services' shared secret.
    const loader = new KvLoader(rt, undefined, new InternalAuth(TEST_INTERNAL_SECRET));
    const tok = rt.tokenizer;
    const allIds = tok.encode(benchText(Math.ceil(Math.max(...opts.lengths) / 500) + 1));

    // One short request through the whole path first: connections, JIT and the engines' first
    // forward are then warm in every process, as in a running deployment.
    const warm = await post(`${viaShm.url}/v1/completions`, { model: "default", prompt: allIds.slice(0, 64), max_tokens: 2, temperature: 0 });
    if (!warm.ok) throw new Error(`warm-up failed: ${await warm.text()}`);
    await post(`${viaHttp.url}/v1/completions`, { model: "default", prompt: allIds.slice(64, 128), max_tokens: 2, temperature: 0 }).then((r) => r.text());

    const points: LengthPoint[] = [];
    for (const wanted of opts.lengths) {
      // Prompt + the 2 generated tokens must fit the context (8192 → 8190).
      const n = Math.min(wanted, rt.engine.maxContext - 2);
      const ids = allIds.slice(0, n);
      const other: number[] = [];
      const quiet = async () => other.push((await waitForQuiet(0.5, 30_000)).otherCores ?? 0);
      const runs: LengthPoint["ttft"]["runs"] = [];
      const ttftReps = opts.transferOnly ? 0 : n <= 4096 ? opts.ttftReps : 1;
      for (let r = 0; r < ttftReps; r++) {
        log(`${n} tokens: colocated prefill (${r + 1}/${ttftReps})`);
        await quiet();
        const colocatedMs = await colocated(ids, opts.threads, opts.nice);
        log(`${n} tokens: disaggregated via decode's /v1/completions, KV over shm (${r + 1}/${ttftReps})`);
        await quiet();
        const t1 = performance.now();
        const res = await post(`${viaShm.url}/v1/completions`, { model: "default", prompt: ids, max_tokens: 2, temperature: 0, stream: true });
        const [first, second] = await eventTimes(res, t1, 2);
        runs.push({ colocatedMs, disaggregatedMs: first!, disaggregatedSecondTokenMs: second! });
        log(`${n} tokens: TTFT colocated ${fmtNum(colocatedMs)} ms, disaggregated ${fmtNum(first)} ms`);
      }
      const best = (f: (r: (typeof runs)[number]) => number) => {
        const xs = runs.map(f).filter(Number.isFinite);
        return xs.length ? Math.min(...xs) : Number.NaN;
      };
      const colocatedMs = best((r) => r.colocatedMs);
      const disaggMs = best((r) => r.disaggregatedMs);

      log(`${n} tokens: prefill call, transfers (${opts.reps} reps per transport), decode over http`);
      await quiet();
      const t2 = performance.now();
      const pr = await post(`${prefill.url}/v1/prefill`, { prompt_token_ids: ids, max_tokens: 2 });
      const handle = (await pr.json()) as Handle;
      const prefillCallMs = performance.now() - t2;
      if (!pr.ok) throw new Error(`prefill failed: ${JSON.stringify(handle)}`);
      const cpu = new CpuMeter().start();
      const http = await transferReps(rt, loader, handle, "http", opts.reps, prefill.child.pid);
      const shm = await transferReps(rt, loader, handle, "shm", opts.reps);
      other.push(cpu.stop().otherCores ?? 0);
      const t3 = performance.now();
      const dres = await post(`${viaHttp.url}/v1/decode`, { handle, max_tokens: 2, temperature: 0, stream: true });
      const [, secondHttp] = await eventTimes(dres, t3, 2);
      const kvBytes = http.loadBps.n > 0 ? Math.round(http.loadBps.median * (http.loadMs.median / 1000)) : 0;
      const point: LengthPoint = {
        tokens: n,
        chunks: handle.chunk_ids.length,
        kvBytes,
        memcpyBps: memcpyBps(kvBytes),
        transports: { http, shm },
        ttft: {
          colocatedMs,
          disaggregatedMs: disaggMs,
          ratio: disaggMs / colocatedMs,
          runs,
          prefillCallMs,
          prefillServiceMs: handle.prefill_ms,
          secondTokenMs: { shm: best((r) => r.disaggregatedSecondTokenMs), http: secondHttp! },
          handoffAndStepMs: best((r) => r.disaggregatedSecondTokenMs - r.disaggregatedMs),
        },
        otherCores: other,
      };
      points.push(point);
      log(
        `${n}: http read ${gbps(http.readBps.median)} load ${gbps(http.loadBps.median)} | shm read ${gbps(shm.readBps.median)} load ${gbps(shm.loadBps.median)} | ` +
          `TTFT colocated ${fmtNum(colocatedMs)} ms, disaggregated ${fmtNum(disaggMs)} ms (x${point.ttft.ratio.toFixed(3)})`,
      );
    }

    if (opts.transferOnly) {
      process.stdout.write(markdown(points) + "\n");
      return;
    }
    const result = {
      benchmark: "handoff",
      command: `npm run bench:handoff -- ${process.argv.slice(2).join(" ")}`.trim(),
      started,
      finished: new Date().toISOString(),
      options: opts,
      model: { path: rt.modelPath, fingerprint: rt.model.fingerprint, kvBytesPerToken: rt.model.config.kvBytesPerToken },
      machine: machineInfo(),
      git: gitInfo(repoRoot, ["services", "shared"]),
      points,
    };
    await writeJson(join(opts.out, "handoff.json"), result);
    await writeFileAtomic(join(opts.out, "handoff.svg"), chart(points, opts.threads));
    await writeFileAtomic(join(opts.out, "handoff.md"), markdown(points));
    process.stdout.write(markdown(points) + "\n");
    log(`wrote ${join(opts.out, "handoff.json")}, handoff.svg, handoff.md`);
    await loader.close();
  } finally {
    await cleanup();
  }
}

const gbps = (bps: number) => `${(bps / 1e9).toFixed(2)} GB/s`;
const medBest = (s: Summary) => `${gbps(s.median)} (${(s.max / 1e9).toFixed(2)})`;

export function markdown(points: LengthPoint[]): string {
  const transfer = markdownTable({
    headers: ["prompt", "KV", "chunks", "http read", "http load", "shm read", "shm load", "memcpy"],
    rows: points.map((p) => [
      String(p.tokens),
      `${(p.kvBytes / 2 ** 20).toFixed(1)} MiB`,
      String(p.chunks),
      medBest(p.transports.http.readBps),
      medBest(p.transports.http.loadBps),
      medBest(p.transports.shm.readBps),
      medBest(p.transports.shm.loadBps),
      gbps(p.memcpyBps),
    ]),
  });
  const cpu = markdownTable({
    headers: ["prompt", "http read: reader", "http: owner", "http load: reader", "shm read: reader", "shm load: reader", "http read, own cores"],
    rows: points.map((p) => {
      const h = p.transports.http.cpuMsPerGB;
      const sh = p.transports.shm.cpuMsPerGB;
      return [
        String(p.tokens),
        `${fmtNum(h.readerRead, 0)} ms`,
        h.owner === undefined ? "—" : `${fmtNum(h.owner, 0)} ms`,
        `${fmtNum(h.readerLoad, 0)} ms`,
        `${fmtNum(sh.readerRead, 0)} ms`,
        `${fmtNum(sh.readerLoad, 0)} ms`,
        h.owner === undefined ? "—" : gbps(1e12 / Math.max(h.readerRead, h.owner)),
      ];
    }),
  });
  const ttft = markdownTable({
    headers: ["prompt", "TTFT colocated", "TTFT disaggregated", "ratio", "2nd token disagg. shm", "2nd − 1st (handoff + step)", "2nd token, ready handle, http", "prefill service"],
    rows: points.map((p) => [
      String(p.tokens),
      `${fmtNum(p.ttft.colocatedMs)} ms`,
      `${fmtNum(p.ttft.disaggregatedMs)} ms`,
      `${p.ttft.ratio.toFixed(3)}x`,
      `${fmtNum(p.ttft.secondTokenMs.shm)} ms`,
      `${fmtNum(p.ttft.handoffAndStepMs)} ms`,
      `${fmtNum(p.ttft.secondTokenMs.http)} ms`,
      `${fmtNum(p.ttft.prefillServiceMs)} ms`,
    ]),
  });
  return [
    "### KV handoff throughput (median of the repetitions, best in parentheses; GB = 10^9 bytes)",
    "read = the transport alone, every chunk into a buffer; load = what decode does: lease, read, verify (checksum, fingerprint, shape), import into the cache, release.",
    transfer,
    "### CPU time per GB moved (all repetitions; reader = the decode side, owner = the prefill process serving the bytes)",
    "The last column is what the HTTP read would reach with the reader and the owner each on a core of its own.",
    cpu,
    "### Time to first and second token (best of the repetitions)",
    "Colocated = the engine alone in a fresh process doing the prefill service's computation (same sequence capacity, 512-token micro-batches, first token sampled). The 2nd token of a disaggregated run is the first that needs the handed-over KV; the http column is a /v1/decode call with a ready handle (no prefill in it).",
    ttft,
    "",
  ].join("\n\n");
}

function chart(points: LengthPoint[], threads: number): string {
  const xs = points.map((p) => p.tokens);
  const gb = (bps: number) => bps / 1e9;
  const panels: Panel[] = [
    {
      title: "KV handoff prefill → decode",
      xLabel: "prompt tokens",
      yLabel: "GB/s",
      xLog2: true,
      xTicks: xs,
      series: [
        { name: "http: transport read", color: "#1f77b4", points: points.map((p) => [p.tokens, gb(p.transports.http.readBps.median)]), labels: true },
        { name: "http: full load (read+verify+import)", color: "#1f77b4", dash: "5,3", points: points.map((p) => [p.tokens, gb(p.transports.http.loadBps.median)]) },
        { name: "shm: transport read", color: "#d62728", points: points.map((p) => [p.tokens, gb(p.transports.shm.readBps.median)]), labels: true },
        { name: "shm: full load (read+verify+import)", color: "#d62728", dash: "5,3", points: points.map((p) => [p.tokens, gb(p.transports.shm.loadBps.median)]) },
      ],
      note: "goal: http >= 1 GB/s on loopback",
    },
    {
      title: "Time to first token, disaggregated / colocated",
      xLabel: "prompt tokens",
      yLabel: "ratio",
      xLog2: true,
      xTicks: xs,
      yMin: 0.9,
      yTickFormat: (y) => y.toFixed(2),
      series: [
        { name: "TTFT (first token streamed before the KV moves)", color: "#9467bd", points: points.map((p) => [p.tokens, p.ttft.ratio]), labels: true },
        { name: "goal 1.05", color: "#999999", dash: "6,4", points: points.map((p) => [p.tokens, 1.05]) },
      ],
      note: `colocated = the same prefill, engine alone in its own process; best of runs; ${threads} threads`,
    },
  ];
  return renderChart(panels, { title: "ctxbank prefill/decode handoff", subtitle: "prefill and decode in separate processes on one 2-core host, PostgreSQL 15 registry" });
}

main().catch((err: unknown) => {
  process.stderr.write(`[handoff] failed: ${(err as Error).stack ?? err}\n`);
  process.exit(1);
});
