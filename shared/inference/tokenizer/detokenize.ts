/**
 * Turning token bytes back into text: llama.cpp's `clean_spaces` post-processing for whole decodes,
 * and a streaming detokenizer that only ever emits complete UTF-8 characters.
 */

/** llama.cpp `detokenize` clean_spaces passes (ASCII only, safe on UTF-8 bytes). */
export function cleanSpacesBytes(t: Uint8Array): Uint8Array {
  const text = Array.from(t);
  const SP = 0x20,
    Q = 0x3f,
    EX = 0x21,
    DOT = 0x2e,
    COMMA = 0x2c,
    AP = 0x27;
  const c_s = 0x73,
    c_m = 0x6d,
    c_r = 0x72,
    c_e = 0x65,
    c_v = 0x76;
  // pass 1: " ?", " !", " .", " ," → drop the space
  let total = text.length ? 1 : 0;
  for (let i = 1; i < text.length; i++) {
    const x = text[i]!;
    if (text[i - 1] === SP && (x === Q || x === EX || x === DOT || x === COMMA)) total--;
    text[total++] = x;
  }
  text.length = total;
  // pass 2: " ' " → "'"
  const t2 = total;
  total = t2 ? 1 : 0;
  for (let i = 1; i < t2; i++) {
    const x = text[i]!;
    if (x === AP && i + 1 < t2 && text[i - 1] === SP && text[i + 1] === SP) {
      total--;
      text[++i] = 0; // skip the next space (llama.cpp overwrites it with '\0', in place, as here)
    }
    text[total++] = x;
  }
  text.length = total;
  // pass 3: " 's", " 'm", " 're", " 've" → drop the space
  const t3 = total;
  total = t3 ? 1 : 0;
  for (let i = 1; i < t3; i++) {
    const x = text[i]!;
    if (text[i - 1] === SP && x === AP && i + 1 < t3) {
      const x1 = text[i + 1]!;
      if (x1 === c_s || x1 === c_m) total--;
      else if (i + 2 < t3) {
        const x2 = text[i + 2]!;
        if ((x1 === c_r && x2 === c_e) || (x1 === c_v && x2 === c_e)) total--;
      }
    }
    text[total++] = x;
  }
  text.length = total;
  return Uint8Array.from(text);
}

/** What the streaming detokenizer needs from a tokenizer (`GgufTokenizer` provides it). */
export interface TokenBytesSource {
  tokenBytes(id: number, special: boolean): Uint8Array;
}

/**
 * Incremental detokenizer: `push(ids)` returns the newly completed text. Bytes of a character split
 * across tokens (emoji, CJK over byte tokens) are held until the character is complete, so no
 * replacement characters are printed mid-stream; `flush()` returns what is left (an incomplete
 * trailing sequence becomes U+FFFD, exactly as a whole `decode` would render it).
 */
export class StreamingDetokenizer {
  private readonly decoder = new TextDecoder("utf-8", { ignoreBOM: true });
  private ended = false;

  constructor(
    private readonly tok: TokenBytesSource,
    private readonly special: boolean,
  ) {}

  push(ids: number | readonly number[]): string {
    if (this.ended) throw new Error("StreamingDetokenizer: push() after flush()");
    const list = typeof ids === "number" ? [ids] : ids;
    let s = "";
    for (const id of list) s += this.decoder.decode(this.tok.tokenBytes(id, this.special), { stream: true });
    return s;
  }

  flush(): string {
    if (this.ended) return "";
    this.ended = true;
    return this.decoder.decode();
  }
}
