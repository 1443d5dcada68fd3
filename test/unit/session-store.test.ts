// Parked sessions (services/sessions/session-store.ts) on a real engine with a tiny model: a turn
// resumed from a parked session computes only its new tokens and gets the logits a whole prefill
// gets; the longest common prefix is what is reused; memory pressure spills to the disk tier and
// the next turn reads it back (every chunk checked); a restart adopts what is on disk; quotas, TTL,
// deletion and keys keep sessions apart.
import { mkdtemp, readdir, readFile, rm, writeFile } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { Engine, loadModel, type LoadedModel } from "../../shared/inference/engine/engine.ts";
import { kvShape } from "../../services/handoff/format/seq-io.ts";
import { SessionDisk } from "../../services/sessions/session-disk.ts";
import { commonPrefix, roundHashes, SessionStore, type SessionLimits } from "../../services/sessions/session-store.ts";
import { TINY_ARCH_VOCAB, tinyArchModel } from "../harness/arch-models.ts";
import { tinyLlama } from "../harness/gguf-writer.ts";

let dir: string;
let model: LoadedModel;
let engine: Engine;
const V = 64;

beforeAll(async () => {
  dir = await mkdtemp(join(tmpdir(), "ctxbank-sessions-"));
  await writeFile(join(dir, "tiny.gguf"), tinyLlama({ nLayer: 2, nVocab: V, nCtx: 256 }));
  model = await loadModel(join(dir, "tiny.gguf"));
  engine = new Engine(model, { threads: 1 });
});
afterAll(async () => {
  await rm(dir, { recursive: true, force: true });
});

const ids = (n: number, seed: number) => Array.from({ length: n }, (_, i) => (i * 31 + seed * 17 + 5) % V);
const bytesPerToken = () => model.config.kvBytesPerToken;
const LIMITS: SessionLimits = { memoryBytes: 1 << 30, perKeyBytes: 1 << 30, ttlMs: 60_000 };
const newStore = (limits: SessionLimits, disk?: SessionDisk, now?: () => number) =>
  new SessionStore({
    limits,
    createSequence: (c) => engine.createSequence(c),
    kvBytes: (n) => engine.kvBytes(n),
    shape: kvShape(model.config),
    disk,
    ...(now ? { now } : {}),
  });

/** A finished turn: the sequence after prefilling `prompt` (its KV holds exactly the prompt). */
async function turn(prompt: number[]): Promise<{ seq: ReturnType<Engine["createSequence"]>; logits: Float32Array }> {
  const seq = engine.createSequence(engine.maxContext);
  const logits = await engine.prefill(seq, prompt);
  return { seq, logits };
}

/** The logits after the whole prompt, computed from nothing. */
async function fresh(prompt: number[]): Promise<Float32Array> {
  const { seq, logits } = await turn(prompt);
  seq.release();
  return logits;
}

const maxDiff = (a: Float32Array, b: Float32Array) => a.reduce((m, x, i) => Math.max(m, Math.abs(x - b[i]!)), 0);

