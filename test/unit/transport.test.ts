import { existsSync } from "node:fs";
import { mkdtemp, rm, unlink, writeFile } from "node:fs/promises";
import http from "node:http";
import os from "node:os";
import path from "node:path";
import { serve } from "@hono/node-server";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { chunkByteLength, verifyChunk, type ChunkMeta } from "../../services/handoff/format/chunk.ts";
import { encodeChunkFromLayers } from "../../services/handoff/format/chunk-pack.ts";
import { Shard } from "../../services/handoff/shard/shard.ts";
import type { LeasedChunk } from "../../shared/platform/registry/registry.ts";
import { chunkRoutes } from "../../services/handoff/transport/chunk-server.ts";
import type { TransportError } from "../../services/handoff/transport/errors.ts";
import { HttpTransport } from "../../services/handoff/transport/http.ts";
import { ShardMaps } from "../../services/handoff/transport/shard-maps.ts";
import { ShmTransport } from "../../services/handoff/transport/shm.ts";
import type { ChunkLocation, KvTransport } from "../../services/handoff/transport/types.ts";
import { listen, misbehavingOwner, transportError } from "../harness/transport.ts";

// The registry hands out locations the transports take as they are.
const _registryLocationIsATransportLocation: ChunkLocation = {} as LeasedChunk["location"];

const FP = "5e".repeat(32);
const MiB = 1 << 20;

const soon = (ms = 5_000) => Date.now() + ms;

