/**
 * Pre-tokenization: splitting plain text into the pieces BPE merges within, like llama.cpp.
 *
 * Three splits, each ported from llama.cpp's hand-written `unicode_regex_split_custom_*` rather
 * than a JS regex, because their whitespace set is Unicode White_Space (not JS `\s`) and their
 * classes are llama.cpp's:
 *   - GPT-2 ('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+), for
 *     the `smollm`/`starcoder`/… family after every `\p{N}` code point is isolated;
 *   - Llama 3 ((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}|
 *      ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+);
 *   - Qwen 2: Llama 3's with single digits (\p{N} for \p{N}{1,3}).
 */

/** How a pre-tokenizer splits text (see the module comment). */
export type PreTokenizerSplit = "gpt2" | "digits-gpt2" | "llama3" | "qwen2";

export interface PreTokenizerFamily {
  split: PreTokenizerSplit;
  /** llama.cpp's per-pre `clean_spaces` decode flag */
  cleanSpaces: boolean;
  /** llama.cpp's per-pre default for adding BOS (the file's tokenizer.ggml.add_bos_token wins) */
  addBos: boolean;
  /** llama.cpp's `ignore_merges`: a piece that is a vocabulary token as a whole is that token, unmerged */
  ignoreMerges: boolean;
}

const family = (split: PreTokenizerSplit, cleanSpaces: boolean, addBos = false, ignoreMerges = false): PreTokenizerFamily => ({
  split,
  cleanSpaces,
  addBos,
  ignoreMerges,
});
const LLAMA3 = family("llama3", true, true, true);
const QWEN2 = family("qwen2", false);

// `tokenizer.ggml.pre` values and their families (llama.cpp `llama_vocab::impl::load`).
const PRE_TOKENIZERS: Record<string, PreTokenizerFamily> = {
  smollm: family("digits-gpt2", false),
  starcoder: family("digits-gpt2", true),
  refact: family("digits-gpt2", true),
  "command-r": family("digits-gpt2", false),
  codeshell: family("digits-gpt2", true),
  exaone: family("digits-gpt2", true),
  "minerva-7b": family("digits-gpt2", true),
  "gpt-2": family("gpt2", true),
  "phi-2": family("gpt2", true),
  "jina-es": family("gpt2", true),
  "jina-de": family("gpt2", true),
  gigachat: family("gpt2", true),
  "a.x-4.0": family("gpt2", true),
  mellum: family("gpt2", true),
  "modern-bert": family("gpt2", true),
  exaone4: family("gpt2", true),
  mpt: family("gpt2", true),
  olmo: family("gpt2", true),
  jais: family("gpt2", true),
  trillion: family("gpt2", false),
  "granite-docling": family("gpt2", false),
  "llama-bpe": LLAMA3,
  llama3: LLAMA3,
  "llama-v3": LLAMA3,
  qwen2: QWEN2,
  "deepseek-r1-qwen": QWEN2,
};

export const SUPPORTED_PRE_TOKENIZERS: readonly string[] = Object.keys(PRE_TOKENIZERS);

/** The family of a `tokenizer.ggml.pre` value, or undefined when it is not supported. */
export function preTokenizerFamily(pre: string): PreTokenizerFamily | undefined {
  // Own keys only: a file naming "constructor" or "toString" must not match Object.prototype.
  return Object.hasOwn(PRE_TOKENIZERS, pre) ? PRE_TOKENIZERS[pre] : undefined;
}

/** Split well-formed text into pre-token pieces, each as code points. */
export function preTokenize(text: string, split: PreTokenizerSplit): number[][] {
  const pieces: number[][] = [];
  eachPreToken(text, split, (p) => {
    pieces.push(p);
    return true;
  });
  return pieces;
}

/**
 * Calls `emit` with each pre-token piece of well-formed text, in order, until it returns false:
 * the split stops there, so a caller that has enough tokens does no work on the rest of the text.
 */
export function eachPreToken(text: string, split: PreTokenizerSplit, emit: (piece: number[]) => boolean): void {
  const cps = codePoints(text);
  if (split === "llama3" || split === "qwen2") {
    splitLlama3(cps, split === "llama3" ? 3 : 1, emit);
    return;
  }
  if (split === "gpt2") {
    splitGpt2(cps, 0, cps.length, emit);
    return;
  }
  // Every \p{N} code point is a piece of its own (llama.cpp regex "\\p{N}"); the runs between are
  // GPT-2 split.
  let run = 0;
  for (let i = 0; i < cps.length; i++) {
    if (flagsOf(cps[i]!) !== F_NUMBER) continue;
    if (i > run && !splitGpt2(cps, run, i, emit)) return;
    if (!emit([cps[i]!])) return;
    run = i + 1;
  }
  if (run < cps.length) splitGpt2(cps, run, cps.length, emit);
}

