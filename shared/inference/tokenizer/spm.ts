/**
 * SentencePiece (GGUF `tokenizer.ggml.model` = "llama"), with llama.cpp's exact semantics
 * (`llm_tokenizer_spm_session` in llama-vocab.cpp):
 *
 *   - the text arrives with spaces already escaped as "▁" (and the optional space prefix added);
 *   - symbols start as its characters; every adjacent pair whose concatenation is a vocabulary token
 *     is queued with that token's score; the highest score merges first, ties going to the leftmost
 *     pair; stale entries (either side changed since queued) are skipped; each merge queues the new
 *     symbol's pairs with its neighbours;
 *   - every final symbol is a vocabulary token, except single characters no token spells: those
 *     become their UTF-8 bytes' byte-fallback tokens (`<0xNN>`).
 *
 * A merged symbol is always a token (a pair is only queued when its text is one), so llama.cpp's
 * `rev_merge` re-segmentation never splits one and is not needed here.
 *
 * Cost: one heap entry per initial pair plus two per merge, each a substring of at most two tokens'
 * length looked up in the text → id map: O(n log n) in the characters of the text, with a bounded
 * amount of work per character (tokens are short), however the text repeats.
 */
import { TokenizerError } from "./vocab.ts";

const HEX = "0123456789ABCDEF";

export class SentencePieceEncoder {
  /** byte → its byte-fallback token */
  private readonly byteIds = new Int32Array(256);

  constructor(
    private readonly tokenToId: ReadonlyMap<string, number>,
    private readonly scores: Float64Array,
  ) {
    for (let b = 0; b < 256; b++) {
      // llama.cpp `byte_to_token`: "<0xNN>" (upper-case hex), else the byte as a one-character token.
      const id = tokenToId.get(`<0x${HEX[b >> 4]}${HEX[b & 15]}>`) ?? (b < 0x80 ? tokenToId.get(String.fromCharCode(b)) : undefined);
      if (id === undefined) {
        // llama.cpp would throw mid-tokenization on the first text that needs it; refuse up front.
        throw new TokenizerError(
          "tokenizer_bad_metadata",
          `the SentencePiece vocabulary has no byte-fallback token for byte 0x${HEX[b >> 4]}${HEX[b & 15]} ` +
            `(<0x00>…<0xFF>); such vocabularies are not supported`,
        );
      }
      this.byteIds[b] = id;
    }
  }

  /** The byte-fallback token of a byte. */
  byteToken(b: number): number {
    return this.byteIds[b]!;
  }

