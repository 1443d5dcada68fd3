// node --import tsx bench/handoff/shm-load.ts [lengths, default 4096,8192] [reps, default 15] [KV pool MiB, default 1024; 0 = off] [session disk dir]
//
// The whole shm load (KvLoader.load: lease → ready to decode) without a prefill: chunks of random
// KV of the default model's shape are written to a shard file and registered as a prefill does,
// then loaded over and over. Three cases, interleaved, medians printed:
//   service: the owner freed and rewrote the chunks' ranges (punched holes, wrote again), so the
//            reader meets pages it has never mapped, and the KV lands in a new sequence: what a
//            decode sees in service;
//   fresh:   new owner pages as in service, loaded into one sequence reused across loads;
//   again:   the same pages into the same sequence once more (bench:handoff's repetitions).
// To compare two trees, run it in each, alternating, and compare the medians.
// Then the sessions' disk tier beside it (services/sessions/session-disk.ts, what a parked
// session's next turn reads when it was spilled): the same KV saved once to a directory on disk
// (the 4th argument, default a new one under the OS temp dir; it must not be a tmpfs), loaded into
// a new sequence as a resumed turn does (every chunk read and checked), two cases interleaved:
//   disk cold: the file's pages dropped from the page cache first (dd iflag=nocache), so every
//              byte comes from the device;
//   disk warm: the file still in the page cache (a spill shortly before the next turn).
import { randomBytes, randomUUID } from "node:crypto";
import { execFileSync } from "node:child_process";
import { readdirSync } from "node:fs";
import { mkdtemp, rm } from "node:fs/promises";
import os from "node:os";
import path from "node:path";
import { loadConfig } from "../../shared/platform/config.ts";
import type { Handle } from "../../shared/platform/http/wire.ts";
import { renewPages } from "./fresh-pages.ts";
import { KvLoader } from "../../services/handoff/reader.ts";
import { createLogger, openRuntime } from "../../services/runtime.ts";
import { Shard, shardFileName } from "../../services/handoff/shard/shard.ts";
import { LAYOUT_VERSION, chunkByteLength, type ChunkMeta } from "../../services/handoff/format/chunk.ts";
import { encodeChunkFromLayers } from "../../services/handoff/format/chunk-pack.ts";
import { kvShape } from "../../services/handoff/format/seq-io.ts";
import { SessionDisk } from "../../services/sessions/session-disk.ts";
import { startPostgres } from "../../tools/lib/postgres.ts";

const lengths = (process.argv[2] ?? "4096,8192").split(",").map(Number);
const reps = Number(process.argv[3] ?? 15);
const kvPoolMib = Number(process.argv[4] ?? 1024);
const diskDir = process.argv[5] ?? (await mkdtemp(path.join(os.tmpdir(), "ctxbank-session-disk-")));
const BLOCK = 512;
const SHARD_BYTES = 2 * 2 ** 30;
const median = (xs: number[]) => [...xs].sort((a, b) => a - b)[xs.length >> 1]!;

const pg = await startPostgres("ctxbank_shm_load");
const shardDir = await mkdtemp("/dev/shm/ctxbank-shm-load-");
const config = loadConfig(
  "serve",
  {},
  {},
  { databaseUrl: pg.url, shardDir, threads: 1, logLevel: "warn", kvTimeoutMs: 600_000, kvPoolMib },
);
const rt = await openRuntime(config, createLogger(config));
const owner = "shm-load-owner";
await rt.registry.instances.register({ id: owner, role: "prefill", baseUrl: "http://127.0.0.1:9", hostId: config.hostId });
const beat = setInterval(() => void rt.registry.instances.heartbeat(owner).catch(() => {}), 1000);
const row = await rt.registry.shards.create({
  id: owner,
  instanceId: owner,
  sizeBytes: SHARD_BYTES,
  pathFor: (e) => `${shardDir}/${shardFileName(owner, e)}`,
});
const shard = await Shard.create({ dir: shardDir, shardId: owner, epoch: row.epoch, sizeBytes: SHARD_BYTES });
await rt.registry.shards.recordFile(owner, row.epoch, shard.fileId);
const shape = kvShape(rt.model.config);
const layerIds = Array.from({ length: shape.nLayer }, (_, i) => i);
const f16 = (n: number) => new Uint16Array(randomBytes(n * 2).buffer).map((x) => x & 0x3bff); // finite halves

