// The UCX transport against an owner in another process (test/harness/ucx-owner.ts): the same
// bytes and the same error codes as the other transports (test/unit/transport.test.ts), a restarted
// owner's old epoch read as stale_epoch, an owner killed before or during a read, a stalled owner
// ended by the deadline, and every malformed endpoint the registry could hand out refused cleanly
// before a byte of it reaches UCX. UCX lives in its own addon, loaded on first use only: the
// engine's addon maps no UCX library, and a UCX addon that is missing or cannot be loaded is a
// clear error (test/harness/ucx-load-probe.ts, in processes of their own). The transport's cases
// skip, saying so, where the UCX addon is not built (CI installs libucx-dev and builds with
// CTXBANK_UCX=ON, so they run there).
import { execFile, spawn } from "node:child_process";
import { once } from "node:events";
import { mkdtemp, rm, writeFile } from "node:fs/promises";
import path from "node:path";
import { createInterface } from "node:readline";
import { fileURLToPath } from "node:url";
import { promisify } from "node:util";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { chunkByteLength, verifyChunk, type ChunkMeta } from "../../services/handoff/format/chunk.ts";
import { encodeChunkFromLayers } from "../../services/handoff/format/chunk-pack.ts";
import { Shard } from "../../services/handoff/shard/shard.ts";
import { UcxShardExposure, UcxTransport, ucxAvailable, type UcxChunkLocation } from "../../services/handoff/transport/ucx.ts";
import { decodeUcxEndpoint, encodeUcxEndpoint } from "../../services/handoff/transport/ucx-endpoint.ts";
import { transportError } from "../harness/transport.ts";
import type { UcxLoadProbe } from "../harness/ucx-load-probe.ts";
import { startUcxOwner, type UcxOwner } from "../harness/ucx-owner.ts";

const FP = "5e".repeat(32);
const MiB = 1 << 20;
const soon = (ms = 10_000) => Date.now() + ms;

const available = ucxAvailable();
if (!available)
  console.warn("[transport-ucx] UCX cases skipped: the UCX transport addon is not built (install libucx-dev, run npm run build:native)");

async function probe(args: string[], env: NodeJS.ProcessEnv = {}): Promise<UcxLoadProbe> {
  const script = fileURLToPath(new URL("../harness/ucx-load-probe.ts", import.meta.url));
  const { stdout } = await promisify(execFile)(process.execPath, ["--import", "tsx", script, ...args], { env: { ...process.env, ...env } });
  return JSON.parse(stdout) as UcxLoadProbe;
}

describe("the UCX addon is loaded on first use only", () => {
  it("the engine's addon maps no UCX library, nor does asking whether UCX is available; loading the UCX addon does", async () => {
    const p = await probe(["engine"]);
    expect(p.afterEngine).toEqual([]);
    expect(p.available).toBe(available);
    expect(p.afterAvailable).toEqual([]);
    if (available) {
      expect(p.loadError).toBeUndefined();
      expect(p.afterLoad).toEqual(expect.arrayContaining([expect.stringMatching(/^libucp\.so/), expect.stringMatching(/^libucs\.so/)]));
    } else {
      expect(p.loadError).toMatch(/the UCX transport is not built/);
    }
  }, 60_000);

  it("a missing UCX addon: not available, and using it says it is not built", async () => {
    const dir = await mkdtemp(path.join("/tmp", "ctxbank-ucx-addon-"));
    try {
      const p = await probe([], { CTXBANK_ADDON: path.join(dir, "ctxbank_native.node") });
      expect(p).toMatchObject({ available: false, availableAfterLoad: false, afterLoad: [] });
      expect(p.loadError).toMatch(/the UCX transport is not built \(.*ctxbank_ucx\.node is missing\)/);
    } finally {
      await rm(dir, { recursive: true, force: true });
    }
  }, 60_000);

  it("a UCX addon that cannot be loaded: a clear error, not a crash, and UCX is unavailable afterwards", async () => {
    const dir = await mkdtemp(path.join("/tmp", "ctxbank-ucx-addon-"));
    try {
      await writeFile(path.join(dir, "ctxbank_ucx.node"), "not a shared object");
      const p = await probe([], { CTXBANK_ADDON: path.join(dir, "ctxbank_native.node") });
      expect(p).toMatchObject({ available: true, availableAfterLoad: false, afterLoad: [] });
      expect(p.loadError).toMatch(/cannot load the UCX transport addon .*ctxbank_ucx\.node/);
    } finally {
      await rm(dir, { recursive: true, force: true });
    }
  }, 60_000);
});