  /** Appends the ids of escaped text (spaces as "▁") to `out`. */
  encode(text: string, out: number[]): void {
    // Symbols: the code points of the text, as UTF-16 offsets and lengths (a symbol's length only
    // ever grows by merging its right neighbour in, so a stale queue entry shows in the lengths).
    const cap = text.length;
    const start = new Int32Array(cap);
    const len = new Int32Array(cap);
    let n = 0;
    for (let i = 0; i < text.length; ) {
      const c = text.charCodeAt(i);
      const w = c >= 0xd800 && c <= 0xdbff && i + 1 < text.length ? 2 : 1;
      start[n] = i;
      len[n] = w;
      n++;
      i += w;
    }
    if (n === 0) return;
    const next = new Int32Array(n);
    const prev = new Int32Array(n);
    for (let i = 0; i < n; i++) {
      next[i] = i + 1 < n ? i + 1 : -1;
      prev[i] = i - 1;
    }

    // Max-heap of candidate merges: higher score first, then smaller left index (llama.cpp's
    // comparator). At most n - 1 initial entries and 2 per merge (at most n - 1 merges).
    const size = Math.max(1, 3 * (n - 1));
    const hScore = new Float64Array(size);
    const hLeft = new Int32Array(size);
    const hRight = new Int32Array(size);
    const hLen = new Int32Array(size);
    let hn = 0;
    const before = (i: number, j: number): boolean => hScore[i]! > hScore[j]! || (hScore[i] === hScore[j] && hLeft[i]! < hLeft[j]!);
    const swap = (i: number, j: number): void => {
      const s = hScore[i]!;
      hScore[i] = hScore[j]!;
      hScore[j] = s;
      const l = hLeft[i]!;
      hLeft[i] = hLeft[j]!;
      hLeft[j] = l;
      const r = hRight[i]!;
      hRight[i] = hRight[j]!;
      hRight[j] = r;
      const z = hLen[i]!;
      hLen[i] = hLen[j]!;
      hLen[j] = z;
    };
    const tryAdd = (left: number, right: number): void => {
      if (left < 0 || right < 0) return;
      const total = len[left]! + len[right]!;
      const id = this.tokenToId.get(text.substr(start[left]!, total));
      if (id === undefined) return;
      let i = hn++;
      hScore[i] = this.scores[id]!;
      hLeft[i] = left;
      hRight[i] = right;
      hLen[i] = total;
      while (i > 0) {
        const p = (i - 1) >> 1;
        if (!before(i, p)) break;
        swap(i, p);
        i = p;
      }
    };

    for (let i = 1; i < n; i++) tryAdd(i - 1, i);
    while (hn > 0) {
      const left = hLeft[0]!;
      const right = hRight[0]!;
      const total = hLen[0]!;
      hn--;
      if (hn > 0) {
        swap(0, hn);
        for (let i = 0; ; ) {
          const a = 2 * i + 1;
          if (a >= hn) break;
          const c = a + 1 < hn && before(a + 1, a) ? a + 1 : a;
          if (!before(c, i)) break;
          swap(c, i);
          i = c;
        }
      }
      // Skip outdated entries: either side merged away or grown since this pair was queued.
      if (len[left] === 0 || len[right] === 0 || len[left]! + len[right]! !== total) continue;
      len[left] = total;
      len[right] = 0;
      const after = next[right]!;
      next[left] = after;
      if (after >= 0) prev[after] = left;
      tryAdd(prev[left]!, left);
      tryAdd(left, after);
    }

    for (let i = 0; i !== -1; i = next[i]!) {
      const piece = text.substr(start[i]!, len[i]!);
      const id = this.tokenToId.get(piece);
      if (id !== undefined) out.push(id);
      else this.pushBytes(piece.codePointAt(0)!, out); // an unmerged single character
    }
  }

  /**
   * Appends the byte-fallback ids of the first `count` UTF-8 bytes of escaped text (fewer if it is
   * shorter), without merging: for filling past a length limit, where only the count matters.
   */
  encodeBytes(text: string, count: number, out: number[]): void {
    const stop = out.length + count;
    for (const ch of text) {
      if (out.length >= stop) break;
      this.pushBytes(ch.codePointAt(0)!, out);
    }
    if (out.length > stop) out.length = stop;
  }

  private pushBytes(cp: number, out: number[]): void {
    const b = this.byteIds;
    if (cp < 0x80) out.push(b[cp]!);
    else if (cp < 0x800) out.push(b[0xc0 | (cp >> 6)]!, b[0x80 | (cp & 0x3f)]!);
    else if (cp < 0x10000) out.push(b[0xe0 | (cp >> 12)]!, b[0x80 | ((cp >> 6) & 0x3f)]!, b[0x80 | (cp & 0x3f)]!);
    else out.push(b[0xf0 | (cp >> 18)]!, b[0x80 | ((cp >> 12) & 0x3f)]!, b[0x80 | ((cp >> 6) & 0x3f)]!, b[0x80 | (cp & 0x3f)]!);
  }
}

/** SentencePiece's whitespace escape: every space becomes "▁" (U+2581), as llama.cpp's `llama_escape_whitespace`. */
export function escapeSpaces(text: string): string {
  return text.replaceAll(" ", "\u2581");
}
