// mapFile/unmapFile: a zero-copy view of a file range (how a same-host decode reads shard chunks),
// private (writes never reach the file), detached on unmap, and refusing bad ranges.
import { mkdtempSync, readFileSync, rmSync, writeFileSync } from "node:fs";
import os from "node:os";
import path from "node:path";
import { afterAll, describe, expect, it } from "vitest";
import { mapFile, populateMapped, unmapFile } from "../../shared/inference/engine/native.ts";

const dir = mkdtempSync(path.join(os.tmpdir(), "ctxbank-map-"));
const file = path.join(dir, "shard");
const bytes = Buffer.alloc(3 * 4096 + 321);
for (let i = 0; i < bytes.length; i++) bytes[i] = (i * 31 + 7) & 0xff;
writeFileSync(file, bytes);
afterAll(() => rmSync(dir, { recursive: true, force: true }));

describe("mapFile", () => {
  it("views the file's bytes at an unaligned offset, privately", () => {
    const ab = mapFile(file, 4099, 5000);
    const view = new Uint8Array(ab);
    expect(view.byteLength).toBe(5000);
    expect(Buffer.compare(view, bytes.subarray(4099, 4099 + 5000))).toBe(0);
    view[0] = view[0]! ^ 0xff;
    expect(readFileSync(file)[4099]).toBe(bytes[4099]);
    unmapFile(ab);
    expect(ab.byteLength).toBe(0); // detached: no view can reach the unmapped pages
    expect(view.byteLength).toBe(0);
    expect(() => unmapFile(ab)).toThrow(/not a live mapping/);
  });

  it("maps without the pages and populates a range later, off the JS thread", async () => {
    const ab = mapFile(file, 0, bytes.length, undefined, false);
    await populateMapped(ab, 4099, 5000);
    expect(Buffer.compare(new Uint8Array(ab), bytes)).toBe(0);
    expect(() => populateMapped(ab, bytes.length - 1, 2)).toThrow(RangeError);
    unmapFile(ab);
    expect(() => populateMapped(ab, 0, 1)).toThrow(/not a live mapping/);
  });

  it("refuses missing files, bad ranges and foreign buffers", () => {
    expect(() => mapFile(path.join(dir, "missing"), 0, 1)).toThrow(/cannot map .*missing: No such file/);
    const code = (fn: () => unknown) => {
      try {
        fn();
      } catch (e) {
        return (e as NodeJS.ErrnoException).code;
      }
    };
    expect(code(() => mapFile(path.join(dir, "missing"), 0, 1))).toBe("ENOENT");
    expect(code(() => mapFile(file, bytes.length, 1))).toBe("ERANGE");
    expect(code(() => mapFile(dir, 0, 1))).toBe("EINVAL");
    expect(() => mapFile(dir, 0, 1)).toThrow(/not a regular file/);
    expect(() => mapFile(file, bytes.length - 1, 2)).toThrow(/lie outside the 12609-byte file/);
    expect(() => mapFile(file, -1, 2)).toThrow(RangeError);
    expect(() => mapFile(file, 0, 0)).toThrow(RangeError);
    expect(() => mapFile(file, 0.5, 2)).toThrow(RangeError);
    expect(() => unmapFile(new ArrayBuffer(8))).toThrow(/not a live mapping/);
  });
});
