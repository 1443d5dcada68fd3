/**
 * GPT-2 byte-level mapping: every byte 0..255 has a printable stand-in character, so a BPE
 * vocabulary can spell arbitrary bytes. Normal vocabulary tokens are stored in this form.
 */

// Printable Latin-1 bytes map to themselves; the rest (controls, space, 0x7f-0xa0, 0xad) are
// shifted to U+0100 and up, in byte order — the table from GPT-2's `bytes_to_unicode`.
const BYTE_TO_CHAR: string[] = (() => {
  const bs: number[] = [];
  for (let b = 0x21; b <= 0x7e; b++) bs.push(b);
  for (let b = 0xa1; b <= 0xac; b++) bs.push(b);
  for (let b = 0xae; b <= 0xff; b++) bs.push(b);
  const table = new Array<string>(256);
  for (const b of bs) table[b] = String.fromCodePoint(b);
  let n = 0;
  for (let b = 0; b < 256; b++) {
    if (table[b] === undefined) table[b] = String.fromCodePoint(256 + n++);
  }
  return table;
})();
const CHAR_TO_BYTE = new Map<number, number>(BYTE_TO_CHAR.map((c, b) => [c.codePointAt(0)!, b]));

const utf8 = new TextEncoder();

/** Text → its UTF-8 bytes spelled as byte-level characters (what BPE merges operate on). */
export function byteLevelEncode(piece: string): string {
  const bytes = utf8.encode(piece);
  let s = "";
  for (const b of bytes) s += BYTE_TO_CHAR[b]!;
  return s;
}

/** Byte-level text (a vocabulary entry) → the bytes it stands for. */
export function byteLevelDecode(text: string): Uint8Array {
  const out: number[] = [];
  for (const ch of text) {
    const b = CHAR_TO_BYTE.get(ch.codePointAt(0)!);
    if (b !== undefined) out.push(b);
    else for (const x of utf8.encode(ch)) out.push(x); // not a byte-level char: keep its UTF-8
  }
  return Uint8Array.from(out);
}