/** String.fromCodePoint without spreading huge arrays onto the stack. */
export function fromCodePoints(cps: readonly number[]): string {
  if (cps.length <= 4096) return String.fromCodePoint(...cps);
  let s = "";
  for (let i = 0; i < cps.length; i += 4096) s += String.fromCodePoint(...cps.slice(i, i + 4096));
  return s;
}

function codePoints(s: string): number[] {
  const out: number[] = [];
  for (const ch of s) out.push(ch.codePointAt(0)!);
  return out;
}

/** Replace lone surrogates with U+FFFD (what UTF-8 conversion does on the llama.cpp side). */
export function wellFormed(s: string): string {
  return s.replace(/[\uD800-\uDBFF](?![\uDC00-\uDFFF])|(?<![\uD800-\uDBFF])[\uDC00-\uDFFF]/g, "\uFFFD");
}

// ---------------------------------------------------------------------------------------------
// Code point classes (llama.cpp unicode_cpt_flags): letter = \p{L}, number = \p{N},
// whitespace = Unicode White_Space property.

const WHITESPACE = new Set<number>([
  0x09, 0x0a, 0x0b, 0x0c, 0x0d, 0x20, 0x85, 0xa0, 0x1680, 0x2000, 0x2001, 0x2002, 0x2003, 0x2004, 0x2005, 0x2006, 0x2007, 0x2008, 0x2009,
  0x200a, 0x2028, 0x2029, 0x202f, 0x205f, 0x3000,
]);
const RE_LETTER = /^\p{L}$/u;
const RE_NUMBER = /^\p{N}$/u;

const F_LETTER = 1;
const F_NUMBER = 2;
const F_WHITESPACE = 4;
const F_OTHER = 8; // any other assigned or unassigned code point (flags != 0 in llama.cpp)

const ASCII_FLAGS: Uint8Array = (() => {
  const t = new Uint8Array(128);
  for (let c = 0; c < 128; c++) t[c] = classify(c);
  return t;
})();

function classify(cp: number): number {
  if (WHITESPACE.has(cp)) return F_WHITESPACE;
  const ch = String.fromCodePoint(cp);
  if (RE_LETTER.test(ch)) return F_LETTER;
  if (RE_NUMBER.test(ch)) return F_NUMBER;
  return F_OTHER;
}

const flagCache = new Map<number, number>();
function flagsOf(cp: number): number {
  if (cp < 128) return ASCII_FLAGS[cp]!;
  let f = flagCache.get(cp);
  if (f === undefined) {
    f = classify(cp);
    if (flagCache.size < 65536) flagCache.set(cp, f);
  }
  return f;
}

// ---------------------------------------------------------------------------------------------
// The splits

const APOS = 0x27;
const SPACE = 0x20;
const CR = 0x0d;
const LF = 0x0a;
const c_s = 0x73,
  c_t = 0x74,
  c_m = 0x6d,
  c_d = 0x64,
  c_r = 0x72,
  c_e = 0x65,
  c_v = 0x76,
  c_l = 0x6c;

/**
 * Port of llama.cpp `unicode_regex_split_custom_gpt2` over the fragment cps[start, end). Returns
 * false when `emit` asked to stop.
 */
function splitGpt2(cps: number[], start: number, end: number, emit: (piece: number[]) => boolean): boolean {
  const cpt = (p: number): number => (p < end ? cps[p]! : -1);
  const flags = (p: number): number => (p < end ? flagsOf(cps[p]!) : 0);
  let prev = start;
  let go = true;
  const add = (p: number): number => {
    const len = p - prev;
    if (len > 0) go = emit(cps.slice(prev, p));
    prev = p;
    return len;
  };
  for (let pos = start; pos < end && go; ) {
    const c = cps[pos]!;
    const f = flagsOf(c);
    // 's|'t|'re|'ve|'m|'ll|'d
    if (c === APOS && pos + 1 < end) {
      const n1 = cps[pos + 1]!;
      if (n1 === c_s || n1 === c_t || n1 === c_m || n1 === c_d) {
        pos += add(pos + 2);
        continue;
      }
      if (pos + 2 < end) {
        const n2 = cps[pos + 2]!;
        if ((n1 === c_r && n2 === c_e) || (n1 === c_v && n2 === c_e) || (n1 === c_l && n2 === c_l)) {
          pos += add(pos + 3);
          continue;
        }
      }
    }
    let f2 = c === SPACE ? flags(pos + 1) : f;
    // <space>?\p{L}+
    if (f2 === F_LETTER) {
      pos += c === SPACE ? 1 : 0;
      while (flags(pos) === F_LETTER) pos++;
      add(pos);
      continue;
    }
    // <space>?\p{N}+
    if (f2 === F_NUMBER) {
      pos += c === SPACE ? 1 : 0;
      while (flags(pos) === F_NUMBER) pos++;
      add(pos);
      continue;
    }
    // <space>?[^\s\p{L}\p{N}]+
    if (f2 === F_OTHER) {
      pos += c === SPACE ? 1 : 0;
      while (f2 === F_OTHER) f2 = flags(++pos);
      add(pos);
      continue;
    }
    let nws = 0;
    while (flags(pos + nws) === F_WHITESPACE) nws++;
    // \s+(?!\S)
    if (nws > 1 && cpt(pos + nws) !== -1) {
      pos += nws - 1;
      add(pos);
      continue;
    }
    // \s+
    if (nws > 0) {
      pos += nws;
      add(pos);
      continue;
    }
    add(++pos); // no match (unreachable with the classes above, kept for parity)
  }
  return go;
}