describe("KV transports", () => {
  let dir: string;
  let shard: Shard;
  let server: http.Server;
  let baseUrl: string;
  let chunk: Uint8Array;
  let loc: ChunkLocation;
  const shm = () => new ShmTransport({ allowedDirs: [dir] });
  const transports: KvTransport[] = [];
  const track = <T extends KvTransport>(t: T) => (transports.push(t), t);

  beforeAll(async () => {
    dir = await mkdtemp(path.join(existsSync("/dev/shm") ? "/dev/shm" : os.tmpdir(), "ctxbank-transport-"));
    shard = await Shard.create({ dir, shardId: "prefill-a", epoch: 2, sizeBytes: 96 * MiB });
    const meta: ChunkMeta = { fingerprint: FP, dtype: "f16", layerIds: [3, 4, 5, 6], hkv: 3, headDim: 64, tokenStart: 0, tokenCount: 256 };
    const elems = 256 * 192;
    const layers = meta.layerIds.map((l) => ({
      k: new Uint16Array(elems).map((_, i) => (i * 31 + l) & 0xffff),
      v: new Uint16Array(elems).map((_, i) => (i * 17 + l) & 0xffff),
    }));
    chunk = new Uint8Array(chunkByteLength(meta));
    encodeChunkFromLayers(chunk, meta, layers);
    const offset = shard.alloc(chunk.byteLength)!;
    expect(shard.alloc(4096)).not.toBeNull(); // so the chunk is not at the end of the allocations
    await shard.write(offset, chunk);

    const app = chunkRoutes((id) => (id === shard.shardId ? shard : undefined));
    server = serve({ fetch: app.fetch, port: 0, hostname: "127.0.0.1" }) as http.Server;
    baseUrl = `http://127.0.0.1:${await listen(server)}`;
    loc = { shardId: "prefill-a", epoch: 2, shardPath: shard.path, ownerBaseUrl: baseUrl, offset, length: chunk.byteLength };
  });

  afterAll(async () => {
    await Promise.all(transports.map((t) => t.close()));
    await new Promise((r) => server?.close(r));
    await shard?.close();
    await rm(dir, { recursive: true, force: true });
  });

  it("both transports read the same chunk, byte for byte", async () => {
    for (const transport of [track(shm()), track(new HttpTransport())]) {
      const into = new Uint8Array(chunk.byteLength + 100).fill(0xee);
      expect(await transport.readChunk(loc, into, { deadlineMs: soon() })).toBe(chunk.byteLength);
      expect(Buffer.compare(into.subarray(0, chunk.byteLength), chunk)).toBe(0); // (toEqual is slow on big arrays)
      expect(into.subarray(chunk.byteLength).every((b) => b === 0xee)).toBe(true);
      expect(verifyChunk(into.subarray(0, chunk.byteLength), { fingerprint: FP }).header.tokenCount).toBe(256);
    }
  });

  it("shm maps the chunk in place: the same bytes, no copy, and refusals with the transport's codes", async () => {
    const t = track(shm());
    const view = await t.viewChunk(loc);
    expect(Buffer.compare(view.bytes, chunk)).toBe(0);
    expect(verifyChunk(view.bytes, { fingerprint: FP }).header.tokenCount).toBe(256);
    view.release();
    view.release(); // twice is harmless
    const code = async (l: Partial<ChunkLocation>) => {
      try {
        (await t.viewChunk({ ...loc, ...l })).release();
        return "ok";
      } catch (e) {
        return (e as TransportError).code;
      }
    };
    expect(await code({ epoch: 1 })).toBe("stale_epoch");
    expect(await code({ offset: 96 * MiB - 10, length: 11 })).toBe("out_of_range");
    expect(await code({ length: 0 })).toBe("invalid_request");
    expect(await code({ shardPath: "/etc/passwd" })).toBe("invalid_request");
  });

  it("shm keeps one mapping per shard file and unmaps it on close, once the last view is released", async () => {
    const t = shm();
    const a = await t.viewChunk(loc);
    const b = await t.viewChunk({ ...loc, offset: loc.offset + 4096, length: 4096 });
    expect(a.bytes.buffer).toBe(b.bytes.buffer); // one mapping of the file
    expect(Buffer.compare(b.bytes, chunk.subarray(4096, 8192))).toBe(0);
    a.release();
    await t.close();
    expect(b.bytes.byteLength).toBe(4096); // still out: still mapped
    b.release();
    expect(b.bytes.byteLength).toBe(0); // unmapped and detached
    expect(a.bytes.byteLength).toBe(0);
  });

  it("an idle mapping goes when its file is removed, without another view", async () => {
    const file = path.join(dir, "idle-check");
    await writeFile(file, chunk);
    const maps = new ShardMaps(20);
    const view = await maps.view(file, 4096, 4096);
    expect(Buffer.compare(view.bytes, chunk.subarray(4096, 8192))).toBe(0);
    view.release();
    await new Promise((r) => setTimeout(r, 60));
    expect(view.bytes.byteLength).toBe(4096); // the file is there: kept
    await unlink(file);
    await new Promise((r) => setTimeout(r, 100));
    expect(view.bytes.byteLength).toBe(0); // unmapped, the removed file's memory let go
    maps.close();
  });

  it("a wrong epoch is a clear stale_epoch on both", async () => {
    const stale = { ...loc, epoch: 1 };
    const viaHttp = await transportError(track(new HttpTransport()).readChunk(stale, new Uint8Array(loc.length), { deadlineMs: soon() }));
    expect(viaHttp).toMatchObject({ code: "stale_epoch", status: 409 });
    expect(viaHttp.message).toMatch(/epoch 2, not 1/);
    const viaShm = await transportError(track(shm()).readChunk(stale, new Uint8Array(loc.length), { deadlineMs: soon() }));
    expect(viaShm.code).toBe("stale_epoch");
  });

  it("the owner refuses unknown shards, ranges outside the shard, unallocated ranges and bad queries", async () => {
    const t = track(new HttpTransport());
    const read = (l: Partial<ChunkLocation>) => transportError(t.readChunk({ ...loc, ...l }, new Uint8Array(MiB), { deadlineMs: soon() }));
    expect(await read({ shardId: "nope" })).toMatchObject({ code: "not_found", status: 404 });
    expect(await read({ offset: 96 * MiB - 10, length: 11 })).toMatchObject({ code: "out_of_range", status: 416 });
    expect(await read({ offset: 90 * MiB, length: 10 })).toMatchObject({ code: "not_found", status: 410 });

    const app = chunkRoutes(() => shard, { maxLength: MiB });
    for (const query of ["offset=-1&length=1", "offset=0&length=0", "offset=1e3&length=1", "offset=0", `offset=0&length=${MiB + 1}`]) {
      const res = await app.request(`/v1/chunks/prefill-a/2?${query}`);
      expect(res.status, query).toBe(400);
      expect(await res.json()).toMatchObject({ error: { code: "invalid_request", type: "invalid_request_error", param: null } });
    }
    expect((await app.request("/v1/chunks/prefill-a/x?offset=0&length=1")).status).toBe(400);
    expect((await app.request(`/v1/chunks/${encodeURIComponent("../etc")}/2?offset=0&length=1`)).status).toBe(400);
  });

  it("validates the caller's arguments before any I/O", async () => {
    const t = track(new HttpTransport());
    const s = track(shm());
    const code = async (p: Promise<unknown>) => (await transportError(p)).code;
    expect(await code(t.readChunk(loc, new Uint8Array(10), { deadlineMs: soon() }))).toBe("invalid_request");
    expect(await code(t.readChunk(loc, new Uint8Array(loc.length), { deadlineMs: 5_000 }))).toBe("invalid_request");
    expect(await code(t.readChunk({ ...loc, ownerBaseUrl: "ftp://x" }, new Uint8Array(loc.length), { deadlineMs: soon() }))).toBe(
      "invalid_request",
    );
    expect(await code(t.readChunk({ ...loc, length: 0 }, new Uint8Array(1), { deadlineMs: soon() }))).toBe("invalid_request");
    expect(await code(s.readChunk({ ...loc, shardPath: "/etc/passwd" }, new Uint8Array(loc.length), { deadlineMs: soon() }))).toBe(
      "invalid_request",
    );
    expect(await code(s.readChunk({ ...loc, shardId: "prefill-b" }, new Uint8Array(loc.length), { deadlineMs: soon() }))).toBe(
      "invalid_request",
    );
    expect(await code(s.readChunk({ ...loc, offset: 95 * MiB, length: 2 * MiB }, new Uint8Array(2 * MiB), { deadlineMs: soon() }))).toBe(
      "out_of_range",
    );
  });

  it("an owner that is gone is unreachable", async () => {
    const gone = http.createServer();
    gone.listen(0, "127.0.0.1");
    const port = await listen(gone);
    await new Promise((r) => gone.close(r));
    const err = await transportError(
      track(new HttpTransport()).readChunk({ ...loc, ownerBaseUrl: `http://127.0.0.1:${port}` }, new Uint8Array(loc.length), {
        deadlineMs: soon(),
      }),
    );
    expect(err.code).toBe("unreachable");
    expect(err.message).toMatch(/ECONNREFUSED/);
  });

  describe("deadlines and aborts", () => {
    let stalling: Awaited<ReturnType<typeof misbehavingOwner>>;
    let stallUrl: string;
    beforeAll(async () => {
      stalling = await misbehavingOwner(loc.length);
      stallUrl = stalling.url;
    });
    afterAll(() => stalling.close());

    for (const prefix of ["/silent", "/half"]) {
      it(`the deadline ends a read from an owner that stalls (${prefix})`, async () => {
        const started = Date.now();
        const into = new Uint8Array(loc.length);
        const err = await transportError(
          track(new HttpTransport()).readChunk({ ...loc, ownerBaseUrl: stallUrl + prefix }, into, { deadlineMs: Date.now() + 300 }),
        );
        const elapsed = Date.now() - started;
        expect(err.code).toBe("deadline_exceeded");
        expect(elapsed).toBeGreaterThanOrEqual(290);
        expect(elapsed).toBeLessThan(1_500);
        if (prefix === "/half") {
          const filled = into.indexOf(0);
          await new Promise((r) => setTimeout(r, 100));
          expect(into.indexOf(0)).toBe(filled); // nothing written after the promise settled
        }
      });
    }

    it.each([
      ["more", "bad_response"],
      ["declared", "bad_response"],
      ["fewer", "short_read"],
      ["cut", "short_read"],
    ])("a body of the wrong size is refused (/%s → %s)", async (route, code) => {
      const err = await transportError(
        track(new HttpTransport()).readChunk({ ...loc, ownerBaseUrl: `${stallUrl}/${route}` }, new Uint8Array(loc.length + 100), {
          deadlineMs: soon(),
        }),
      );
      expect(err.code).toBe(code);
    });

    it("the caller's signal aborts a read in flight", async () => {
      const controller = new AbortController();
      setTimeout(() => controller.abort(), 100);
      const err = await transportError(
        track(new HttpTransport()).readChunk({ ...loc, ownerBaseUrl: `${stallUrl}/half` }, new Uint8Array(loc.length), {
          deadlineMs: soon(),
          signal: controller.signal,
        }),
      );
      expect(err.code).toBe("aborted");
    });

    it("a past deadline or an aborted signal fails at once on shm too", async () => {
      const s = track(shm());
      expect((await transportError(s.readChunk(loc, new Uint8Array(loc.length), { deadlineMs: Date.now() - 1 }))).code).toBe(
        "deadline_exceeded",
      );
      expect(
        (await transportError(s.readChunk(loc, new Uint8Array(loc.length), { deadlineMs: soon(), signal: AbortSignal.abort() }))).code,
      ).toBe("aborted");
    });
  });

  it("prints loopback throughput for a 64 MiB read (not asserted)", async () => {
    const big = new Uint8Array(64 * MiB).map((_, i) => (i * 2654435761) >>> 24);
    const offset = shard.alloc(big.byteLength)!;
    await shard.write(offset, big);
    const bigLoc = { ...loc, offset, length: big.byteLength };
    const into = new Uint8Array(big.byteLength);
    for (const transport of [track(shm()), track(new HttpTransport())]) {
      const ms: number[] = [];
      for (let i = 0; i < 3; i++) {
        into.fill(0);
        const t0 = performance.now();
        await transport.readChunk(bigLoc, into, { deadlineMs: soon(30_000) });
        ms.push(performance.now() - t0);
        expect(Buffer.compare(into, big)).toBe(0);
      }
      const best = Math.min(...ms);
      console.log(
        `[throughput] ${transport.name}: 64 MiB in ${ms.map((m) => m.toFixed(1)).join(" / ")} ms, best ${(64 / 1024 / (best / 1000)).toFixed(2)} GiB/s`,
      );
    }
    shard.free(offset);
  });

  it("a restarted owner's old shard file reads as stale_epoch, cached handle or not", async () => {
    const warm = track(shm());
    await warm.readChunk(loc, new Uint8Array(loc.length), { deadlineMs: soon() }); // caches the handle
    const view = await warm.viewChunk(loc); // maps the file
    view.release();
    const restarted = await Shard.create({ dir, shardId: "prefill-a", epoch: 3, sizeBytes: MiB }); // removes epoch 2's file
    try {
      expect((await transportError(warm.readChunk(loc, new Uint8Array(loc.length), { deadlineMs: soon() }))).code).toBe("stale_epoch");
      expect((await transportError(warm.viewChunk(loc))).code).toBe("stale_epoch");
      expect(view.bytes.byteLength).toBe(0); // the old file's mapping is gone with it
      expect((await transportError(track(shm()).readChunk(loc, new Uint8Array(loc.length), { deadlineMs: soon() }))).code).toBe(
        "stale_epoch",
      );
    } finally {
      await restarted.close();
    }
  });
});
