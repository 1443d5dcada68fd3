/** sha256 of a file, and a pass-through stream that hashes what is written through it. */
import { createHash } from "node:crypto";
import { createReadStream } from "node:fs";
import { Transform } from "node:stream";

export async function sha256File(path: string): Promise<string> {
  const h = createHash("sha256");
  for await (const chunk of createReadStream(path, { highWaterMark: 1 << 20 })) h.update(chunk as Buffer);
  return h.digest("hex");
}

/**
 * A pass-through stream that feeds every chunk to a sha256 and then to `onChunk` (byte counts,
 * progress, other checks); `digest()` gives the hex sha256 once the stream has finished.
 */
export function sha256Tap(onChunk: (chunk: Buffer) => void): { tap: Transform; digest: () => string } {
  const hash = createHash("sha256");
  const tap = new Transform({
    transform(chunk: Buffer, _enc, cb) {
      hash.update(chunk);
      onChunk(chunk);
      cb(null, chunk);
    },
  });
  return { tap, digest: () => hash.digest("hex") };
}
