// A nesting bound for JSON bodies, checked by a byte scan before JSON.parse: parsing millions of
// nested brackets takes seconds of the event loop (and the body limit alone allows that many),
// while every body the services accept nests a few levels deep.

/** The deepest nesting of arrays and objects any accepted body needs, with room to spare. */
export const MAX_JSON_DEPTH = 32;

/** Whether a Content-Type names JSON the way Hono's validator reads it (only such bodies are parsed). */
export function isJsonMediaType(contentType: string | undefined): boolean {
  return /^application\/([\w.-]+\+)?json$/i.test((contentType ?? "").split(";")[0]!.trim());
}

/** Whether `text` nests arrays/objects deeper than `limit` (brackets inside strings do not count). One pass, stops early. */
export function jsonNestsDeeperThan(text: string, limit: number): boolean {
  let depth = 0;
  let inString = false;
  for (let i = 0; i < text.length; i++) {
    const c = text.charCodeAt(i);
    if (inString) {
      if (c === 0x5c) i++; // backslash: the next character is escaped
      else if (c === 0x22) inString = false;
    } else if (c === 0x22) {
      inString = true;
    } else if (c === 0x5b || c === 0x7b) {
      if (++depth > limit) return true;
    } else if (c === 0x5d || c === 0x7d) {
      depth--;
    }
  }
  return false;
}
