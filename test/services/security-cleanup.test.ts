// Crash cleanup in the registry (issue 10), on PGlite and PostgreSQL 15: a live prefill's sweep
// removes what dead instances left (their shard files on this host, chunk rows and refs, open
// requests) only after the grace, never a live instance's, never a file that is not the
// registered one or lies on another host; sweeps are idempotent and may run concurrently; ended
// requests and long-dead instances are pruned after the retention.
import { createHash } from "node:crypto";
import { existsSync } from "node:fs";
import { mkdtemp, rename, rm, writeFile } from "node:fs/promises";
import os from "node:os";
import path from "node:path";
import { eq, sql } from "drizzle-orm";
import pino from "pino";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { Sweeper } from "../../services/handoff/sweeper.ts";
import { Shard, shardFileName } from "../../services/handoff/shard/shard.ts";
import { openDatabase, type OpenedDatabase } from "../../shared/platform/registry/db.ts";
import { Registry } from "../../shared/platform/registry/registry.ts";
import { chunkRefs, chunks, requests } from "../../shared/platform/registry/schema.ts";
import { startPostgres } from "../../tools/lib/postgres.ts";

const backends = [
  { name: "PGlite", start: async () => ({ url: "pglite://memory", stop: async () => {} }) },
  { name: "PostgreSQL 15", start: startPostgres },
];

const T0 = new Date("2030-01-01T00:00:00.000Z").getTime();
const TIMEOUT = 10_000;
const GRACE = 2 * TIMEOUT;
const UNCLAIMED = 130_000;
const RETENTION = 3_600_000;
const MiB = 1 << 20;