describe("SessionStore", () => {
  it("a resumed session computes only the new tokens and gets the whole prefill's logits", async () => {
    const store = newStore(LIMITS);
    const history = ids(40, 1);
    const first = await turn(history);
    await store.park("alice", "chat-1", first.seq, history, [0, 20], 1);
    expect(store.summary("alice", "chat-1")).toMatchObject({ tokens: 40, tier: "memory", roundStarts: [0, 20], turns: 1 });
    const next = [...history, ...ids(12, 2)];
    const resumed = (await store.resume("alice", "chat-1", next))!;
    expect(resumed.reused).toBe(40);
    expect(resumed.seq.nPast).toBe(40);
    const logits = await engine.prefill(resumed.seq, next.slice(40));
    expect(maxDiff(logits, await fresh(next))).toBeLessThan(1e-4);
    expect(store.summary("alice", "chat-1")).toBeUndefined(); // taken for the turn
    resumed.seq.release();
  });

  it("a turn longer than the parked sequence's room gets a larger sequence holding the same KV", async () => {
    const store = newStore(LIMITS);
    const history = ids(30, 11);
    const small = engine.createSequence(30);
    await engine.prefill(small, history);
    await store.park("alice", "grow", small, history, [0], 1);
    const next = [...history, ...ids(50, 12)];
    const r = (await store.resume("alice", "grow", next, 200))!;
    expect(r.seq.capacity).toBeGreaterThanOrEqual(200);
    expect(r.seq.nPast).toBe(30);
    expect(maxDiff(await engine.prefill(r.seq, next.slice(30)), await fresh(next))).toBeLessThan(1e-4);
    r.seq.release();
  });

  it("reuses the longest common prefix, keeps the last prompt token to compute, and drops a rewritten history", async () => {
    const store = newStore(LIMITS);
    const history = ids(30, 3);
    await store.park("alice", "s", (await turn(history)).seq, history, [0], 1);
    const edited = [...history.slice(0, 18), 63, ...ids(5, 4)]; // the client changed token 18
    const r = (await store.resume("alice", "s", edited))!;
    expect(r.reused).toBe(18);
    expect(maxDiff(await engine.prefill(r.seq, edited.slice(18)), await fresh(edited))).toBeLessThan(1e-4);
    await store.park("alice", "s", r.seq, edited, [0], 2);
    // The same prompt again (a regenerate): all but its last token come from the store.
    const again = (await store.resume("alice", "s", edited))!;
    expect(again.reused).toBe(edited.length - 1);
    await store.park("alice", "s", again.seq, edited.slice(0, again.seq.nPast), [0], 3);
    // Nothing in common: the stored session is dropped, the turn computes everything.
    expect(
      await store.resume(
        "alice",
        "s",
        ids(10, 9).map((x) => (x + 1) % V),
      ),
    ).toBeUndefined();
    expect(store.summary("alice", "s")).toBeUndefined();
  });

  it("a sequence whose rows a reclaiming policy moved is not kept: its next turn computes its prompt", async () => {
    const store = newStore(LIMITS);
    const history = ids(24, 21);
    const seq = engine.createSequence(64);
    seq.setPolicy({ kind: "streaming", streaming: { sinks: 2, window: 4, reclaim: true } });
    let logits = await engine.prefill(seq, history);
    const held = [...history];
    for (let i = 0; i < 8; i++) {
      held.push(logits.indexOf(Math.max(...logits)));
      logits = (await engine.decode([seq], [held.at(-1)!]))[0]!;
    }
    expect(seq.rowsMoved).toBe(true);
    const dropped = store.counts.dropped;
    await store.park("alice", "reclaimed", seq, held, [0], 1);
    expect(store.summary("alice", "reclaimed")).toBeUndefined();
    expect(store.counts.dropped).toBe(dropped + 1);
    expect(await store.resume("alice", "reclaimed", [...held, 7])).toBeUndefined();
  });

  it("keys keep sessions apart; delete ends one; the TTL ends the idle ones", async () => {
    let now = 1_000_000;
    const store = newStore({ ...LIMITS, ttlMs: 1_000 }, undefined, () => now);
    const h = ids(16, 5);
    await store.park("alice", "shared-name", (await turn(h)).seq, h, [0], 1);
    expect(store.summary("bob", "shared-name")).toBeUndefined();
    expect(await store.resume("bob", "shared-name", [...h, 1])).toBeUndefined();
    expect(await store.remove("bob", "shared-name")).toBe(false);
    expect(store.list("alice").map((s) => s.id)).toEqual(["shared-name"]);
    expect(await store.remove("alice", "shared-name")).toBe(true);
    expect(store.size).toBe(0);
    await store.park("alice", "idle", (await turn(h)).seq, h, [0], 1);
    now += 999;
    expect(await store.sweep()).toBe(0);
    now += 2;
    expect(store.summary("alice", "idle")).toBeUndefined();
    expect(await store.sweep()).toBe(1);
    expect(store.bytesInMemory).toBe(0);
  });

  it("a key over its quota loses its own oldest sessions; without a disk tier memory pressure drops the oldest", async () => {
    const per = 50 * bytesPerToken();
    const store = newStore({ memoryBytes: 2 * per, perKeyBytes: per, ttlMs: 60_000 });
    const h = ids(30, 6);
    await store.park("alice", "a1", (await turn(h)).seq, h, [0], 1);
    await store.park("alice", "a2", (await turn(h)).seq, h, [0], 1); // 60 > 50 tokens: a1 goes
    expect(store.list("alice").map((s) => s.id)).toEqual(["a2"]);
    await store.park("bob", "b1", (await turn(h)).seq, h, [0], 1);
    await store.park("carol", "c1", (await turn(h)).seq, h, [0], 1); // memory 90 > 100? no: 3 x 30 = 90 fits
    await store.park("dave", "d1", (await turn(h)).seq, h, [0], 1); // 120 > 100: the oldest (alice's a2) goes
    expect(store.summary("alice", "a2")).toBeUndefined();
    expect(store.counts.dropped).toBe(2);
    expect(store.bytesInMemory).toBe(3 * 30 * bytesPerToken());
    store.close();
  });

  it("memory pressure spills to disk; the next turn reads it back; a restart adopts the disk; a corrupt file is dropped", async () => {
    const diskDir = join(dir, "disk");
    const shape = kvShape(model.config);
    const disk = new SessionDisk(diskDir, 1 << 30, shape, model.fingerprint, 16);
    const h = ids(40, 7);
    const store = newStore({ memoryBytes: 50 * bytesPerToken(), perKeyBytes: 1 << 30, ttlMs: 60_000 }, disk);
    await store.park("alice", "old", (await turn(h)).seq, h, [0, 10], 1);
    await store.park("alice", "new", (await turn(ids(40, 8))).seq, ids(40, 8), [0], 1); // "old" spills
    expect(store.summary("alice", "old")).toMatchObject({
      tier: "disk",
      tokens: 40,
      roundHashes: roundHashes(Int32Array.from(h), [0, 10]),
    });
    expect(store.counts.spilled).toBe(1);
    expect((await readdir(diskDir)).sort().map((f) => f.split(".").pop())).toEqual(["json", "kv"]);
    const next = [...h, ...ids(8, 9)];
    const r = (await store.resume("alice", "old", next))!;
    expect(r.reused).toBe(40);
    expect(maxDiff(await engine.prefill(r.seq, next.slice(40)), await fresh(next))).toBeLessThan(1e-4);
    r.seq.release();
    expect(await readdir(diskDir)).toEqual([]); // taken from disk for the turn
    // Another park spills "new" (memory holds 50 tokens' worth); then a "restart": a new store
    // adopts what is on disk.
    await store.park("bob", "b", (await turn(h)).seq, h, [0], 4);
    expect(store.summary("alice", "new")).toMatchObject({ tier: "disk" });
    store.close();
    const restarted = newStore(store.limits, new SessionDisk(diskDir, 1 << 30, shape, model.fingerprint, 16));
    expect(await restarted.adoptDisk()).toBe(1);
    expect(restarted.summary("alice", "new")).toMatchObject({ tier: "disk", tokens: 40, turns: 1 });
    // Corrupt one byte of the KV file: the load fails on its checksum, the session is gone and the
    // turn computes its prompt (no error for the client).
    const kv = (await readdir(diskDir)).find((f) => f.endsWith(".kv"))!;
    const bytes = await readFile(join(diskDir, kv));
    bytes[bytes.length - 5]! ^= 0xff;
    await writeFile(join(diskDir, kv), bytes);
    const dropped = restarted.counts.dropped;
    expect(await restarted.resume("alice", "new", [...ids(40, 8), 1])).toBeUndefined();
    expect(restarted.counts.dropped).toBe(dropped + 1);
    expect(await readdir(diskDir)).toEqual([]);
    expect(restarted.summary("alice", "new")).toBeUndefined();
    restarted.close();
  });

  it("a model with sliding-window layers: rings travel as their last window; a rollback past a ring recomputes", async () => {
    // Gemma 3's shape, tiny: layers 0-4 slide (window 24), 5 is global; 8-token micro-batches give
    // 64-row rings, so a 200-token session is well past them.
    const path = join(dir, "gemma3.gguf");
    await writeFile(
      path,
      tinyArchModel({ arch: "gemma3", ropeBase: 500, nHeadKv: 1, headDim: 32, nLayer: 6, slidingWindow: 24, nCtx: 512 }),
    );
    const gm = await loadModel(path);
    const ge = new Engine(gm, { threads: 1, ubatch: 8 });
    expect(ge.info.ringRows).toBe(64);
    const rowPair = 2 * 32 * 2;
    expect(ge.kvBytes(200)).toBe((200 + 5 * 64) * rowPair);
    const gTurn = async (prompt: number[], capacity = prompt.length) => {
      const seq = ge.createSequence(capacity);
      return { seq, logits: await ge.prefill(seq, prompt) };
    };
    const toks = (n: number, seed: number) => Array.from({ length: n }, (_, i) => (i * 37 + seed * 11 + 3) % TINY_ARCH_VOCAB);
    const diskDir = join(dir, "disk-gemma");
    const disk = new SessionDisk(diskDir, 1 << 30, kvShape(gm.config), gm.fingerprint, 64);
    const store = new SessionStore({
      limits: { memoryBytes: ge.kvBytes(200), perKeyBytes: 1 << 30, ttlMs: 60_000 },
      createSequence: (c) => ge.createSequence(c),
      kvBytes: (n) => ge.kvBytes(n),
      shape: kvShape(gm.config),
      disk,
    });
    const h = toks(200, 1);
    await store.park("alice", "a", (await gTurn(h)).seq, h, [0], 1);
    await store.park("alice", "b", (await gTurn(toks(200, 2))).seq, toks(200, 2), [0], 1); // "a" spills
    expect(store.summary("alice", "a")).toMatchObject({ tier: "disk" });
    // On disk: the global layer's 200 rows and the sliding layers' last 24, in checksummed chunks.
    const kvFile = (await readdir(diskDir)).find((f) => f.endsWith(".kv"))!;
    const size = (await readFile(join(diskDir, kvFile))).byteLength;
    expect(size).toBeGreaterThan((200 + 5 * 24) * rowPair);
    expect(size).toBeLessThan((200 + 5 * 24) * rowPair + 16 * 1024);
    // Read back into a larger sequence; the new tokens' logits are a fresh prefill's.
    const next = [...h, ...toks(8, 3)];
    const r = (await store.resume("alice", "a", next, 300))!;
    expect(r.reused).toBe(200);
    const fresh = await gTurn(next);
    expect(maxDiff(await ge.prefill(r.seq, next.slice(200)), fresh.logits)).toBe(0);
    fresh.seq.release();
    r.seq.release();
    // "b", in memory in a 200-token sequence, moves to a larger one (the copy carries the rings' window).
    const nextB = [...toks(200, 2), ...toks(8, 4)];
    const rb = (await store.resume("alice", "b", nextB, 300))!;
    expect(rb.seq.capacity).toBe(300);
    const freshB = await gTurn(nextB);
    expect(maxDiff(await ge.prefill(rb.seq, nextB.slice(200)), freshB.logits)).toBe(0);
    freshB.seq.release();
    rb.seq.release();
    // A prompt sharing 100 of a session's 200 tokens would roll back past the 64-row rings: recomputed.
    await store.park("alice", "c", (await gTurn(toks(200, 5))).seq, toks(200, 5), [0], 1);
    const dropped = store.counts.dropped;
    expect(await store.resume("alice", "c", [...toks(200, 5).slice(0, 100), 5, 6])).toBeUndefined();
    expect(store.counts.dropped).toBe(dropped + 1);
    store.close();
  });

  it("commonPrefix and roundHashes", () => {
    expect(commonPrefix([1, 2, 3], [1, 2, 4, 5])).toBe(2);
    expect(commonPrefix([], [1])).toBe(0);
    const hashes = roundHashes(Int32Array.from([1, 2, 3, 4]), [0, 2]);
    expect(hashes).toHaveLength(2);
    expect(hashes[0]).not.toBe(hashes[1]);
    expect(roundHashes(Int32Array.from([1, 2, 3, 4]), [2])).toEqual(hashes); // the first round starts at 0 anyway
  });
});
