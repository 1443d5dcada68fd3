// Gives byte ranges of a shard file new pages, as an owner that freed them and wrote them again
// would: each range is read, its pages punched out of the file, and the same bytes written back.
// Readers that had those pages mapped lose the mappings (the kernel unmaps punched pages), so the
// next read meets pages it has never seen: what a decode finds when it loads a new handle.
import { closeSync, openSync, readSync, writeSync } from "node:fs";
import { punchHole } from "../../shared/inference/engine/native.ts";

// One buffer for every range, kept: a fresh one per range would be tens of MiB of garbage per
// call, which V8 collects with a full mark-compact during the load timed next (in this process).
let scratch = Buffer.allocUnsafe(0);

export function renewPages(path: string, ranges: readonly { offset: number; length: number }[]): void {
  const fd = openSync(path, "r+");
  try {
    for (const { offset, length } of ranges) {
      if (scratch.byteLength < length) scratch = Buffer.allocUnsafe(length);
      const bytes = scratch.subarray(0, length);
      if (readSync(fd, bytes, 0, length, offset) !== length) throw new Error(`${path}: short read at ${offset}`);
      punchHole(fd, offset, length);
      writeSync(fd, bytes, 0, length, offset);
    }
  } finally {
    closeSync(fd);
  }
}
