// A handle's chunks are retained from the handle, not from each chunk's commit: a prompt that
// prefills for longer than --retain-ms used to lose its first chunks to the reaper before its
// handle was even answered (found by the fault matrix: the decode could lease none of them and
// recomputed). Ready chunks a still-prefilling request holds are not reaped; write leases still
// expire; once the handle is answered the retention runs from then.
import { createHash } from "node:crypto";
import { afterAll, beforeAll, expect, it } from "vitest";
import { openDatabase, type OpenedDatabase } from "../../shared/platform/registry/db.ts";
import { Registry } from "../../shared/platform/registry/registry.ts";

const RETAIN = 2_000;
let opened: OpenedDatabase;
let reg: Registry;
let now = new Date("2030-01-01T00:00:00.000Z").getTime();
const shard = { shardId: "prefill-1", epoch: 1 };

beforeAll(async () => {
  opened = await openDatabase("pglite://memory");
  reg = new Registry(opened.db, { clock: () => new Date(now) });
  await reg.instances.register({ id: "prefill-1", role: "prefill", baseUrl: "http://prefill-1:1", hostId: "host-1" });
  await reg.shards.create({ id: "prefill-1", instanceId: "prefill-1", sizeBytes: 1 << 20, pathFor: (e) => `/tmp/prefill-1.e${e}.shard` });
});
afterAll(async () => {
  await opened?.close();
});

async function chunk(requestId: string, block: number, commit: boolean): Promise<string> {
  const begun = await reg.chunks.begin({
    key: createHash("sha256").update(`${requestId}/${block}`).digest("hex"),
    requestId,
    layerGroup: 0,
    layerIds: [0],
    tokenStart: block * 8,
    tokenEnd: block * 8 + 8,
    shardId: shard.shardId,
    shardEpoch: shard.epoch,
    offset: block * 4096,
    length: 4096,
    dtype: "f16",
    layoutVersion: 1,
    modelFingerprint: "ab".repeat(32),
    writeLeaseMs: RETAIN,
  });
  if (commit) await reg.chunks.commit(begun.chunk.id, { checksum: 1, retainMs: RETAIN });
  return begun.chunk.id;
}

it("keeps a prefilling request's ready chunks past their retention, and retains them from the handle", async () => {
  await reg.requests.create({ id: "r-long", promptTokens: 24, prefillInstanceId: "prefill-1" });
  await reg.requests.mark("r-long", { event: "prefill_start" });
  const first = await chunk("r-long", 0, true);
  const hung = await chunk("r-long", 1, false); // a write that never finishes
  now += 10 * RETAIN; // the prompt is still prefilling long after its first chunk's commit
  const reaped = await reg.chunks.reapExpired(shard);
  expect(reaped.freed.map((f) => f.offset)).toEqual([4096]); // the hung write's lease expired
  expect((await reg.chunks.get(first))?.state).toBe("ready");
  expect(await reg.chunks.get(hung)).toBeUndefined();

  const last = await chunk("r-long", 2, true);
  expect(await reg.chunks.retainFromHandle([first, last, hung], RETAIN)).toBe(2);
  await reg.requests.mark("r-long", { event: "prefill_end" }); // the handle is answered
  now += RETAIN - 1;
  expect((await reg.chunks.reapExpired(shard)).freed).toEqual([]);
  expect(await reg.chunks.acquireRead([first, last], 1_000)).toHaveLength(2); // a decode takes them in time
  await reg.chunks.releaseRead([first, last]);
  now += 1_001;
  expect((await reg.chunks.reapExpired(shard)).freed).toHaveLength(2); // unread past the retention: reclaimed
});