/** ASCII letters lower-cased; llama.cpp's `unicode_tolower` maps no other code point to s, t, r, e, v, m, l or d. */
const lowerAscii = (c: number): number => (c >= 0x41 && c <= 0x5a ? c + 0x20 : c);

/**
 * Port of llama.cpp `unicode_regex_split_custom_llama3` (maxDigits 3) and `…_qwen2` (maxDigits 1)
 * over the whole of `cps`.
 */
function splitLlama3(cps: number[], maxDigits: number, emit: (piece: number[]) => boolean): void {
  const end = cps.length;
  const cpt = (p: number): number => (p < end ? cps[p]! : -1);
  const flags = (p: number): number => (p < end ? flagsOf(cps[p]!) : 0);
  let prev = 0;
  let go = true;
  const add = (p: number): number => {
    const len = p - prev;
    if (len > 0 && go) go = emit(cps.slice(prev, p));
    prev = p;
    return len;
  };
  for (let pos = 0; pos < end && go; ) {
    const c = cps[pos]!;
    const f = flagsOf(c);
    // (?i:'s|'t|'re|'ve|'m|'ll|'d)
    if (c === APOS && pos + 1 < end) {
      const n1 = lowerAscii(cps[pos + 1]!);
      if (n1 === c_s || n1 === c_t || n1 === c_m || n1 === c_d) {
        pos += add(pos + 2);
        continue;
      }
      if (pos + 2 < end) {
        const n2 = lowerAscii(cps[pos + 2]!);
        if ((n1 === c_r && n2 === c_e) || (n1 === c_v && n2 === c_e) || (n1 === c_l && n2 === c_l)) {
          pos += add(pos + 3);
          continue;
        }
      }
    }
    // [^\r\n\p{L}\p{N}]?\p{L}+
    if (c !== CR && c !== LF && f !== F_NUMBER && (f === F_LETTER || flags(pos + 1) === F_LETTER)) {
      pos++;
      while (flags(pos) === F_LETTER) pos++;
      add(pos);
      continue;
    }
    // \p{N}{1,maxDigits}: a run of numbers in pieces of maxDigits from its start
    if (f === F_NUMBER) {
      let ini = pos;
      while (flags(pos) === F_NUMBER) {
        if (++pos - ini >= maxDigits) {
          add(pos);
          ini = pos;
        }
      }
      add(pos);
      continue;
    }
    // <space>?[^\s\p{L}\p{N}]+[\r\n]*  (a lone trailing space lands here too, as in llama.cpp)
    let f2 = c === SPACE ? flags(pos + 1) : f;
    if (f2 === F_OTHER || f2 === 0) {
      pos += c === SPACE ? 1 : 0;
      while (f2 === F_OTHER) f2 = flags(++pos);
      while (cpt(pos) === CR || cpt(pos) === LF) pos++;
      add(pos);
      continue;
    }
    let nws = 0;
    let afterLastNewline = 0;
    while (flags(pos + nws) === F_WHITESPACE) {
      const c2 = cps[pos + nws]!;
      if (c2 === CR || c2 === LF) afterLastNewline = pos + nws + 1;
      nws++;
    }
    // \s*[\r\n]+
    if (afterLastNewline > 0) {
      pos = afterLastNewline;
      add(pos);
      continue;
    }
    // \s+(?!\S)
    if (nws > 1 && cpt(pos + nws) !== -1) {
      pos += nws - 1;
      add(pos);
      continue;
    }
    // \s+
    if (nws > 0) {
      pos += nws;
      add(pos);
      continue;
    }
    add(++pos); // no match (unreachable with the classes above, kept for parity)
  }
}