describe.each(backends)("sweeping dead instances on $name", (backend) => {
  let server: { url: string; stop(): Promise<void> };
  let opened: OpenedDatabase;
  let reg: Registry;
  let dir: string;
  let now = T0;
  const clock = () => new Date(now);
  const files = new Map<string, Shard>();
  const settings = () => ({ hostId: "host-1", shardDir: dir, graceMs: GRACE, unclaimedMs: UNCLAIMED, retentionMs: RETENTION });
  const sweeper = () => new Sweeper(reg, settings(), pino({ level: "silent" }));

  beforeAll(async () => {
    server = await backend.start();
    opened = await openDatabase(server.url);
    reg = new Registry(opened.db, { clock });
    dir = await mkdtemp(path.join(existsSync("/dev/shm") ? "/dev/shm" : os.tmpdir(), "ctxbank-sweep-"));
  });
  afterAll(async () => {
    for (const s of files.values()) await s.destroy();
    await opened?.close();
    await server?.stop();
    await rm(dir, { recursive: true, force: true });
  });

  /** A prefill instance with an active shard epoch, its file created and registered. */
  async function prefillInstance(id: string, hostId = "host-1") {
    await reg.instances.register({ id, role: "prefill", baseUrl: `http://${id}:1`, hostId });
    const row = await reg.shards.create({ id, instanceId: id, sizeBytes: 4 * MiB, pathFor: (e) => path.join(dir, shardFileName(id, e)) });
    const shard = await Shard.create({ dir, shardId: id, epoch: row.epoch, sizeBytes: 4 * MiB });
    await reg.shards.recordFile(id, row.epoch, shard.fileId);
    await shard.write(shard.alloc(MiB)!, Buffer.alloc(MiB, 7));
    files.set(id, shard);
    return shard;
  }

  /** A request prefilled on `shard` holding one ready chunk; left at the given stage. */
  async function request(id: string, shard: Shard, stage: "prefilling" | "handle" | "claimed" | "done", decoder?: string) {
    await reg.requests.create({ id, promptTokens: 8, prefillInstanceId: shard.shardId });
    await reg.requests.mark(id, { event: "prefill_start" });
    const begun = await reg.chunks.begin({
      key: createHash("sha256").update(id).digest("hex"),
      requestId: id,
      layerGroup: 0,
      layerIds: [0],
      tokenStart: 0,
      tokenEnd: 8,
      shardId: shard.shardId,
      shardEpoch: shard.epoch,
      offset: 0,
      length: 4096,
      dtype: "f16",
      layoutVersion: 1,
      modelFingerprint: "ab".repeat(32),
      writeLeaseMs: 60_000,
    });
    await reg.chunks.commit(begun.chunk.id, { checksum: 1, retainMs: 3_600_000 });
    if (stage === "prefilling") return;
    await reg.requests.mark(id, { event: "prefill_end" });
    if (stage === "handle") return;
    await opened.db
      .update(requests)
      .set({ firstTokenAt: clock(), decodeInstanceId: decoder ?? null })
      .where(eq(requests.id, id));
    if (stage === "done") await reg.requests.finish(id, { state: "done", outputTokens: 3 });
  }

  const state = async (id: string) => (await reg.requests.get(id))?.state;
  const chunkCount = async (shardId: string) =>
    (
      (await opened.db.execute(sql`select count(*)::int as n from chunks where shard_id = ${shardId}`)) as unknown as {
        rows: { n: number }[];
      }
    ).rows[0]!.n;

  it("removes a dead prefill's file, chunks, refs and open requests after the grace, and nothing of the living", async () => {
    const old = await prefillInstance("prefill-old");
    const live = await prefillInstance("prefill-live");
    const far = await prefillInstance("prefill-far", "host-2"); // another host's tmpfs: not ours to delete
    const swapped = await prefillInstance("prefill-swapped");
    await reg.instances.register({ id: "decode-old", role: "decode", baseUrl: "http://decode-old:1", hostId: "host-1" });
    await reg.instances.register({ id: "decode-live", role: "decode", baseUrl: "http://decode-live:1", hostId: "host-1" });
    await request("r-prefilling", old, "prefilling");
    await request("r-decoding-dead", live, "claimed", "decode-old");
    await request("r-decoding-live", live, "claimed", "decode-live");
    await request("r-long-prefill", live, "prefilling");
    await request("r-far", far, "handle");
    // A file put in place of a dead shard's own file is not the registered one: never deleted.
    await writeFile(`${swapped.path}.other`, "not the registered file");
    await rename(`${swapped.path}.other`, swapped.path);

    // The old instances go silent; the live ones keep beating.
    now += TIMEOUT + 1;
    for (const id of ["prefill-live", "decode-live"]) await reg.instances.heartbeat(id);
    expect((await reg.instances.markDead(TIMEOUT)).sort()).toEqual(["decode-old", "prefill-far", "prefill-old", "prefill-swapped"]);

    // Declared dead, but within the grace: decodes still get "owner failed" from the chunk rows.
    const early = await sweeper().sweep();
    expect(early).toMatchObject({ files: [], chunks: 0, requestsEnded: 0 });
    expect(existsSync(old.path)).toBe(true);
    expect(await chunkCount("prefill-old")).toBe(1);

    now += GRACE;
    for (const id of ["prefill-live", "decode-live"]) await reg.instances.heartbeat(id);
    // Two sweepers at once (two live prefills): both succeed, the work is done once.
    const [a, b] = await Promise.all([sweeper().sweep(), sweeper().sweep()]);
    expect([...a.files, ...b.files]).toEqual([old.path]);
    expect(a.chunks + b.chunks).toBe(2); // prefill-old's and prefill-far's rows
    expect(a.requestsEnded + b.requestsEnded).toBe(2);

    expect(existsSync(old.path)).toBe(false);
    expect(existsSync(live.path)).toBe(true);
    expect(existsSync(far.path)).toBe(true);
    expect(existsSync(swapped.path)).toBe(true);
    expect(await chunkCount("prefill-old")).toBe(0);
    expect(await chunkCount("prefill-far")).toBe(0);
    expect(await chunkCount("prefill-live")).toBe(3);
    const refs = await opened.db.select().from(chunkRefs);
    expect(refs.map((r) => r.requestId).sort()).toEqual(["r-decoding-dead", "r-decoding-live", "r-long-prefill"]);

    expect(await reg.requests.get("r-prefilling")).toMatchObject({
      state: "failed",
      error: "the prefill instance prefill-old died during the request",
    });
    expect(await reg.requests.get("r-decoding-dead")).toMatchObject({
      state: "failed",
      error: "the decode instance decode-old died during the request",
    });
    expect((await reg.requests.get("r-prefilling"))!.endedAt?.getTime()).toBe(now);
    expect(await state("r-decoding-live")).toBe("decoding");
    expect(await state("r-long-prefill")).toBe("prefilling");
    // A handle of a dead prefill is left to its own expiry (a client may still recompute it).
    expect(await state("r-far")).toBe("decoding");

    // Idempotent: nothing left to do.
    expect(await sweeper().sweep()).toEqual({ files: [], chunks: 0, requestsEnded: 0, requestsPruned: 0, instancesPruned: 0 });
  });

  it("ends handles nobody took once their chunks are long reclaimed, never a prefill still running", async () => {
    const live = files.get("prefill-live")!;
    await request("r-unclaimed", live, "handle");
    await request("r-slow-prefill", live, "prefilling");
    now += UNCLAIMED - 1;
    await reg.instances.heartbeat("prefill-live");
    await sweeper().sweep();
    expect(await state("r-unclaimed")).toBe("decoding");
    now += 2;
    await reg.instances.heartbeat("prefill-live");
    await sweeper().sweep();
    expect(await reg.requests.get("r-unclaimed")).toMatchObject({ state: "failed", error: expect.stringMatching(/^abandoned/) });
    expect(await state("r-slow-prefill")).toBe("prefilling");
    expect(await reg.requests.get("r-far")).toMatchObject({ state: "failed", error: expect.stringMatching(/^abandoned/) }); // a dead prefill's handle too, at its expiry
  });

  it("prunes ended requests and long-dead instances after the retention", async () => {
    const live = files.get("prefill-live")!;
    await request("r-done", live, "done"); // ends now, with r-unclaimed; the other three ended earlier
    now += RETENTION - 1;
    await reg.instances.heartbeat("prefill-live");
    await reg.instances.heartbeat("decode-live");
    expect(await sweeper().sweep()).toMatchObject({ requestsPruned: 3, instancesPruned: 4 });
    expect(await state("r-done")).toBe("done");
    expect(await reg.instances.get("prefill-old")).toBeUndefined();
    expect(await reg.shards.get("prefill-old", 1)).toBeUndefined();
    now += 2;
    await reg.instances.heartbeat("prefill-live");
    await reg.instances.heartbeat("decode-live");
    expect(await sweeper().sweep()).toMatchObject({ requestsPruned: 2, instancesPruned: 0 });
    expect(await reg.requests.get("r-done")).toBeUndefined();
    expect(await reg.instances.get("prefill-live")).toBeDefined();
    expect(await state("r-decoding-live")).toBe("decoding");
    expect(await state("r-long-prefill")).toBe("prefilling");
    expect((await opened.db.select().from(chunks)).every((c) => c.shardId === "prefill-live")).toBe(true);
  });

  it("a retention shorter than the grace never prunes a dead instance's shard row before its file is swept", async () => {
    const shard = await prefillInstance("prefill-brief");
    const beat = async () => {
      await reg.instances.heartbeat("prefill-live");
      await reg.instances.heartbeat("decode-live");
    };
    const brief = new Sweeper(reg, { ...settings(), retentionMs: 1_000 }, pino({ level: "silent" }));
    now += TIMEOUT + 1; // silent past the timeout: declared dead, and dead longer than the retention
    await beat();
    expect(await reg.instances.markDead(TIMEOUT)).toEqual(["prefill-brief"]);
    await brief.sweep();
    expect(await reg.shards.get("prefill-brief", shard.epoch)).toBeDefined(); // still names the file
    now += GRACE;
    await beat();
    expect((await brief.sweep()).files).toEqual([shard.path]);
    expect(existsSync(shard.path)).toBe(false);
    now += 2 * GRACE;
    await beat();
    expect(await brief.sweep()).toMatchObject({ instancesPruned: 1 });
    expect(await reg.shards.get("prefill-brief", shard.epoch)).toBeUndefined();
  });
});
