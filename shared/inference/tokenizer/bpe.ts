/**
 * Byte-pair merging with llama.cpp's exact semantics (`llm_tokenizer_bpe_session::tokenize`):
 * symbols start as the characters of a byte-level word; the adjacent pair with the lowest merge
 * rank is merged first, ties going to the leftmost pair; stale queue entries are skipped; a final
 * symbol missing from the vocabulary is emitted as its single-character tokens.
 *
 * Symbols are integers (vocabulary ids, plus synthetic ids for merge results that are not in the
 * vocabulary), so the pair lookup is a numeric Map and the queue is a binary heap over numbers:
 * linear-ish in the word length, with no per-step string building — a 200k-character word takes
 * tens of milliseconds rather than seconds.
 */

export class BytePairEncoder {
  /** symbol string → symbol id (vocabulary ids first, then synthetic ids) */
  private readonly symbolId = new Map<string, number>();
  private readonly symbolText: string[] = [];
  private readonly vocabSize: number;
  /** pair key (left * stride + right) → merge rank */
  private readonly pairRank = new Map<number, number>();
  /** merge rank → merged symbol id */
  private readonly mergeResult: Int32Array;
  private readonly stride: number;
  private readonly cache = new Map<string, number[]>();
  private static readonly CACHE_MAX_ENTRIES = 20_000;
  private static readonly CACHE_MAX_WORD = 256;

  constructor(vocab: readonly string[], merges: readonly string[]) {
    this.vocabSize = vocab.length;
    for (let i = 0; i < vocab.length; i++) this.symbolId.set(vocab[i]!, i); // later duplicates win (llama.cpp)
    for (let i = 0; i < vocab.length; i++) this.symbolText.push(vocab[i]!);
    this.mergeResult = new Int32Array(merges.length).fill(-1);

    const pairs: [number, number, number][] = [];
    for (let rank = 0; rank < merges.length; rank++) {
      const m = merges[rank]!;
      const sp = m.indexOf(" ", 1); // llama.cpp: word.find(' ', 1)
      if (sp < 0) continue;
      const left = this.intern(m.slice(0, sp));
      const right = this.intern(m.slice(sp + 1));
      pairs.push([left, right, rank]);
      this.mergeResult[rank] = this.intern(m.slice(0, sp) + m.slice(sp + 1));
    }
    // The symbol id space is fixed from here on (merge() never interns), so pair keys are stable.
    this.stride = this.symbolText.length + 1;
    for (const [l, r, rank] of pairs) {
      const key = l * this.stride + r;
      if (!this.pairRank.has(key)) this.pairRank.set(key, rank); // first occurrence wins (emplace)
    }
  }

  private intern(s: string): number {
    let id = this.symbolId.get(s);
    if (id === undefined) {
      id = this.symbolText.length;
      this.symbolId.set(s, id);
      this.symbolText.push(s);
    }
    return id;
  }

  /** Merge one byte-level word and append its token ids to `out`. */
  encodeWord(word: string, out: number[]): void {
    if (word.length === 0) return;
    const cached = this.cache.get(word);
    if (cached !== undefined) {
      for (const id of cached) out.push(id);
      return;
    }
    const result = this.merge(word);
    if (word.length < BytePairEncoder.CACHE_MAX_WORD) {
      if (this.cache.size >= BytePairEncoder.CACHE_MAX_ENTRIES) this.cache.clear();
      this.cache.set(word, result);
    }
    for (const id of result) out.push(id);
  }

  /** Appends the ids of the first `count` characters of a byte-level word, each on its own (no merging). */
  encodeChars(word: string, count: number, out: number[]): void {
    let n = 0;
    for (const c of word) {
      if (n++ === count) return;
      const id = this.symbolId.get(c);
      out.push(id !== undefined && id < this.vocabSize ? id : 0); // byte-level vocabularies hold every byte's character
    }
  }

