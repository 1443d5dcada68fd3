import { readFileSync } from "node:fs";
import { mkdtemp, rm } from "node:fs/promises";
import os from "node:os";
import path from "node:path";
import { createHash } from "node:crypto";
import { sql, type SQL } from "drizzle-orm";
import { afterAll, beforeAll, beforeEach, describe, expect, it } from "vitest";
import { openDatabase, type OpenedDatabase } from "../../shared/platform/registry/db.ts";
import { Registry, RegistryError, type BeginChunkInput } from "../../shared/platform/registry/registry.ts";
import { startPostgres } from "../../tools/lib/postgres.ts";
import { messageHashes } from "../../services/sessions/message-hashes.ts";

/** The migrations drizzle applies: the journal's entries (0000_init … the newest). */
const MIGRATIONS = (
  JSON.parse(readFileSync(new URL("../../migrations/meta/_journal.json", import.meta.url), "utf8")) as { entries: unknown[] }
).entries.length;

interface Backend {
  /** URL for the suite, and a URL that may be opened twice in a row (persistent). */
  url: string;
  reopenUrl: string;
  stop(): Promise<void>;
}

const backends: { name: string; start(): Promise<Backend> }[] = [
  {
    name: "PGlite (memory)",
    async start() {
      const dir = await mkdtemp(path.join(os.tmpdir(), "ctxbank-pglite-"));
      return { url: "pglite://memory", reopenUrl: `pglite://${dir}`, stop: () => rm(dir, { recursive: true, force: true }) };
    },
  },
  {
    name: "PostgreSQL 15",
    async start() {
      const server = await startPostgres();
      return { url: server.url, reopenUrl: server.url, stop: server.stop };
    },
  },
];

const T0 = new Date("2030-01-01T00:00:00.000Z").getTime();
const FINGERPRINT = "ab".repeat(32);
const key = (label: string) => createHash("sha256").update(label).digest("hex");

class FakeClock {
  constructor(public ms = T0) {}
  readonly now = () => new Date(this.ms);
  advance(ms: number) {
    this.ms += ms;
  }
}

/** Raw query rows; both drivers return `{ rows }`, which drizzle's shared type leaves unknown. */
async function rowsOf<T>(opened: OpenedDatabase, query: SQL): Promise<T[]> {
  return ((await opened.db.execute(query)) as { rows: T[] }).rows;
}

async function expectRegistryError(promise: Promise<unknown>, code: string, message?: RegExp) {
  const err = await promise.then(
    () => undefined,
    (e: unknown) => e,
  );
  expect(err, `expected RegistryError ${code}`).toBeInstanceOf(RegistryError);
  expect((err as RegistryError).code).toBe(code);
  if (message) expect((err as RegistryError).message).toMatch(message);
  return err as RegistryError;
}