describe.skipIf(!available)("UCX transport", () => {
  let dir: string;
  let shard: Shard;
  let chunk: Uint8Array;
  let big: Uint8Array;
  let owner: UcxOwner;
  let loc: UcxChunkLocation;
  let bigLoc: UcxChunkLocation;
  const t = () => new UcxTransport();

  beforeAll(async () => {
    dir = await mkdtemp(path.join("/dev/shm", "ctxbank-ucx-"));
    shard = await Shard.create({ dir, shardId: "prefill-u", epoch: 2, sizeBytes: 96 * MiB });
    const meta: ChunkMeta = { fingerprint: FP, dtype: "f16", layerIds: [3, 4, 5, 6], hkv: 3, headDim: 64, tokenStart: 0, tokenCount: 256 };
    const layers = meta.layerIds.map((l) => ({
      k: new Uint16Array(256 * 192).map((_, i) => (i * 31 + l) & 0xffff),
      v: new Uint16Array(256 * 192).map((_, i) => (i * 17 + l) & 0xffff),
    }));
    chunk = new Uint8Array(chunkByteLength(meta));
    encodeChunkFromLayers(chunk, meta, layers);
    const offset = shard.alloc(chunk.byteLength)!;
    await shard.write(offset, chunk);
    big = new Uint8Array(64 * MiB).map((_, i) => (i * 2654435761) >>> 24);
    const bigOffset = shard.alloc(big.byteLength)!;
    await shard.write(bigOffset, big);
    owner = await startUcxOwner(shard.path, shard.sizeBytes, shard.epoch);
    loc = {
      shardId: "prefill-u",
      epoch: 2,
      shardPath: shard.path,
      ownerBaseUrl: "http://127.0.0.1:9",
      offset,
      length: chunk.byteLength,
      ucxEndpoint: owner.endpoint,
    };
    bigLoc = { ...loc, offset: bigOffset, length: big.byteLength };
  }, 30_000);

  afterAll(async () => {
    await owner?.kill();
    await shard?.close();
    await rm(dir, { recursive: true, force: true });
  });

  it("reads a chunk from another process byte for byte, and nothing past it", async () => {
    const into = new Uint8Array(chunk.byteLength + 100).fill(0xee);
    expect(await t().readChunk(loc, into, { deadlineMs: soon() })).toBe(chunk.byteLength);
    expect(Buffer.compare(into.subarray(0, chunk.byteLength), chunk)).toBe(0);
    expect(into.subarray(chunk.byteLength).every((b) => b === 0xee)).toBe(true);
    expect(verifyChunk(into.subarray(0, chunk.byteLength), { fingerprint: FP }).header.tokenCount).toBe(256);
    // What the owner writes later is what a later read sees (the owner maps the file shared).
    const into2 = new Uint8Array(big.byteLength);
    await t().readChunk(bigLoc, into2, { deadlineMs: soon(30_000) });
    expect(Buffer.compare(into2, big)).toBe(0);
  });

  it("an owner in this very process works too", async () => {
    const local = UcxShardExposure.create(shard);
    try {
      const into = new Uint8Array(chunk.byteLength);
      await t().readChunk({ ...loc, ucxEndpoint: local.endpoint }, into, { deadlineMs: soon() });
      expect(Buffer.compare(into, chunk)).toBe(0);
    } finally {
      local.close();
    }
  });

  it("validates the caller's arguments and the range before any I/O", async () => {
    const code = async (l: Partial<UcxChunkLocation>, into = new Uint8Array(loc.length), deadlineMs = soon()) =>
      (await transportError(t().readChunk({ ...loc, ...l }, into, { deadlineMs }))).code;
    expect(await code({}, new Uint8Array(10))).toBe("invalid_request");
    expect(await code({}, undefined, 5_000)).toBe("invalid_request");
    expect(await code({ length: 0 })).toBe("invalid_request");
    expect(await code({ offset: 96 * MiB - 10, length: 11 }, new Uint8Array(11))).toBe("out_of_range");
    expect(await code({ offset: Number.MAX_SAFE_INTEGER - 5, length: 5 }, new Uint8Array(5))).toBe("out_of_range");
  });

  it("a bad endpoint in the registry is a clean error, never a crash", async () => {
    const read = (ucxEndpoint: string | null | undefined) =>
      transportError(t().readChunk({ ...loc, ucxEndpoint }, new Uint8Array(loc.length), { deadlineMs: soon() }));
    for (const none of [null, undefined]) {
      const err = await read(none);
      expect(err.code).toBe("unreachable");
      expect(err.message).toMatch(/publishes no UCX endpoint/);
    }
    for (const bad of ["", "not base64!", "AAAA", "A".repeat(200_000)]) {
      const err = await read(bad);
      expect(err.code, String(bad).slice(0, 20)).toBe("bad_response");
      expect(err.message).toMatch(/UCX endpoint of shard prefill-u is unusable/);
    }
    // A byte flipped anywhere (the mapping, the token, the length, the worker address) fails the
    // envelope's checksum: UCX's own address parser, which trusts its input, never sees it.
    const raw = Buffer.from(owner.endpoint, "base64");
    const ep = decodeUcxEndpoint(owner.endpoint);
    if (typeof ep === "string") throw new Error(ep);
    const addressAt = 40;
    for (const at of [4, 8, 16, 24, 32, addressAt, addressAt + 5, raw.byteLength - 6, raw.byteLength - 1]) {
      const flipped = Buffer.from(raw);
      flipped[at]! ^= 0x40;
      const err = await read(flipped.toString("base64"));
      expect(err.code, `byte ${at}`).toBe("bad_response");
      expect(err.message).toMatch(/checksum mismatch|wrong magic/);
    }
    expect((await read(raw.subarray(0, raw.byteLength - 9).toString("base64"))).code).toBe("bad_response");
    // A well-formed envelope cannot widen the read past what the owner mapped (the owner checks),
    // nor read a mapping without its token.
    const widened = encodeUcxEndpoint({ ...ep, length: 8 * MiB });
    expect(
      (await transportError(t().readChunk({ ...bigLoc, ucxEndpoint: widened }, new Uint8Array(bigLoc.length), { deadlineMs: soon() })))
        .code,
    ).toBe("out_of_range");
    const past = encodeUcxEndpoint({ ...ep, length: 200 * MiB });
    const beyond = await transportError(
      t().readChunk({ ...loc, offset: 96 * MiB, length: 4096, ucxEndpoint: past }, new Uint8Array(4096), { deadlineMs: soon() }),
    );
    expect(beyond.code).toBe("out_of_range");
    expect(beyond.message).toMatch(/outside the owner's mapping/);
    const guessed = await transportError(
      t().readChunk({ ...loc, ucxEndpoint: encodeUcxEndpoint({ ...ep, token: ep.token ^ 1n }) }, new Uint8Array(loc.length), {
        deadlineMs: soon(),
      }),
    );
    expect(guessed.code).toBe("bad_response");
    expect(guessed.message).toMatch(/refused the read \(wrong token\)/);
    const otherMapping = await transportError(
      t().readChunk({ ...loc, ucxEndpoint: encodeUcxEndpoint({ ...ep, mapping: ep.mapping + 7n }) }, new Uint8Array(loc.length), {
        deadlineMs: soon(),
      }),
    );
    expect(otherMapping.code).toBe("stale_epoch");
  });

  it("a wrong epoch is stale_epoch; so is a restarted owner's old epoch", async () => {
    const stale = await transportError(t().readChunk({ ...loc, epoch: 1 }, new Uint8Array(loc.length), { deadlineMs: soon() }));
    expect(stale.code).toBe("stale_epoch");
    expect(stale.message).toMatch(/publishes epoch 2, not 1/);

    // The owner restarts its epoch in-process: the old pages are unmapped, the old endpoint stays in the registry's row.
    const second = await startUcxOwner(shard.path, shard.sizeBytes, 2);
    try {
      const l = { ...loc, ucxEndpoint: second.endpoint };
      await t().readChunk(l, new Uint8Array(loc.length), { deadlineMs: soon() });
      await second.unexpose();
      const into = new Uint8Array(loc.length);
      const err = await transportError(t().readChunk(l, into, { deadlineMs: soon() }));
      expect(err.code).toBe("stale_epoch");
      expect(err.message).toMatch(/epoch 2 is gone/);
    } finally {
      await second.kill();
    }
  });

  it("a stalled owner: the deadline ends the read, and nothing is written after it settles", async () => {
    const stalled = await startUcxOwner(shard.path, shard.sizeBytes, 2);
    try {
      const l = { ...bigLoc, ucxEndpoint: stalled.endpoint };
      await t().readChunk({ ...l, length: 4096 }, new Uint8Array(4096), { deadlineMs: soon() }); // connected
      stalled.child.kill("SIGSTOP");
      // Another read from the same owner, with a longer deadline: the first one's end leaves it be.
      const patientInto = new Uint8Array(l.length);
      const patient = t().readChunk(l, patientInto, { deadlineMs: soon(30_000) });
      const into = new Uint8Array(l.length);
      const started = Date.now();
      const err = await transportError(t().readChunk(l, into, { deadlineMs: Date.now() + 400 }));
      expect(err.code).toBe("deadline_exceeded");
      expect(Date.now() - started).toBeLessThan(3_000);
      const snapshot = Buffer.from(into);
      stalled.child.kill("SIGCONT");
      await new Promise((r) => setTimeout(r, 300));
      expect(Buffer.compare(into, snapshot)).toBe(0);
      expect(await patient).toBe(l.length);
      expect(Buffer.compare(patientInto, big)).toBe(0);

      // The caller's signal, likewise.
      stalled.child.kill("SIGSTOP");
      const ac = new AbortController();
      setTimeout(() => ac.abort(), 100);
      expect((await transportError(t().readChunk(l, new Uint8Array(l.length), { deadlineMs: soon(), signal: ac.signal }))).code).toBe(
        "aborted",
      );
      stalled.child.kill("SIGCONT");
    } finally {
      await stalled.kill();
    }
  });

  it("a read aborted while it pulls the bytes settles promptly, and nothing is written after", async () => {
    const outcomes: string[] = [];
    for (const afterMs of [1, 2, 4, 6, 8, 12]) {
      const ac = new AbortController();
      const into = new Uint8Array(bigLoc.length);
      const read = t().readChunk(bigLoc, into, { deadlineMs: soon(30_000), signal: ac.signal });
      setTimeout(() => ac.abort(), afterMs);
      const started = Date.now();
      outcomes.push(
        await read.then(
          () => "read",
          (e: { code?: string }) => e.code ?? String(e),
        ),
      );
      expect(Date.now() - started).toBeLessThan(3_000);
      const snapshot = Buffer.from(into);
      await new Promise((r) => setTimeout(r, 30));
      expect(Buffer.compare(into, snapshot)).toBe(0);
    }
    for (const o of outcomes) expect(["read", "aborted"]).toContain(o);
    expect(outcomes).toContain("aborted");
    // The owner still serves this reader afterwards.
    const into = new Uint8Array(bigLoc.length);
    await t().readChunk(bigLoc, into, { deadlineMs: soon(30_000) });
    expect(Buffer.compare(into, big)).toBe(0);
  });

  it("an owner killed mid-read or before it: unreachable, quickly, and never wrong bytes", async () => {
    const doomed = await startUcxOwner(shard.path, shard.sizeBytes, 2);
    const l = { ...bigLoc, ucxEndpoint: doomed.endpoint };
    const into = new Uint8Array(l.length);
    await t().readChunk(l, into, { deadlineMs: soon(30_000) }); // connected and warm
    // A read starts every 8 ms, the owner dies at ~36 ms: reads in flight then, and those after.
    const reads: Promise<true | string>[] = [];
    const killedAt = new Promise<number>((resolve) => setTimeout(() => void doomed.kill().then(() => resolve(Date.now())), 36));
    for (let i = 0; i < 8; i++) {
      const target = new Uint8Array(l.length);
      reads.push(
        t()
          .readChunk(l, target, { deadlineMs: soon(30_000) })
          .then(
            () => Buffer.compare(target, big) === 0 || "wrong bytes",
            (e: { code?: string }) => e.code ?? String(e),
          ),
      );
      await new Promise((r) => setTimeout(r, 8));
    }
    const outcomes = await Promise.all(reads);
    expect(Date.now() - (await killedAt)).toBeLessThan(5_000);
    for (const o of outcomes) expect([true, "unreachable"]).toContain(o);
    expect(outcomes).toContain("unreachable");

    const started = Date.now();
    const err = await transportError(t().readChunk(l, new Uint8Array(l.length), { deadlineMs: soon() }));
    expect(err.code).toBe("unreachable");
    expect(Date.now() - started).toBeLessThan(3_000);
  });

  it("a reader killed mid-read leaves the owner serving others", async () => {
    const script = fileURLToPath(new URL("../harness/ucx-reader.ts", import.meta.url));
    const reader = spawn(process.execPath, ["--import", "tsx", script, JSON.stringify(bigLoc)], { stdio: ["ignore", "pipe", "inherit"] });
    const exited = new Promise((r) => reader.once("exit", r));
    try {
      const [line] = (await once(createInterface({ input: reader.stdout! }), "line")) as [string];
      expect(line).toBe("reading");
    } finally {
      reader.kill("SIGKILL");
      await exited;
    }
    const into = new Uint8Array(big.byteLength);
    await t().readChunk(bigLoc, into, { deadlineMs: soon(30_000) });
    expect(Buffer.compare(into, big)).toBe(0);
    expect(owner.child.exitCode).toBeNull();
  });

  it("prints the throughput of a 64 MiB read (not asserted)", async () => {
    const into = new Uint8Array(big.byteLength);
    const ms: number[] = [];
    for (let i = 0; i < 3; i++) {
      const t0 = performance.now();
      await t().readChunk(bigLoc, into, { deadlineMs: soon(30_000) });
      ms.push(performance.now() - t0);
    }
    expect(Buffer.compare(into, big)).toBe(0);
    console.log(
      `[throughput] ucx: 64 MiB in ${ms.map((m) => m.toFixed(1)).join(" / ")} ms, best ${(64 / 1024 / (Math.min(...ms) / 1000)).toFixed(2)} GiB/s`,
    );
  });
});