  private merge(word: string): number[] {
    // Initial symbols: the word's characters (code points).
    const chars = Array.from(word);
    const n = chars.length;
    const sym = new Int32Array(n); // symbol id at each start position (-1 once merged away)
    const next = new Int32Array(n);
    const prev = new Int32Array(n);
    for (let i = 0; i < n; i++) {
      // A character never seen in the vocabulary or merges gets a negative id: it can take part in
      // no merge, and the id space used for pair keys stays fixed.
      sym[i] = this.symbolId.get(chars[i]!) ?? -2 - i;
      next[i] = i + 1 < n ? i + 1 : -1;
      prev[i] = i - 1;
    }

    // Min-heap of candidate merges keyed by rank * 2^26 + left position (leftmost wins ties).
    // Ranks stay below 2^21 in practice, so rank * 2^26 + position is exact in a double; words of
    // 64M+ characters use a wider position field.
    const posBits = n < 1 << 26 ? 2 ** 26 : 2 ** 32;
    const heapKey: number[] = [];
    const heapLeft: number[] = [];
    const heapL: number[] = [];
    const heapR: number[] = [];
    const push = (key: number, left: number, l: number, r: number): void => {
      let i = heapKey.length;
      heapKey.push(key);
      heapLeft.push(left);
      heapL.push(l);
      heapR.push(r);
      while (i > 0) {
        const p = (i - 1) >> 1;
        if (heapKey[p]! <= key) break;
        heapKey[i] = heapKey[p]!;
        heapLeft[i] = heapLeft[p]!;
        heapL[i] = heapL[p]!;
        heapR[i] = heapR[p]!;
        i = p;
      }
      heapKey[i] = key;
      heapLeft[i] = left;
      heapL[i] = l;
      heapR[i] = r;
    };
    const pop = (): void => {
      const lastKey = heapKey.pop()!;
      const lastLeft = heapLeft.pop()!;
      const lastL = heapL.pop()!;
      const lastR = heapR.pop()!;
      const size = heapKey.length;
      if (size === 0) return;
      let i = 0;
      for (;;) {
        let c = 2 * i + 1;
        if (c >= size) break;
        if (c + 1 < size && heapKey[c + 1]! < heapKey[c]!) c++;
        if (heapKey[c]! >= lastKey) break;
        heapKey[i] = heapKey[c]!;
        heapLeft[i] = heapLeft[c]!;
        heapL[i] = heapL[c]!;
        heapR[i] = heapR[c]!;
        i = c;
      }
      heapKey[i] = lastKey;
      heapLeft[i] = lastLeft;
      heapL[i] = lastL;
      heapR[i] = lastR;
    };
    const tryAdd = (left: number): void => {
      if (left < 0) return;
      const right = next[left]!;
      if (right < 0) return;
      const l = sym[left]!;
      const r = sym[right]!;
      if (l < 0 || r < 0) return;
      const rank = this.pairRank.get(l * this.stride + r);
      if (rank === undefined) return;
      push(rank * posBits + left, left, l, r);
    };

    for (let i = 0; i + 1 < n; i++) tryAdd(i);
    while (heapKey.length > 0) {
      const key = heapKey[0]!;
      const left = heapLeft[0]!;
      const l = heapL[0]!;
      const r = heapR[0]!;
      pop();
      const right = next[left]!;
      // Skip outdated entries: either side merged away or changed since this pair was queued.
      if (sym[left] !== l || right < 0 || sym[right] !== r) continue;
      const rank = Math.floor(key / posBits);
      sym[left] = this.mergeResult[rank]!;
      sym[right] = -1;
      const after = next[right]!;
      next[left] = after;
      if (after >= 0) prev[after] = left;
      tryAdd(prev[left]!);
      tryAdd(left);
    }

    const out: number[] = [];
    for (let i = 0; i >= 0 && i < n; i = next[i]!) {
      const id = sym[i]!;
      if (id >= 0 && id < this.vocabSize) {
        out.push(id);
        continue;
      }
      // Not a vocabulary token: llama.cpp emits the tokens of its single bytes; only one-byte
      // (ASCII) strings can match, anything else is dropped — mirrored here.
      const text = id >= 0 ? this.symbolText[id]! : chars[-2 - id]!;
      for (const ch of text) {
        if (ch.length === 1 && ch.charCodeAt(0) < 0x80) {
          const t = this.symbolId.get(ch);
          if (t !== undefined && t < this.vocabSize) out.push(t);
        }
      }
    }
    return out;
  }
}