/** A committed handle of n tokens, one chunk (every layer) per block; and its ranges in the shard. */
async function makeHandle(n: number): Promise<{ handle: Handle; ranges: { offset: number; length: number }[] }> {
  const requestId = `req-${randomUUID()}`;
  await rt.registry.requests.create({ id: requestId, sessionId: null, roundId: null, promptTokens: n });
  const ids: string[] = [];
  const ranges: { offset: number; length: number }[] = [];
  for (let t = 0; t < n; t += BLOCK) {
    const meta: ChunkMeta = {
      fingerprint: rt.model.fingerprint,
      dtype: "f16",
      layerIds,
      hkv: shape.hkv,
      headDim: shape.headDim,
      tokenStart: t,
      tokenCount: Math.min(BLOCK, n - t),
    };
    const elems = meta.tokenCount * shape.hkv * shape.headDim;
    const bytes = Buffer.alloc(chunkByteLength(meta));
    encodeChunkFromLayers(
      bytes,
      meta,
      layerIds.map(() => ({ k: f16(elems), v: f16(elems) })),
    );
    const offset = shard.alloc(bytes.length)!;
    const begun = await rt.registry.chunks.begin({
      key: randomBytes(32).toString("hex"),
      requestId,
      sessionId: null,
      roundId: null,
      layerGroup: 0,
      layerIds,
      tokenStart: t,
      tokenEnd: t + meta.tokenCount,
      shardId: owner,
      shardEpoch: row.epoch,
      offset,
      length: bytes.length,
      dtype: "f16",
      layoutVersion: LAYOUT_VERSION,
      modelFingerprint: rt.model.fingerprint,
      writeLeaseMs: 60_000,
    });
    await shard.write(offset, bytes);
    await rt.registry.chunks.commit(begun.chunk.id, { checksum: bytes.readUInt32LE(8), retainMs: 3_600_000 });
    ids.push(begun.chunk.id);
    ranges.push({ offset, length: bytes.length });
  }
  return { handle: { request_id: requestId, chunk_ids: ids, prompt_tokens: n } as Handle, ranges };
}

try {
  const loader = new KvLoader(rt);
  loader.override = loader.shm;
  for (const wanted of lengths) {
    const n = Math.min(wanted, rt.engine.maxContext - 2);
    const { handle, ranges } = await makeHandle(n);
    const seq = rt.engine.createSequence(n + 1);
    const ms = { service: [] as number[], fresh: [] as number[], again: [] as number[] };
    const kinds = ["service", "fresh", "again"] as const;
    let bytes = 0;
    for (let r = 0; r <= reps; r++) {
      for (let i = 0; i < kinds.length; i++) {
        const kind = kinds[(i + r) % kinds.length]!;
        if (kind !== "again") renewPages(shard.path, ranges);
        seq.truncate(0);
        const into = kind === "service" ? rt.engine.createSequence(n + 1) : seq;
        const stats = await loader.load(handle, into, new AbortController().signal).finally(() => {
          if (into !== seq) into.release();
        });
        bytes = stats.bytes;
        if (r > 0) ms[kind].push(stats.ms); // the first round warms up
      }
    }
    // The session disk tier: the KV just loaded, saved as a spilled session, read back.
    const disk = new SessionDisk(diskDir, 64 * 2 ** 30, shape, rt.model.fingerprint, BLOCK);
    const tokens = Int32Array.from({ length: n }, (_, i) => i % 1000);
    await disk.save(
      { tenant: "bench", id: `s${n}`, tokens, roundStarts: [0], roundHashes: [], turns: 1, createdAt: 0, lastUsedAt: 0 },
      seq,
    );
    seq.release();
    const file = readdirSync(diskDir).find((f) => f.endsWith(".kv"))!;
    const diskMs = { "disk cold": [] as number[], "disk warm": [] as number[] };
    for (let r = 0; r <= reps; r++) {
      for (const kind of r % 2 ? (["disk warm", "disk cold"] as const) : (["disk cold", "disk warm"] as const)) {
        if (kind === "disk cold") execFileSync("dd", [`if=${path.join(diskDir, file)}`, "iflag=nocache", "count=0", "status=none"]);
        const into = rt.engine.createSequence(n + 1);
        const t0 = performance.now();
        await disk.load("bench", `s${n}`, into, n).finally(() => into.release());
        if (r > 0) diskMs[kind].push(performance.now() - t0);
      }
    }
    await disk.remove("bench", `s${n}`);
    const gbps = (m: number) => (bytes / 1e9 / (m / 1000)).toFixed(2);
    console.log(`${n} tokens (${(bytes / 2 ** 20).toFixed(1)} MiB, ${handle.chunk_ids.length} chunks), whole load, median of ${reps}:`);
    for (const [kind, v] of Object.entries({ ...ms, ...diskMs }))
      console.log(`  ${kind}: ${median(v).toFixed(1)} ms = ${gbps(median(v))} GB/s  [${v.map((x) => x.toFixed(0)).join(" ")}]`);
  }
  await loader.close();
} finally {
  clearInterval(beat);
  await shard.destroy().catch(() => {});
  await rt.close();
  await pg.stop();
  await rm(shardDir, { recursive: true, force: true });
  if (process.argv[5] === undefined) await rm(diskDir, { recursive: true, force: true });
}
