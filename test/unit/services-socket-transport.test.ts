// The decode side's socket HTTP transport against the prefill's chunk route: the same bytes and
// the same error codes as the undici transport, keep-alive reuse, a retry after an idle
// connection was closed, deadlines and aborts that stop writing into the caller's buffer.
import { existsSync } from "node:fs";
import { mkdtemp, rm } from "node:fs/promises";
import http from "node:http";
import os from "node:os";
import path from "node:path";
import { serve } from "@hono/node-server";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { chunkByteLength, type ChunkMeta } from "../../services/handoff/format/chunk.ts";
import { encodeChunkFromLayers } from "../../services/handoff/format/chunk-pack.ts";
import { Shard } from "../../services/handoff/shard/shard.ts";
import { chunkRoutes } from "../../services/handoff/transport/chunk-server.ts";
import { HttpTransport } from "../../services/handoff/transport/http.ts";
import type { ChunkLocation } from "../../services/handoff/transport/types.ts";
import { SocketHttpTransport } from "../../services/handoff/transport/socket.ts";
import { fastChunkRoutes } from "../../services/handoff/chunk-route.ts";
import { listen, misbehavingOwner, transportError } from "../harness/transport.ts";

const MiB = 1 << 20;
const soon = (ms = 5_000) => Date.now() + ms;