describe.each(backends)("registry on $name", (backend) => {
  let env: Backend;
  let opened: OpenedDatabase;
  let clock: FakeClock;
  let reg: Registry;

  beforeAll(async () => {
    env = await backend.start();
    opened = await openDatabase(env.url);
  });
  afterAll(async () => {
    await opened?.close();
    await env?.stop();
  });
  beforeEach(async () => {
    await opened.db.execute(sql`truncate chunk_refs, chunks, shards, instances, requests`);
    clock = new FakeClock();
    reg = new Registry(opened.db, { clock: clock.now });
  });

  async function newShard(id = "prefill-a", sizeBytes = 1 << 30) {
    await reg.instances.register({ id: "p1", role: "prefill", baseUrl: "http://127.0.0.1:7001", hostId: "host-1" });
    return reg.shards.create({ id, instanceId: "p1", sizeBytes, pathFor: (e) => `/dev/shm/ctxbank/${id}.e${e}.shard` });
  }

  function chunkInput(over: Partial<BeginChunkInput> = {}): BeginChunkInput {
    return {
      key: key("k0"),
      requestId: "req-a",
      layerGroup: 1,
      layerIds: [3, 4, 5],
      tokenStart: 0,
      tokenEnd: 256,
      shardId: "prefill-a",
      shardEpoch: 1,
      offset: 0,
      length: 4096,
      dtype: "f16",
      layoutVersion: 1,
      modelFingerprint: FINGERPRINT,
      writeLeaseMs: 30_000,
      ...over,
    };
  }

  /** Writes and commits a chunk; returns its id. */
  async function readyChunk(over: Partial<BeginChunkInput> = {}, retainMs = 60_000) {
    const begun = await reg.chunks.begin(chunkInput(over));
    expect(begun.status).toBe("write");
    await reg.chunks.commit(begun.chunk.id, { checksum: 0xdeadbeef, retainMs });
    return begun.chunk.id;
  }

  it("applies migrations once: opening the same database again is a no-op", async () => {
    const first = await openDatabase(env.reopenUrl);
    await first.close();
    const second = await openDatabase(env.reopenUrl);
    try {
      const applied = await rowsOf<{ n: number }>(second, sql`select count(*)::int as n from drizzle.__drizzle_migrations`);
      expect(applied).toEqual([{ n: MIGRATIONS }]); // each migration in migrations/meta/_journal.json, once
      const tables = await rowsOf<{ table_name: string }>(
        second,
        sql`select table_name from information_schema.tables where table_schema = 'public' order by table_name`,
      );
      expect(tables.map((r) => r.table_name)).toEqual(["chunk_refs", "chunks", "instances", "requests", "responses", "sessions", "shards"]);
    } finally {
      await second.close();
    }
  });

  it("rejects unsupported database URLs", async () => {
    await expect(openDatabase("mysql://x")).rejects.toThrow(/unsupported database URL/);
    await expect(openDatabase("pglite://relative/dir")).rejects.toThrow(/absolute/);
  });

  describe("instances", () => {
    it("tracks heartbeats, draining and dead instances", async () => {
      await reg.instances.register({ id: "p1", role: "prefill", baseUrl: "http://h1:7001/", hostId: "h1" });
      await reg.instances.register({ id: "p2", role: "prefill", baseUrl: "http://h2:7001", hostId: "h2" });
      await reg.instances.register({ id: "d1", role: "decode", baseUrl: "http://h1:7002", hostId: "h1" });
      expect((await reg.instances.get("p1"))?.baseUrl).toBe("http://h1:7001");

      clock.advance(4_000);
      await reg.instances.heartbeat("p1");
      clock.advance(2_000); // p2 silent for 6 s, p1 for 2 s
      expect((await reg.instances.findAlive("prefill", 5_000)).map((i) => i.id)).toEqual(["p1"]);
      expect((await reg.instances.findAlive("decode", 10_000)).map((i) => i.id)).toEqual(["d1"]);

      await reg.instances.markDraining("p1");
      expect(await reg.instances.findAlive("prefill", 5_000)).toEqual([]);

      expect((await reg.instances.markDead(5_000)).sort()).toEqual(["d1", "p2"]);
      expect(await reg.instances.markDead(5_000)).toEqual([]);
      await expectRegistryError(reg.instances.heartbeat("p2"), "instance_dead");
      await expectRegistryError(reg.instances.heartbeat("nope"), "not_found");

      const again = await reg.instances.register({ id: "p2", role: "prefill", baseUrl: "http://h2:7001", hostId: "h2" });
      expect(again.state).toBe("alive");
      expect(again.startedAt.getTime()).toBe(clock.ms);
      expect((await reg.instances.findAlive("prefill", 5_000)).map((i) => i.id)).toEqual(["p2"]);
    });

    it("validates instance input", async () => {
      await expectRegistryError(reg.instances.register({ role: "prefill", baseUrl: "ftp://x", hostId: "h" }), "invalid_input", /baseUrl/);
      await expectRegistryError(
        reg.instances.register({ role: "cook" as "prefill", baseUrl: "http://x", hostId: "h" }),
        "invalid_input",
        /role/,
      );
      await expectRegistryError(reg.instances.findAlive("decode", 0), "invalid_input");
      const generated = await reg.instances.register({ role: "decode", baseUrl: "http://x:1", hostId: "h" });
      expect(generated.id).toMatch(/^[0-9a-f-]{36}$/);
    });

    it("a dead owner's shards are retired and their chunks refused", async () => {
      await newShard();
      const id = await readyChunk();
      clock.advance(10_000);
      expect(await reg.instances.markDead(5_000)).toEqual(["p1"]);
      expect((await reg.shards.get("prefill-a", 1))?.state).toBe("retired");
      expect((await reg.chunks.get(id))?.state).toBe("failed");
      await expectRegistryError(reg.chunks.acquireRead([id], 1_000), "chunk_unavailable", /failed/);
      await expectRegistryError(
        reg.shards.create({ id: "prefill-a", instanceId: "p1", sizeBytes: 1, pathFor: () => "/x" }),
        "instance_dead",
      );
    });

    it("leave marks the instance dead at once, draining or not, and it can register again", async () => {
      await reg.instances.register({ id: "p1", role: "prefill", baseUrl: "http://h1:7001", hostId: "h1" });
      await reg.instances.register({ id: "d1", role: "decode", baseUrl: "http://h1:7002", hostId: "h1" });
      await reg.instances.markDraining("d1");
      await reg.instances.leave("p1");
      await reg.instances.leave("d1");
      await reg.instances.leave("ghost"); // nothing to leave: no error, nothing created
      expect((await reg.instances.get("p1"))?.state).toBe("dead");
      expect((await reg.instances.get("d1"))?.state).toBe("dead");
      expect(await reg.instances.get("ghost")).toBeUndefined();
      expect(await reg.instances.findAlive("prefill", 60_000)).toEqual([]);
      await expectRegistryError(reg.instances.heartbeat("p1"), "instance_dead");
      await expectRegistryError(reg.instances.leave("bad id"), "invalid_input");
      expect((await reg.instances.register({ id: "p1", role: "prefill", baseUrl: "http://h1:7001", hostId: "h1" })).state).toBe("alive");
    });
  });

  describe("shards", () => {
    it("each create starts the next epoch, retiring the old one and dropping its chunks", async () => {
      const first = await newShard();
      expect(first).toMatchObject({ epoch: 1, state: "active", path: "/dev/shm/ctxbank/prefill-a.e1.shard" });
      const oldChunk = await readyChunk();
      const second = await reg.shards.create({
        id: "prefill-a",
        instanceId: "p1",
        sizeBytes: 1 << 30,
        pathFor: (e) => `/dev/shm/ctxbank/prefill-a.e${e}.shard`,
      });
      expect(second).toMatchObject({ epoch: 2, state: "active", path: "/dev/shm/ctxbank/prefill-a.e2.shard" });
      expect((await reg.shards.get("prefill-a", 1))?.state).toBe("retired");
      expect((await reg.shards.active("prefill-a"))?.epoch).toBe(2);
      expect(await reg.chunks.get(oldChunk)).toBeUndefined();
      await expectRegistryError(reg.chunks.begin(chunkInput({ shardEpoch: 1 })), "stale_epoch");
      expect((await reg.chunks.begin(chunkInput({ shardEpoch: 2 }))).status).toBe("write");
    });

    it("retire ends one epoch: its live chunks fail and the reaper hands their ranges back", async () => {
      await newShard();
      await reg.shards.create({ id: "prefill-b", instanceId: "p1", sizeBytes: 1 << 20, pathFor: (e) => `/s/b.e${e}` });
      const ready = await readyChunk({ key: key("ready"), offset: 0 });
      const reading = await readyChunk({ key: key("reading"), offset: 4096 });
      await reg.chunks.acquireRead([reading], 30_000);
      const writing = (await reg.chunks.begin(chunkInput({ key: key("writing"), offset: 8192 }))).chunk.id;
      const other = await readyChunk({ key: key("other"), shardId: "prefill-b" });

      await reg.shards.retire("prefill-a", 1);
      expect((await reg.shards.get("prefill-a", 1))?.state).toBe("retired");
      expect(await reg.shards.active("prefill-a")).toBeUndefined();
      for (const id of [ready, reading, writing]) expect(await reg.chunks.get(id)).toMatchObject({ state: "failed", readerCount: 0 });
      await expectRegistryError(reg.chunks.acquireRead([ready], 1_000), "chunk_unavailable", /failed/);
      expect((await reg.chunks.get(other))?.state).toBe("ready"); // another shard is untouched
      expect((await reg.shards.get("prefill-b", 1))?.state).toBe("active");
      const { freed } = await reg.chunks.reapExpired({ shardId: "prefill-a", epoch: 1 });
      expect(freed.map((f) => f.offset).sort((a, b) => a - b)).toEqual([0, 4096, 8192]);

      await expectRegistryError(reg.shards.retire("prefill-a", 0), "invalid_input");
      await expectRegistryError(reg.shards.retire("../x", 1), "invalid_input");
    });

    it("records the owner's UCX endpoint for its active epoch only, and leased locations carry it", async () => {
      await newShard();
      const endpoint = Buffer.from("a UCX endpoint envelope").toString("base64");
      expect((await reg.shards.recordUcxEndpoint("prefill-a", 1, endpoint)).ucxEndpoint).toBe(endpoint);
      const id = await readyChunk();
      const [leased] = await reg.chunks.acquireRead([id], 10_000);
      expect(leased!.location.ucxEndpoint).toBe(endpoint);
      await reg.shards.create({
        id: "prefill-a",
        instanceId: "p1",
        sizeBytes: 1 << 30,
        pathFor: (e) => `/dev/shm/ctxbank/prefill-a.e${e}.shard`,
      });
      await expectRegistryError(reg.shards.recordUcxEndpoint("prefill-a", 1, endpoint), "stale_epoch");
      expect((await reg.shards.active("prefill-a"))!.ucxEndpoint).toBeNull(); // a new epoch publishes its own
      for (const bad of ["", "not base64!", "A".repeat(70_000)]) {
        await expectRegistryError(reg.shards.recordUcxEndpoint("prefill-a", 2, bad), "invalid_input");
      }
    });

    it("validates shard input", async () => {
      await newShard();
      await expectRegistryError(
        reg.shards.create({ id: "s", instanceId: "p1", sizeBytes: 10, pathFor: () => "relative/path" }),
        "invalid_input",
        /absolute/,
      );
      await expectRegistryError(reg.shards.create({ id: "s", instanceId: "ghost", sizeBytes: 10, pathFor: () => "/x" }), "not_found");
      await expectRegistryError(reg.shards.create({ id: "bad/id", instanceId: "p1", sizeBytes: 10, pathFor: () => "/x" }), "invalid_input");
      await expectRegistryError(reg.shards.create({ id: "s", instanceId: "p1", sizeBytes: 0, pathFor: () => "/x" }), "invalid_input");
    });
  });

  describe("two-phase chunk writes", () => {
    beforeEach(async () => {
      await newShard();
    });

    it("writing → ready; only ready chunks can be read", async () => {
      const begun = await reg.chunks.begin(chunkInput());
      expect(begun.status).toBe("write");
      expect(begun.chunk).toMatchObject({ state: "writing", refCount: 1, readerCount: 0, layerIds: [3, 4, 5] });
      await expectRegistryError(reg.chunks.acquireRead([begun.chunk.id], 1_000), "chunk_unavailable", /writing/);

      const ready = await reg.chunks.commit(begun.chunk.id, { checksum: 0xffffffff, retainMs: 60_000 });
      expect(ready).toMatchObject({ state: "ready", checksum: 0xffffffff });
      expect(ready.leaseExpiresAt.getTime()).toBe(T0 + 60_000);
      await expectRegistryError(reg.chunks.commit(begun.chunk.id, { checksum: 1, retainMs: 1 }), "wrong_state", /ready/);
      await expectRegistryError(reg.chunks.fail(begun.chunk.id), "wrong_state");
      expect((await reg.chunks.ofRequest("req-a")).map((c) => c.id)).toEqual([begun.chunk.id]);
    });

    it("a failed write is refused to readers and its range comes back from the reaper once", async () => {
      const begun = await reg.chunks.begin(chunkInput({ offset: 8192, length: 4096 }));
      expect((await reg.chunks.fail(begun.chunk.id)).state).toBe("failed");
      await expectRegistryError(reg.chunks.commit(begun.chunk.id, { checksum: 1, retainMs: 1 }), "wrong_state", /failed/);
      const shard = { shardId: "prefill-a", epoch: 1 };
      const reaped = await reg.chunks.reapExpired(shard);
      expect(reaped.freed).toEqual([{ id: begun.chunk.id, key: key("k0"), offset: 8192, length: 4096, state: "failed" }]);
      expect((await reg.chunks.reapExpired(shard)).freed).toEqual([]);
      await expectRegistryError(reg.chunks.commit(begun.chunk.id, { checksum: 1, retainMs: 1 }), "not_found");
    });

    it("the deterministic key dedups: concurrent writer waits, later requests reuse and hold it", async () => {
      const a = await reg.chunks.begin(chunkInput({ requestId: "req-a" }));
      const waiting = await reg.chunks.begin(chunkInput({ requestId: "req-b", offset: 4096 }));
      expect(waiting).toMatchObject({ status: "in_progress", chunk: { id: a.chunk.id } });
      await reg.chunks.commit(a.chunk.id, { checksum: 7, retainMs: 60_000 });

      const reuse = await reg.chunks.begin(chunkInput({ requestId: "req-b", offset: 4096 }));
      expect(reuse).toMatchObject({ status: "reuse", chunk: { id: a.chunk.id, refCount: 2, offset: 0 } });
      const again = await reg.chunks.begin(chunkInput({ requestId: "req-b", offset: 4096 }));
      expect(again).toMatchObject({ status: "reuse", chunk: { refCount: 2 } });

      await expectRegistryError(reg.chunks.begin(chunkInput({ requestId: "req-c", tokenEnd: 128 })), "key_mismatch");

      // The chunk outlives the request that wrote it while another request holds it.
      expect(await reg.chunks.releaseRequest("req-a")).toEqual({ dropped: 1, released: 0 });
      expect((await reg.chunks.get(a.chunk.id))?.state).toBe("ready");
      expect(await reg.chunks.releaseRequest("req-b")).toEqual({ dropped: 1, released: 1 });
      expect(await reg.chunks.releaseRequest("req-b")).toEqual({ dropped: 0, released: 0 });
      expect((await reg.chunks.get(a.chunk.id))?.state).toBe("released");

      // A released row keeps its key until reclaimed, without blocking a fresh write of it.
      const rewrite = await reg.chunks.begin(chunkInput({ requestId: "req-d", offset: 8192 }));
      expect(rewrite.status).toBe("write");
      expect(rewrite.chunk.id).not.toBe(a.chunk.id);
      const { freed } = await reg.chunks.reapExpired({ shardId: "prefill-a", epoch: 1 });
      expect(freed.map((f) => [f.id, f.offset])).toEqual([[a.chunk.id, 0]]);
    });

    it("reuse holds the chunk for at least the write lease; an expired chunk is rewritten, not reused", async () => {
      const id = await readyChunk({}, 10_000); // retained until T0 + 10 s
      clock.advance(5_000);
      const reuse = await reg.chunks.begin(chunkInput({ requestId: "req-b", writeLeaseMs: 30_000 }));
      expect(reuse.chunk.leaseExpiresAt.getTime()).toBe(T0 + 35_000);

      clock.advance(31_000);
      const rewrite = await reg.chunks.begin(chunkInput({ requestId: "req-c", offset: 4096 }));
      expect(rewrite.status).toBe("write");
      expect(rewrite.chunk.id).not.toBe(id);
      expect((await reg.chunks.get(id))?.state).toBe("released");
      const { freed } = await reg.chunks.reapExpired({ shardId: "prefill-a", epoch: 1 });
      expect(freed.map((f) => f.id)).toEqual([id]);
    });

    it("validates chunk input", async () => {
      const bad: [Partial<BeginChunkInput>, RegExp][] = [
        [{ key: "xyz" }, /key/],
        [{ modelFingerprint: "AB".repeat(32) }, /modelFingerprint/],
        [{ tokenStart: 10, tokenEnd: 10 }, /tokenEnd/],
        [{ layerIds: [4, 3] }, /strictly increasing/],
        [{ layerIds: [] }, /layerIds/],
        [{ length: 0 }, /length/],
        [{ offset: -1 }, /offset/],
        [{ dtype: "bf16" as "f16" }, /dtype/],
        [{ requestId: "" }, /requestId/],
        [{ writeLeaseMs: 0 }, /writeLeaseMs/],
      ];
      for (const [over, message] of bad) {
        await expectRegistryError(reg.chunks.begin(chunkInput(over)), "invalid_input", message);
      }
      await expectRegistryError(reg.chunks.begin(chunkInput({ offset: 1 << 30 })), "invalid_input", /exceeds shard/);
      await expectRegistryError(reg.chunks.begin(chunkInput({ shardId: "other" })), "not_found");
      await expectRegistryError(reg.chunks.acquireRead(["not-a-uuid"], 1_000), "invalid_input");
      const id = await readyChunk();
      await expectRegistryError(reg.chunks.acquireRead([id, id], 1_000), "invalid_input", /distinct/);
      await expectRegistryError(reg.chunks.commit(id, { checksum: 2 ** 32, retainMs: 1 }), "invalid_input");
    });
  });

  describe("read leases", () => {
    const shard = { shardId: "prefill-a", epoch: 1 };
    beforeEach(async () => {
      await newShard();
    });

    it("acquire, extend and release; several readers count", async () => {
      const id = await readyChunk({}, 10_000);
      const [leased] = await reg.chunks.acquireRead([id], 30_000);
      expect(leased!.chunk).toMatchObject({ state: "reading", readerCount: 1 });
      expect(leased!.chunk.leaseExpiresAt.getTime()).toBe(T0 + 30_000);
      expect(leased!.location).toEqual({
        shardId: "prefill-a",
        epoch: 1,
        shardPath: "/dev/shm/ctxbank/prefill-a.e1.shard",
        ownerBaseUrl: "http://127.0.0.1:7001",
        ownerHostId: "host-1",
        fileId: null, // the owner records its file's device:inode after creating it (see security-cleanup.test.ts)
        ucxEndpoint: null, // published by an owner that serves UCX (services/handoff/transport/ucx.ts)
        offset: 0,
        length: 4096,
      });
      // A shorter second lease never shortens the first.
      const [second] = await reg.chunks.acquireRead([id], 1_000);
      expect(second!.chunk).toMatchObject({ readerCount: 2 });
      expect(second!.chunk.leaseExpiresAt.getTime()).toBe(T0 + 30_000);

      clock.advance(20_000);
      const [extended] = await reg.chunks.extendLease([id], 60_000);
      expect(extended!.leaseExpiresAt.getTime()).toBe(T0 + 80_000);

      expect(await reg.chunks.releaseRead([id])).toEqual({ released: [id], notReading: [] });
      expect((await reg.chunks.get(id))?.state).toBe("reading");
      await reg.chunks.releaseRead([id]);
      expect(await reg.chunks.get(id)).toMatchObject({ state: "ready", readerCount: 0 });
      expect(await reg.chunks.releaseRead([id])).toEqual({ released: [], notReading: [id] });
      await expectRegistryError(reg.chunks.extendLease([id], 1_000), "chunk_unavailable", /not leased/);
    });

    it("expired leases are refused and reaped; a reaped chunk is gone", async () => {
      const kept = await readyChunk({ key: key("kept"), offset: 0 }, 120_000);
      const expiring = await readyChunk({ key: key("expiring"), offset: 4096 }, 10_000);
      const reading = await readyChunk({ key: key("reading"), offset: 8192 }, 10_000);
      await reg.chunks.acquireRead([reading], 20_000);

      clock.advance(15_000);
      await expectRegistryError(reg.chunks.acquireRead([expiring], 1_000), "chunk_unavailable", /lease expired/);
      expect((await reg.chunks.reapExpired(shard)).freed.map((f) => f.id)).toEqual([expiring]);

      clock.advance(10_000); // the reader stopped extending: its lease lapses too
      await expectRegistryError(reg.chunks.extendLease([reading], 1_000), "chunk_unavailable", /lease expired/);
      const reaped = await reg.chunks.reapExpired(shard);
      expect(reaped).toEqual({ expired: 1, freed: [expect.objectContaining({ id: reading, offset: 8192, state: "released" })] });
      expect(await reg.chunks.releaseRead([reading])).toEqual({ released: [], notReading: [reading] });
      await expectRegistryError(reg.chunks.acquireRead([expiring], 1_000), "chunk_unavailable", /not found/);
      expect((await reg.chunks.get(kept))?.state).toBe("ready");
    });

    it("is all-or-nothing: one bad chunk leaves the others unleased", async () => {
      const good = await readyChunk({ key: key("good") });
      const gone = await readyChunk({ key: key("gone"), requestId: "req-gone", offset: 4096 });
      await reg.chunks.releaseRequest("req-gone");
      const err = await expectRegistryError(reg.chunks.acquireRead([good, gone], 1_000), "chunk_unavailable", /released/);
      expect(err.details).toEqual([{ id: gone, reason: "chunk is released" }]);
      expect(await reg.chunks.get(good)).toMatchObject({ state: "ready", readerCount: 0 });
    });

    it("released handles are refused; a chunk being read is freed when its last reader lets go", async () => {
      const id = await readyChunk();
      await reg.chunks.acquireRead([id], 30_000);
      expect(await reg.chunks.releaseRequest("req-a")).toEqual({ dropped: 1, released: 0 });
      expect((await reg.chunks.reapExpired(shard)).freed).toEqual([]); // still being read
      await reg.chunks.releaseRead([id]);
      expect((await reg.chunks.get(id))?.state).toBe("released");
      await expectRegistryError(reg.chunks.acquireRead([id], 1_000), "chunk_unavailable", /released/);
      expect((await reg.chunks.reapExpired(shard)).freed.map((f) => f.id)).toEqual([id]);
    });

    it("counts the chunks of one shard epoch being read", async () => {
      await reg.shards.create({ id: "prefill-b", instanceId: "p1", sizeBytes: 1 << 20, pathFor: (e) => `/s/b.e${e}` });
      const a = await readyChunk({ key: key("a") });
      const b = await readyChunk({ key: key("b"), offset: 4096 });
      await readyChunk({ key: key("c"), offset: 8192 }); // ready, not read
      const other = await readyChunk({ key: key("other"), shardId: "prefill-b" });
      expect(await reg.chunks.countReading(shard)).toBe(0);
      await reg.chunks.acquireRead([a, b], 30_000);
      await reg.chunks.acquireRead([a], 30_000); // a second reader of a is still one chunk
      await reg.chunks.acquireRead([other], 30_000);
      expect(await reg.chunks.countReading(shard)).toBe(2);
      expect(await reg.chunks.countReading({ shardId: "prefill-b", epoch: 1 })).toBe(1);
      expect(await reg.chunks.countReading({ shardId: "prefill-a", epoch: 2 })).toBe(0);
      await reg.chunks.releaseRead([b]);
      expect(await reg.chunks.countReading(shard)).toBe(1);
      await expectRegistryError(reg.chunks.countReading({ shardId: "prefill-a", epoch: 0 }), "invalid_input");
    });

    it("reaps only the given shard epoch", async () => {
      await reg.shards.create({ id: "prefill-b", instanceId: "p1", sizeBytes: 1 << 20, pathFor: (e) => `/s/b.e${e}` });
      const a = await readyChunk({ key: key("a") }, 1_000);
      const b = await readyChunk({ key: key("b"), shardId: "prefill-b" }, 1_000);
      clock.advance(2_000);
      expect((await reg.chunks.reapExpired({ shardId: "prefill-b", epoch: 1 })).freed.map((f) => f.id)).toEqual([b]);
      expect((await reg.chunks.get(a))?.state).toBe("ready");
    });

    it("concurrent acquire vs reap: every chunk is either leased or reclaimed, never both", async () => {
      const n = 40;
      const ids: string[] = [];
      for (let i = 0; i < n; i++) ids.push(await readyChunk({ key: key(`race-${i}`), offset: i * 4096 }, 10_000));
      // Two "processes": a reader that still sees the lease valid and a reaper past its expiry.
      const reader = new Registry(opened.db, { clock: () => new Date(T0 + 9_999) });
      const reaper = new Registry(opened.db, { clock: () => new Date(T0 + 10_001) });

      // Interleave the reaps with the acquires so that they really contend for the same rows.
      const acquires: Promise<string | null>[] = [];
      const reaps: Promise<{ freed: { id: string }[] }>[] = [];
      ids.forEach((id, i) => {
        acquires.push(
          reader.chunks.acquireRead([id], 60_000).then(
            () => id,
            (e: RegistryError) => {
              expect(e.code).toBe("chunk_unavailable");
              return null;
            },
          ),
        );
        if (i % 5 === 2) reaps.push(reaper.chunks.reapExpired(shard));
      });
      const leased = new Set((await Promise.all(acquires)).filter((id): id is string => id !== null));
      const reaped = (await Promise.all(reaps)).flatMap((r) => r.freed.map((f) => f.id));
      reaped.push(...(await reaper.chunks.reapExpired(shard)).freed.map((f) => f.id));

      expect(new Set(reaped).size).toBe(reaped.length); // no range handed back twice
      for (const id of ids) expect(leased.has(id) !== reaped.includes(id), `chunk ${id}`).toBe(true);
      for (const id of leased) expect(await reg.chunks.get(id)).toMatchObject({ state: "reading", readerCount: 1 });
      for (const id of reaped) expect(await reg.chunks.get(id)).toBeUndefined();
    });
  });

  describe("requests", () => {
    it("records milestones and the outcome", async () => {
      await reg.requests.create({ id: "r1", sessionId: "s1", roundId: 0, promptTokens: 1000 });
      await expectRegistryError(reg.requests.create({ id: "r1" }), "conflict");
      clock.advance(5);
      await reg.requests.mark("r1", { event: "prefill_start" });
      clock.advance(100);
      expect(await reg.requests.mark("r1", { event: "prefill_end" })).toMatchObject({ state: "decoding" });
      clock.advance(10);
      await reg.requests.mark("r1", { event: "first_token", outputTokens: 1 });
      clock.advance(50);
      await reg.requests.mark("r1", { event: "last_token", outputTokens: 6 });
      const done = await reg.requests.finish("r1", { state: "done" });
      expect(done).toMatchObject({ state: "done", outputTokens: 6, promptTokens: 1000, error: null });
      expect(done.firstTokenAt!.getTime() - done.arrivalAt.getTime()).toBe(115);
      expect(done.lastTokenAt!.getTime() - done.firstTokenAt!.getTime()).toBe(50);
      await expectRegistryError(reg.requests.finish("r1", { state: "cancelled" }), "wrong_state", /already done/);
      await expectRegistryError(reg.requests.mark("nope", { event: "first_token" }), "not_found");
      await expectRegistryError(reg.requests.mark("r1", { event: "bogus" as "first_token" }), "invalid_input");
    });

    it("a request is claimed for decoding once, and only while open", async () => {
      await reg.requests.create({ id: "r1", promptTokens: 10 });
      await reg.requests.mark("r1", { event: "prefill_start" });
      await reg.requests.mark("r1", { event: "prefill_end" });
      clock.advance(20);
      expect(await reg.requests.claimDecode("r1", "d1")).toBe(true);
      expect(await reg.requests.get("r1")).toMatchObject({ state: "decoding", decodeInstanceId: "d1", firstTokenAt: new Date(T0 + 20) });
      expect(await reg.requests.claimDecode("r1", "d2")).toBe(false); // a handle is decoded once
      expect((await reg.requests.get("r1"))?.decodeInstanceId).toBe("d1");
      expect(await reg.requests.claimDecode("nope", "d1")).toBe(false);

      await reg.requests.create({ id: "r2" });
      await reg.requests.finish("r2", { state: "failed", error: "abandoned" });
      expect(await reg.requests.claimDecode("r2", "d1")).toBe(false);
      expect(await reg.requests.get("r2")).toMatchObject({ state: "failed", decodeInstanceId: null, firstTokenAt: null });
      await expectRegistryError(reg.requests.claimDecode("r1", "bad id"), "invalid_input");
    });

    it("records the decoder of a request it started itself, while the request is open", async () => {
      await reg.requests.create({ id: "r1" });
      await reg.requests.mark("r1", { event: "prefill_start" });
      clock.advance(7);
      expect(await reg.requests.recordDecoder("r1", "d1")).toBe(true);
      // The state is the prefill's to move; only the decoder and its first token are recorded.
      expect(await reg.requests.get("r1")).toMatchObject({ state: "prefilling", decodeInstanceId: "d1", firstTokenAt: new Date(T0 + 7) });
      await reg.requests.finish("r1", { state: "done" });
      expect(await reg.requests.recordDecoder("r1", "d2")).toBe(false);
      expect((await reg.requests.get("r1"))?.decodeInstanceId).toBe("d1");
      expect(await reg.requests.recordDecoder("nope", "d1")).toBe(false);
    });

    it("sessions: upsert moves a session, the longest prefix of message hashes finds its holder, expiry and dead holders sweep", async () => {
      const h = (n: number) => String(n).padStart(64, "0");
      const turn = (n: number) => [
        { role: "user", content: `q${n}` },
        { role: "assistant", content: `a${n}` },
      ];
      const chat = (n: number) => messageHashes(Array.from({ length: n }, (_, i) => turn(i)).flat());
      const base = {
        tenant: "alice",
        tier: "memory" as const,
        tokens: 100,
        bytes: 1000,
        turns: 1,
        createdAt: clock.now(),
        lastUsedAt: clock.now(),
        expiresAt: new Date(clock.ms + 60_000),
        roundHashes: [h(1)],
      };
      await reg.sessions.upsert({ ...base, id: "alice:s1", holderInstanceId: "d1", messageHashes: chat(3) });
      await reg.sessions.upsert({ ...base, id: "alice:s2", holderInstanceId: "d2", messageHashes: chat(2) });
      await reg.sessions.upsert({ ...base, id: "bob:s3", tenant: "bob", holderInstanceId: "d3", messageHashes: chat(4) });
      // The next turn of s1's conversation: its 6 messages, then a new question.
      const next = messageHashes([...Array.from({ length: 3 }, (_, i) => turn(i)).flat(), { role: "user", content: "q3" }]);
      expect(await reg.sessions.longestPrefix("alice", next)).toMatchObject({
        session: { id: "alice:s1", holderInstanceId: "d1" },
        messages: 6,
      });
      // A conversation that left s1's after its first answer shares 2 messages with both; the newer wins the tie.
      const forked = messageHashes([...turn(0), { role: "user", content: "something else" }]);
      expect(await reg.sessions.longestPrefix("alice", forked)).toMatchObject({ messages: 2 });
      // ... but it continues neither: only a request repeating a session's whole conversation does.
      expect(await reg.sessions.longestPrefix("alice", forked, { continued: true })).toBeUndefined();
      expect(await reg.sessions.longestPrefix("alice", next, { continued: true })).toMatchObject({
        session: { id: "alice:s1" },
        messages: 6,
      });
      // A client that trimmed the last answer (a stop string it cut) still continues it.
      const trimmed = messageHashes([
        ...Array.from({ length: 2 }, (_, i) => turn(i)).flat(),
        { role: "user", content: "q2" },
        { role: "assistant", content: "a2, trimmed" },
        { role: "user", content: "q3" },
      ]);
      expect(await reg.sessions.longestPrefix("alice", trimmed, { continued: true })).toMatchObject({
        session: { id: "alice:s1" },
        messages: 5,
      });
      expect(await reg.sessions.longestPrefix("alice", messageHashes([{ role: "user", content: "new" }]))).toBeUndefined();
      expect(await reg.sessions.longestPrefix("alice", [])).toBeUndefined();
      expect((await reg.sessions.longestPrefix("bob", chat(1)))?.session.id).toBe("bob:s3"); // keys never see each other's
      await expectRegistryError(reg.sessions.longestPrefix("alice", ["nothex"]), "invalid_input");
      // The session moves to another holder; the old holder's remove no longer takes it.
      await reg.sessions.upsert({ ...base, id: "alice:s1", holderInstanceId: "d2", tier: "disk", turns: 2 });
      expect(await reg.sessions.remove("alice:s1", "d1")).toBe(false);
      expect(await reg.sessions.get("alice:s1")).toMatchObject({ holderInstanceId: "d2", tier: "disk", turns: 2 });
      await expectRegistryError(
        reg.sessions.upsert({ ...base, id: "alice:s4", holderInstanceId: "d1", roundHashes: ["nothex"] }),
        "invalid_input",
      );
      await expectRegistryError(
        reg.sessions.upsert({ ...base, id: "alice:s4", holderInstanceId: "d1", messageHashes: ["nothex"] }),
        "invalid_input",
      );
      clock.advance(30_000);
      expect(await reg.sessions.sweep(["d3"])).toBe(1); // bob's holder died
      clock.advance(31_000);
      expect(await reg.sessions.get("alice:s2")).toBeUndefined(); // expired, not yet swept
      expect(await reg.sessions.sweep()).toBe(2);
    });

    it("responses: stored per key, chained oldest first, expired links end the chain", async () => {
      const turn = (id: string, previousId: string | null, expiresInMs = 60_000) => ({
        id,
        tenant: "alice",
        previousId,
        sessionId: "alice:resp_1",
        model: "m",
        input: [{ role: "user" as const, content: `q ${id}` }],
        outputText: `a ${id}`,
        inputTokens: 5,
        outputTokens: 3,
        createdAt: clock.now(),
        expiresAt: new Date(clock.ms + expiresInMs),
      });
      await reg.responses.create(turn("resp_1", null, 10_000));
      await reg.responses.create(turn("resp_2", "resp_1"));
      await reg.responses.create(turn("resp_3", "resp_2"));
      expect((await reg.responses.chain("resp_3", "alice"))!.map((r) => r.id)).toEqual(["resp_1", "resp_2", "resp_3"]);
      expect(await reg.responses.chain("resp_3", "bob")).toBeUndefined();
      expect(await reg.responses.get("resp_2", "bob")).toBeUndefined();
      clock.advance(11_000);
      expect((await reg.responses.chain("resp_3", "alice"))!.map((r) => r.id)).toEqual(["resp_2", "resp_3"]);
      expect(await reg.responses.remove("resp_3", "bob")).toBe(false);
      expect(await reg.responses.remove("resp_3", "alice")).toBe(true);
      expect(await reg.responses.sweep()).toBe(1);
    });

    it("a restart under the same instance id ends the open requests of its previous life, and only those", async () => {
      await reg.requests.create({ id: "prefilling-here", prefillInstanceId: "serve-1" });
      await reg.requests.mark("prefilling-here", { event: "prefill_start" });
      await reg.requests.create({ id: "decoding-here", prefillInstanceId: "p-other" });
      await reg.requests.mark("decoding-here", { event: "prefill_end" });
      expect(await reg.requests.claimDecode("decoding-here", "serve-1")).toBe(true);
      await reg.requests.create({ id: "elsewhere", prefillInstanceId: "p-other" });
      await reg.requests.create({ id: "finished", prefillInstanceId: "serve-1" });
      await reg.requests.finish("finished", { state: "done" });
      clock.advance(1_000);
      const restartedAt = clock.now();
      clock.advance(10);
      await reg.requests.create({ id: "new-life", prefillInstanceId: "serve-1" }); // arrived after the restart
      expect(await reg.sweep.endPreviousLife("serve-1", restartedAt)).toBe(2);
      expect(await reg.requests.get("prefilling-here")).toMatchObject({
        state: "failed",
        error: "the instance serve-1 restarted during the request",
      });
      expect(await reg.requests.get("decoding-here")).toMatchObject({ state: "failed" });
      for (const id of ["elsewhere", "new-life"]) expect((await reg.requests.get(id))?.state).toBe("queued");
      expect((await reg.requests.get("finished"))?.state).toBe("done");
    });
  });
});
