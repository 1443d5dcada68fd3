// The streamed handle's pieces that need no services: the NDJSON lines a decode accepts from a
// prefill (validated, bounded), and the feed of chunk ids its readers take from.
import { describe, expect, it } from "vitest";
import { ChunkFeed } from "../../services/handoff/chunk-feed.ts";
import { handleLines, MAX_HANDLE_LINE } from "../../services/handoff/handle-stream.ts";

const enc = new TextEncoder();
async function* pieces(...parts: string[]): AsyncGenerator<Uint8Array> {
  for (const p of parts) yield enc.encode(p);
}
async function all(body: AsyncIterable<Uint8Array>) {
  const out = [];
  for await (const line of handleLines(body)) out.push(line);
  return out;
}
const ID = "0b7c8a4e-1f2d-4c3b-9a8e-7d6c5b4a3f21";

describe("streamed handle lines", () => {
  it("parses lines split anywhere across pieces", async () => {
    const text = `{"chunk":"${ID}"}\n\n{"error":{"status":502,"code":"prefill_failed","message":"gone"}}\n`;
    const lines = await all(pieces(text.slice(0, 5), text.slice(5, 31), text.slice(31)));
    expect(lines).toEqual([{ chunk: ID }, { error: { status: 502, code: "prefill_failed", message: "gone" } }]);
  });

  it("refuses a line that is not JSON, not a known line, or not a uuid", async () => {
    await expect(all(pieces("nope\n"))).rejects.toThrow(/not JSON/);
    await expect(all(pieces('{"chunk":"x"}\n'))).rejects.toThrow(/malformed/);
    await expect(all(pieces(`{"chunk":"${ID}","extra":1}\n`))).rejects.toThrow(/malformed/);
    await expect(all(pieces('{"handle":{"request_id":"r"}}\n'))).rejects.toThrow(/malformed/);
  });

  it("refuses a line longer than the bound without waiting for its end", async () => {
    const big = "x".repeat(1 << 20);
    async function* endless(): AsyncGenerator<Uint8Array> {
      for (let i = 0; i < 2 * (MAX_HANDLE_LINE >> 20) + 2; i++) yield enc.encode(big);
      throw new Error("read past the bound");
    }
    await expect(all(endless())).rejects.toThrow(/exceeds/);
  });
});

describe("chunk feed", () => {
  const never = new AbortController().signal;

  it("hands out each id once, in order, to readers waiting before or after it came", async () => {
    const feed = new ChunkFeed();
    const early = feed.next(never);
    feed.push("a");
    feed.push("b");
    feed.push("a");
    expect(await early).toBe("a");
    expect(await feed.next(never)).toBe("b");
    const waiting = feed.next(never);
    feed.end(["a", "b", "c"]); // the handle's ids: c was never announced
    expect(await waiting).toBe("c");
    expect(await feed.next(never)).toBeUndefined();
    expect([...feed.seen]).toEqual(["a", "b", "c"]);
  });

  it("a failed prefill fails every reader; an aborted reader stops waiting", async () => {
    const feed = new ChunkFeed();
    const ac = new AbortController();
    const aborted = feed.next(ac.signal);
    ac.abort(new Error("client gone"));
    await expect(aborted).rejects.toThrow("client gone");
    const waiting = feed.next(never);
    feed.fail(new Error("prefill died"));
    await expect(waiting).rejects.toThrow("prefill died");
    await expect(feed.next(never)).rejects.toThrow("prefill died");
    feed.push("late");
    await expect(feed.next(never)).rejects.toThrow("prefill died");
  });
});
