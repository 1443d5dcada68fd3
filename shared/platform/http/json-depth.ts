// A nesting bound for JSON bodies, checked by a byte scan as the body arrives, before JSON.parse:
// parsing millions of nested brackets takes seconds of the event loop (and the body limit alone
// allows that many), while every body the services accept nests a few levels deep. A body nested
// too deep is refused as soon as the scan sees it, without reading (or decoding) the rest.

/** The deepest nesting of arrays and objects any accepted body needs, with room to spare. */
export const MAX_JSON_DEPTH = 32;

/** Whether a Content-Type names JSON the way Hono's validator reads it (only such bodies are parsed). */
export function isJsonMediaType(contentType: string | undefined): boolean {
  return /^application\/([\w.-]+\+)?json$/i.test((contentType ?? "").split(";")[0]!.trim());
}

/**
 * Tracks the nesting of a JSON text fed in byte chunks. UTF-8 never uses an ASCII byte inside a
 * multi-byte character, so the bytes of `"`, `\`, brackets and braces can be scanned undecoded.
 */
export class JsonDepthScanner {
  private depth = 0;
  private inString = false;
  private escaped = false;

  constructor(private readonly limit: number) {}

  /** Scans the next bytes; true once the text has nested deeper than the limit. */
  exceeds(bytes: Uint8Array): boolean {
    for (let i = 0; i < bytes.length; i++) {
      const c = bytes[i]!;
      if (this.inString) {
        if (this.escaped) this.escaped = false;
        else if (c === 0x5c) this.escaped = true;
        else if (c === 0x22) this.inString = false;
      } else if (c === 0x22) {
        this.inString = true;
      } else if (c === 0x5b || c === 0x7b) {
        if (++this.depth > this.limit) return true;
      } else if (c === 0x5d || c === 0x7d) {
        this.depth--;
      }
    }
    return false;
  }
}

/**
 * Reads a JSON body to its text, or stops (cancelling the stream) as soon as it nests deeper than
 * `limit`: returns undefined then.
 */
export async function readJsonWithin(body: ReadableStream<Uint8Array>, limit: number): Promise<string | undefined> {
  const scanner = new JsonDepthScanner(limit);
  const reader = body.getReader();
  const chunks: Uint8Array[] = [];
  for (;;) {
    const { done, value } = await reader.read();
    if (done) break;
    if (scanner.exceeds(value)) {
      await reader.cancel().catch(() => {});
      return undefined;
    }
    chunks.push(value);
  }
  return Buffer.concat(chunks).toString("utf8");
}