describe.each([
  ["the shared chunk route", chunkRoutes],
  ["the prefill's fast chunk route", fastChunkRoutes],
] as const)("SocketHttpTransport against %s", (_name, routes) => {
  let dir: string;
  let shard: Shard;
  let server: http.Server;
  let loc: ChunkLocation;
  let chunk: Uint8Array;
  let connections = 0;
  const transports: SocketHttpTransport[] = [];
  const track = (t = new SocketHttpTransport()) => (transports.push(t), t);

  beforeAll(async () => {
    dir = await mkdtemp(path.join(existsSync("/dev/shm") ? "/dev/shm" : os.tmpdir(), "ctxbank-socket-"));
    shard = await Shard.create({ dir, shardId: "owner-a", epoch: 4, sizeBytes: 64 * MiB });
    const meta: ChunkMeta = {
      fingerprint: "5e".repeat(32),
      dtype: "f16",
      layerIds: [0, 1, 2],
      hkv: 3,
      headDim: 64,
      tokenStart: 0,
      tokenCount: 300,
    };
    const layers = meta.layerIds.map((l) => ({
      k: new Uint16Array(300 * 192).map((_, i) => i * 7 + l),
      v: new Uint16Array(300 * 192).map((_, i) => i * 13 + l),
    }));
    chunk = new Uint8Array(chunkByteLength(meta));
    encodeChunkFromLayers(chunk, meta, layers);
    const offset = shard.alloc(chunk.byteLength)!;
    await shard.write(offset, chunk);
    server = serve({
      fetch: routes((id) => (id === "owner-a" ? shard : undefined), { pieceBytes: 64 << 10 }).fetch,
      port: 0,
      hostname: "127.0.0.1",
    }) as http.Server;
    server.on("connection", () => connections++);
    loc = {
      shardId: "owner-a",
      epoch: 4,
      shardPath: shard.path,
      ownerBaseUrl: `http://127.0.0.1:${await listen(server)}`,
      offset,
      length: chunk.byteLength,
    };
  });

  afterAll(async () => {
    await Promise.all(transports.map((t) => t.close()));
    server.closeAllConnections();
    await new Promise((r) => server.close(r));
    await shard.close();
    await rm(dir, { recursive: true, force: true });
  });

  it("reads the chunk byte for byte, and reuses its keep-alive connections", async () => {
    const t = track();
    const before = connections;
    for (let i = 0; i < 5; i++) {
      const into = new Uint8Array(chunk.byteLength + 10).fill(0xee);
      expect(await t.readChunk(loc, into, { deadlineMs: soon() })).toBe(chunk.byteLength);
      expect(Buffer.compare(into.subarray(0, chunk.byteLength), chunk)).toBe(0);
      expect(into.subarray(chunk.byteLength).every((b) => b === 0xee)).toBe(true);
    }
    expect(connections - before).toBe(1);
    const many = await Promise.all(Array.from({ length: 4 }, () => t.readChunk(loc, new Uint8Array(loc.length), { deadlineMs: soon() })));
    expect(many).toEqual([loc.length, loc.length, loc.length, loc.length]);
  });

  it("maps the owner's refusals to the undici transport's codes", async () => {
    const t = track();
    const undici = new HttpTransport();
    try {
      for (const bad of [{ epoch: 3 }, { shardId: "nope" }, { offset: 64 * MiB - 10, length: 11 }, { offset: 60 * MiB, length: 10 }]) {
        const l = { ...loc, ...bad };
        const ours = await transportError(t.readChunk(l, new Uint8Array(MiB), { deadlineMs: soon() }));
        const theirs = await transportError(undici.readChunk(l, new Uint8Array(MiB), { deadlineMs: soon() }));
        expect([ours.code, ours.status, ours.message]).toEqual([theirs.code, theirs.status, theirs.message]);
      }
      // The connection survives an error answer.
      expect(await t.readChunk(loc, new Uint8Array(loc.length), { deadlineMs: soon() })).toBe(loc.length);
    } finally {
      await undici.close();
    }
  });

  it("an owner that is gone is unreachable; https owners are refused", async () => {
    const gone = http.createServer().listen(0, "127.0.0.1");
    const port = await listen(gone);
    await new Promise((r) => gone.close(r));
    const err = await transportError(
      track().readChunk({ ...loc, ownerBaseUrl: `http://127.0.0.1:${port}` }, new Uint8Array(loc.length), { deadlineMs: soon() }),
    );
    expect(err.code).toBe("unreachable");
    expect(err.message).toMatch(/ECONNREFUSED/);
    expect(
      (await transportError(track().readChunk({ ...loc, ownerBaseUrl: "https://x" }, new Uint8Array(loc.length), { deadlineMs: soon() })))
        .code,
    ).toBe("invalid_request");
  });

  it("retries once when the owner closed an idle keep-alive connection", async () => {
    const t = track();
    await t.readChunk(loc, new Uint8Array(loc.length), { deadlineMs: soon() });
    server.closeIdleConnections();
    await new Promise((r) => setTimeout(r, 50));
    expect(await t.readChunk(loc, new Uint8Array(loc.length), { deadlineMs: soon() })).toBe(loc.length);
  });

  describe("owners that misbehave", () => {
    let bad: Awaited<ReturnType<typeof misbehavingOwner>>;
    let url: string;
    beforeAll(async () => {
      bad = await misbehavingOwner(loc.length);
      url = bad.url;
    });
    afterAll(() => bad.close());

    it.each([
      ["declared", "bad_response"],
      ["chunked", "bad_response"],
      ["cut", "short_read"],
    ])("/%s → %s", async (route, code) => {
      expect(
        (
          await transportError(
            track().readChunk({ ...loc, ownerBaseUrl: `${url}/${route}` }, new Uint8Array(loc.length), { deadlineMs: soon() }),
          )
        ).code,
      ).toBe(code);
    });

    it.each(["/silent", "/half"])("the deadline ends a stalled read (%s) and nothing is written afterwards", async (route) => {
      const into = new Uint8Array(loc.length);
      const t0 = Date.now();
      const err = await transportError(track().readChunk({ ...loc, ownerBaseUrl: url + route }, into, { deadlineMs: Date.now() + 300 }));
      expect(err.code).toBe("deadline_exceeded");
      expect(Date.now() - t0).toBeLessThan(1_500);
      const filled = into.indexOf(0);
      await new Promise((r) => setTimeout(r, 100));
      expect(into.indexOf(0)).toBe(filled);
    });

    it("the caller's signal aborts a read in flight", async () => {
      const ac = new AbortController();
      setTimeout(() => ac.abort(), 100);
      const err = await transportError(
        track().readChunk({ ...loc, ownerBaseUrl: `${url}/half` }, new Uint8Array(loc.length), { deadlineMs: soon(), signal: ac.signal }),
      );
      expect(err.code).toBe("aborted");
    });
  });
});
