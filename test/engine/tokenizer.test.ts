// Tokenizer and chat template against llama.cpp (node-llama-cpp) on the real default model.
import { mkdtempSync, readFileSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { fileURLToPath } from "node:url";
import { getLlama, LlamaLogLevel, type Llama, type LlamaModel, type Token } from "node-llama-cpp";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { readGgufMetadata } from "../../shared/inference/engine/native.ts";
import { resolveModel } from "../../shared/inference/model/resolve.ts";
import { ChatTemplate, ChatTemplateError, validateMessages } from "../../shared/inference/tokenizer/chat-template.ts";
import { GgufTokenizer, TokenizerError, type GgufMetadata } from "../../shared/inference/tokenizer/tokenizer.ts";
import { CORPUS, fuzzCorpus } from "../harness/tokenizer-corpus.ts";

let modelPath = "";
let meta: GgufMetadata;
let tok: GgufTokenizer;
let tmpl: ChatTemplate;
let llama: Llama;
let model: LlamaModel;

beforeAll(async () => {
  modelPath = await resolveModel();
  meta = readGgufMetadata(modelPath);
  tok = GgufTokenizer.fromMetadata(meta);
  tmpl = ChatTemplate.fromMetadata(meta, tok);
  llama = await getLlama({ gpu: false, build: "never", logLevel: LlamaLogLevel.error });
  model = await llama.loadModel({ modelPath });
});

afterAll(async () => {
  await model?.dispose();
  await llama?.dispose();
});

/** node-llama-cpp brands token ids; ours are plain numbers. */
const T = (id: number): Token => id as Token;
const TS = (ids: readonly number[]): Token[] => ids as Token[];

/** What llama.cpp sees of a JS string: lone surrogates become U+FFFD. */
function wellFormed(s: string): string {
  return s.replace(/[\uD800-\uDBFF](?![\uDC00-\uDFFF])|(?<![\uD800-\uDBFF])[\uDC00-\uDFFF]/g, "\uFFFD");
}

describe("tokenizer metadata", () => {
  it("reads vocabulary, special ids and flags like llama.cpp", () => {
    expect(tok.model).toBe("gpt2");
    expect(tok.pre).toBe("smollm");
    expect(tok.vocabSize).toBe(49152);
    expect(tok.vocabSize).toBe(model.fileInfo.metadata.tokenizer.ggml.tokens.length);
    expect(tok.addBos).toBe(false);
    expect(tok.special.bos).toBe(model.tokens.bos);
    expect(tok.special.eos).toBe(model.tokens.eos);
    expect(tok.special.eot).toBe(model.tokens.eot);
    expect(tok.special.nl).toBe(model.tokens.nl);
    // The model's published facts, read from the file rather than hard-coded in the tokenizer.
    expect(tok.special).toMatchObject({ bos: 1, eos: 2, unk: 0, pad: 2, eot: 0, nl: 198 });
    expect(tok.tokenText(1)).toBe("<|im_start|>");
    expect(tok.tokenText(2)).toBe("<|im_end|>");
  });

  it("computes the same end-of-generation set as llama.cpp over the whole vocabulary", () => {
    const theirs: number[] = [];
    for (let i = 0; i < tok.vocabSize; i++) if (model.isEogToken(T(i))) theirs.push(i);
    expect([...tok.eog].sort((a, b) => a - b)).toEqual(theirs);
    expect(theirs).toEqual([0, 2, 4]); // <|endoftext|>, <|im_end|>, <reponame>
  });

  it("marks the same tokens as control tokens", () => {
    const mismatched: number[] = [];
    for (let i = 0; i < tok.vocabSize; i++) if (tok.isControl(i) !== model.getTokenAttributes(T(i)).control) mismatched.push(i);
    expect(mismatched).toEqual([]);
  });

  it("rejects unsupported tokenizer models and pre-tokenizers with clear errors", () => {
    const bad = (over: Record<string, unknown>) => () => GgufTokenizer.fromMetadata({ ...meta, ...over });
    expect(bad({ "tokenizer.ggml.model": "t5" })).toThrow(
      /unsupported tokenizer model "t5" \(Unigram \(T5\)\): ctxbank supports .*"gpt2".*"llama"/,
    );
    // SentencePiece is supported, but this BPE vocabulary has no byte-fallback tokens for it.
    expect(bad({ "tokenizer.ggml.model": "llama" })).toThrow(/no byte-fallback token for byte 0x00/);
    expect(bad({ "tokenizer.ggml.pre": "qwen35" })).toThrow(/unsupported pre-tokenizer "qwen35".*supported: smollm, starcoder/);
    expect(bad({ "tokenizer.ggml.pre": undefined })).toThrow(/no tokenizer\.ggml\.pre/);
    expect(bad({ "tokenizer.ggml.pre": "constructor" })).toThrow(/unsupported pre-tokenizer "constructor"/);
    expect(bad({ "tokenizer.ggml.model": undefined })).toThrow(TokenizerError);
    expect(bad({ "tokenizer.ggml.merges": undefined })).toThrow(/merges is missing/);
    expect(bad({ "tokenizer.ggml.token_type": [1, 2, 3] })).toThrow(/token_type has 3 entries, expected 49152/);
    expect(() => tok.decode([49152])).toThrow(/token id 49152 is out of range/);
  });

  it("supports the GPT-2-only pre-tokenizer family (digits not isolated)", () => {
    const gpt2 = GgufTokenizer.fromMetadata({ ...meta, "tokenizer.ggml.pre": "gpt-2" });
    // smollm: every \p{N} isolated first; gpt-2 family: " 2024" stays one pre-token for BPE.
    expect(tok.preTokenize("in 2024, x² it's  ok\n")).toEqual([
      "in",
      " ",
      "2",
      "0",
      "2",
      "4",
      ",",
      " x",
      "²",
      " it",
      "'s",
      " ",
      " ok",
      "\n",
    ]);
    expect(gpt2.preTokenize("in 2024, x² it's  ok\n")).toEqual(["in", " 2024", ",", " x", "²", " it", "'s", " ", " ok", "\n"]);
    expect(tok.encode(" 2024").map((i) => tok.tokenText(i))).toEqual(["Ġ", "2", "0", "2", "4"]);
    const s = "year 2024 and 3.14 , ok .";
    expect(gpt2.decode(gpt2.encode(s))).toBe("year 2024 and 3.14, ok."); // clean_spaces on for gpt-2
    expect(gpt2.decode(gpt2.encode(s), { cleanSpaces: false })).toBe(s);
    expect(gpt2.cleanSpaces).toBe(true);
    expect(tok.cleanSpaces).toBe(false);
  });
});

describe("encode: identical ids to llama.cpp", () => {
  it("corpus, with and without special-token parsing", () => {
    for (const s of CORPUS) {
      for (const parseSpecial of [true, false]) {
        expect({ s, parseSpecial, ids: tok.encode(s, { parseSpecial }) }).toEqual({
          s,
          parseSpecial,
          ids: model.tokenize(s, parseSpecial),
        });
      }
    }
  });

  it("special tokens are single ids only when parsed", () => {
    const s = "<|im_start|>user\nHello<|im_end|>\n";
    expect(tok.encode(s, { parseSpecial: true })).toEqual([1, 4093, 198, 19556, 2, 198]);
    const plain = tok.encode(s);
    expect(plain).not.toContain(1);
    expect(plain).not.toContain(2);
    expect(tok.decode(plain)).toBe(s);
    expect(tok.encode("", { parseSpecial: true })).toEqual([]);
    expect(tok.encode("x", { addSpecial: true })).toEqual(tok.encode("x")); // add_bos_token = false
  });

  it("1,500 random mixed strings", () => {
    const mismatches: { s: string; ours: number[]; theirs: number[] }[] = [];
    for (const s of fuzzCorpus(1500)) {
      for (const parseSpecial of [true, false]) {
        const ours = tok.encode(s, { parseSpecial });
        const theirs = model.tokenize(s, parseSpecial);
        if (ours.length !== theirs.length || ours.some((v, i) => v !== theirs[i])) mismatches.push({ s, ours, theirs });
      }
    }
    expect(mismatches.slice(0, 5)).toEqual([]);
  });

  it("large real documents (prose, markdown, code)", () => {
    const files = [
      fileURLToPath(new URL("../../node_modules/undici/README.md", import.meta.url)),
      fileURLToPath(new URL("../../shared/inference/tokenizer/tokenizer.ts", import.meta.url)),
      fileURLToPath(new URL("../../shared/inference/model/resolve.ts", import.meta.url)),
    ];
    for (const f of files) {
      const text = readFileSync(f, "utf8");
      const ours = tok.encode(text, { parseSpecial: true });
      const theirs = model.tokenize(text, true);
      expect(ours.length).toBeGreaterThan(1000);
      const firstDiff = ours.findIndex((v, i) => v !== theirs[i]);
      expect({ f, firstDiff, n: ours.length }).toEqual({ f, firstDiff: -1, n: theirs.length });
      expect(tok.decode(ours, { special: true })).toBe(text);
    }
  });
});

describe("decode", () => {
  it("round-trips the corpus and matches llama.cpp's detokenizer", () => {
    for (const s of CORPUS) {
      const ids = tok.encode(s, { parseSpecial: true });
      expect(tok.decode(ids, { special: true })).toBe(wellFormed(s));
      expect(tok.decode(ids, { special: true })).toBe(model.detokenize(TS(ids), true));
      expect(tok.decode(ids)).toBe(model.detokenize(TS(ids), false)); // control tokens hidden by default
      const plain = tok.encode(s);
      expect(tok.decode(plain)).toBe(wellFormed(s));
    }
  });

  it("every single token decodes like llama.cpp (with and without special rendering)", () => {
    const diffs: number[] = [];
    for (let i = 0; i < tok.vocabSize; i++) {
      if (tok.decode([i], { special: true }) !== model.detokenize([T(i)], true)) diffs.push(i);
      if (tok.decode([i]) !== model.detokenize([T(i)], false)) diffs.push(i);
    }
    expect(diffs).toEqual([]);
  });

  it("applies llama.cpp's clean_spaces rules when asked", () => {
    const ids = tok.encode("Hello , world . Is it ? yes ! I ' m fine , it 's ok , we 're here");
    expect(tok.decode(ids)).toBe("Hello , world . Is it ? yes ! I ' m fine , it 's ok , we 're here");
    expect(tok.decode(ids, { cleanSpaces: true })).toBe("Hello, world. Is it? yes! I'm fine, it's ok, we're here");
  });
});

describe("streaming detokenizer", () => {
  it("yields exactly the whole-decode text, token by token", () => {
    for (const s of [...CORPUS, ...fuzzCorpus(200)]) {
      const ids = tok.encode(s, { parseSpecial: true });
      for (const special of [false, true]) {
        const d = tok.createDetokenizer({ special });
        let out = "";
        for (const id of ids) out += d.push(id);
        out += d.flush();
        expect(out).toBe(tok.decode(ids, { special }));
      }
    }
  });

  it("never emits partial characters for emoji split over byte tokens", () => {
    const s = "👨‍👩‍👧‍👦🏳️‍🌈😀 日本";
    const ids = tok.encode(s);
    // Emoji are split into byte tokens that are not valid UTF-8 on their own.
    expect(ids.some((id) => tok.decode([id]).includes("\uFFFD"))).toBe(true);
    const d = tok.createDetokenizer();
    const chunks = ids.map((id) => d.push(id));
    chunks.push(d.flush());
    for (const c of chunks) expect(c).not.toContain("\uFFFD");
    expect(chunks.filter((c) => c === "").length).toBeGreaterThan(0); // bytes were held back
    expect(chunks.join("")).toBe(s);
  });

  it("matches whole decode even for invalid byte sequences, and accepts batches", () => {
    // Single-byte tokens: 0xF0 0x9F (a truncated 4-byte sequence), 'a', a lone continuation byte 0x80,
    // and a dangling lead byte 0xE6 at the end.
    const byteToken = (b: number): number => {
      for (let i = 0; i < tok.vocabSize; i++) {
        const bytes = tok.tokenBytes(i);
        if (bytes.length === 1 && bytes[0] === b) return i;
      }
      throw new Error(`no single-byte token for ${b}`);
    };
    const ids = [0xf0, 0x9f, 0x61, 0x80, 0xe6].map(byteToken);
    const whole = tok.decode(ids);
    const d = tok.createDetokenizer();
    const streamed = d.push(ids.slice(0, 2)) + d.push(ids.slice(2)) + d.flush();
    expect(streamed).toBe(whole);
    expect(whole).toBe("\uFFFDa\uFFFD\uFFFD");
    expect(() => d.push(1)).toThrow(/after flush/);
  });
});

describe("chat template", () => {
  const KNOWN_CHATML =
    "<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n" +
    "<|im_start|>user\nHello<|im_end|>\n<|im_start|>assistant\n";

  // llama.cpp's own C++ Jinja engine, as built into node-llama-cpp's native addon (internal API).
  function renderWithLlamaCpp(messages: unknown[], addGenerationPrompt = true): string {
    const bindings = (llama as unknown as { _bindings: { AddonJinjaRenderer: new (t: string) => { render(v: object): string } } })
      ._bindings;
    expect(typeof bindings.AddonJinjaRenderer).toBe("function");
    const r = new bindings.AddonJinjaRenderer(meta["tokenizer.chat_template"] as string);
    return r.render({ messages, add_generation_prompt: addGenerationPrompt, bos_token: "<|im_start|>", eos_token: "<|im_end|>" });
  }

  it("renders a single user message as the known SmolLM ChatML prompt", () => {
    const msgs = [{ role: "user", content: "Hello" }];
    const out = tmpl.render(msgs);
    expect(out).toBe(KNOWN_CHATML);
    expect(out).toBe(renderWithLlamaCpp(msgs));
    expect(tmpl.bosToken).toBe("<|im_start|>");
    expect(tmpl.eosToken).toBe("<|im_end|>");
  });

  it("renders system/user/assistant/user like llama.cpp's Jinja engine, and tokenizes identically", () => {
    const msgs = [
      { role: "system", content: "You are terse." },
      { role: "user", content: "What is 2+2?" },
      { role: "assistant", content: "4." },
      { role: "user", content: "And 3+3? Answer in 日本語 😀" },
    ];
    const out = tmpl.render(msgs);
    expect(out).toBe(
      "<|im_start|>system\nYou are terse.<|im_end|>\n<|im_start|>user\nWhat is 2+2?<|im_end|>\n" +
        "<|im_start|>assistant\n4.<|im_end|>\n<|im_start|>user\nAnd 3+3? Answer in 日本語 😀<|im_end|>\n<|im_start|>assistant\n",
    );
    expect(out).toBe(renderWithLlamaCpp(msgs));
    const noGen = tmpl.render(msgs, { addGenerationPrompt: false });
    expect(noGen).toBe(renderWithLlamaCpp(msgs, false));
    expect(out.endsWith("<|im_start|>assistant\n")).toBe(true);
    expect(noGen.endsWith("<|im_end|>\n")).toBe(true);

    for (const text of [out, KNOWN_CHATML]) {
      const ids = tok.encode(text, { parseSpecial: true });
      expect(ids).toEqual(model.tokenize(text, true));
      expect(ids[0]).toBe(tok.special.bos);
      expect(ids.filter((i) => i === tok.special.eos).length).toBe(text === out ? 4 : 2);
    }
  });

  it("validates messages with clear errors", () => {
    const err = (m: unknown): string => {
      try {
        tmpl.render(m);
      } catch (e) {
        expect(e).toBeInstanceOf(ChatTemplateError);
        expect((e as ChatTemplateError).code).toBe("invalid_messages");
        return (e as Error).message;
      }
      throw new Error("expected a validation error");
    };
    expect(err("hi")).toMatch(/messages must be an array .* \(got string\)/);
    expect(err([])).toMatch(/at least one message/);
    expect(err([null])).toMatch(/messages\[0\] must be an object .*got null/);
    expect(
      err([
        { role: "user", content: "a" },
        { role: "tool", content: "x" },
      ]),
    ).toMatch(/messages\[1\]\.role must be one of system, user, assistant \(got "tool"\)/);
    expect(err([{ role: "user", content: ["part"] }])).toMatch(/messages\[0\]\.content must be a string \(got array\)/);
    expect(err([{ content: "x" }])).toMatch(/messages\[0\]\.role .*got undefined/);
    expect(validateMessages([{ role: "user", content: "x", name: "bob" }])).toEqual([{ role: "user", content: "x" }]);
  });

  it("reports a missing or broken template clearly", () => {
    const { "tokenizer.chat_template": _drop, ...noTemplate } = meta as Record<string, unknown>;
    expect(() => ChatTemplate.fromMetadata(noTemplate)).toThrow(
      /this model has no chat template \(GGUF key tokenizer\.chat_template is missing\)/,
    );
    expect(() => new ChatTemplate("{% for m in messages %}")).toThrow(/cannot be parsed/);
    const raising = new ChatTemplate("{{ raise_exception('only user messages') }}");
    expect(() => raising.render([{ role: "user", content: "x" }])).toThrow(/failed to render: .*only user messages/);
    // Without a tokenizer, bos/eos texts come straight from the metadata.
    const t2 = ChatTemplate.fromMetadata(meta);
    expect([t2.bosToken, t2.eosToken]).toEqual(["<|im_start|>", "<|im_end|>"]);
  });
});

// ---------------------------------------------------------------------------------------------
// Edge semantics on a tiny synthetic vocabulary, written as a real GGUF and loaded by llama.cpp:
// duplicate merges (first rank wins), leftmost tie-breaking, a merge whose result is not in the
// vocabulary, user-defined / unused / control-looking token types, EOG detection by name, the
// GPT-2-only and starcoder pre-tokenizers, and clean_spaces on decode.

type GgufValue =
  | { t: "str"; v: string }
  | { t: "u32"; v: number }
  | { t: "f32"; v: number }
  | { t: "bool"; v: boolean }
  | { t: "strs"; v: string[] }
  | { t: "i32s"; v: number[] };

/** Minimal GGUF v3 writer: metadata plus a 1-layer all-zero F32 llama so llama.cpp loads it. */
function writeTinyGguf(path: string, kv: Record<string, GgufValue>, nVocab: number): void {
  const parts: Buffer[] = [];
  const u32 = (n: number): void => {
    const b = Buffer.alloc(4);
    b.writeUInt32LE(n);
    parts.push(b);
  };
  const u64 = (n: number): void => {
    const b = Buffer.alloc(8);
    b.writeBigUInt64LE(BigInt(n));
    parts.push(b);
  };
  const str = (x: string): void => {
    const b = Buffer.from(x, "utf8");
    u64(b.length);
    parts.push(b);
  };
  const E = 64;
  const F = 128;
  const tensors: [string, number[]][] = [
    ["token_embd.weight", [E, nVocab]],
    ["output_norm.weight", [E]],
    ["blk.0.attn_norm.weight", [E]],
    ["blk.0.attn_q.weight", [E, E]],
    ["blk.0.attn_k.weight", [E, E]],
    ["blk.0.attn_v.weight", [E, E]],
    ["blk.0.attn_output.weight", [E, E]],
    ["blk.0.ffn_norm.weight", [E]],
    ["blk.0.ffn_gate.weight", [E, F]],
    ["blk.0.ffn_up.weight", [E, F]],
    ["blk.0.ffn_down.weight", [F, E]],
  ];
  const all: Record<string, GgufValue> = {
    "general.architecture": { t: "str", v: "llama" },
    "llama.context_length": { t: "u32", v: 128 },
    "llama.embedding_length": { t: "u32", v: E },
    "llama.block_count": { t: "u32", v: 1 },
    "llama.feed_forward_length": { t: "u32", v: F },
    "llama.attention.head_count": { t: "u32", v: 1 },
    "llama.attention.head_count_kv": { t: "u32", v: 1 },
    "llama.attention.layer_norm_rms_epsilon": { t: "f32", v: 1e-5 },
    "llama.rope.dimension_count": { t: "u32", v: E },
    ...kv,
  };
  parts.push(Buffer.from("GGUF"));
  u32(3);
  u64(tensors.length);
  u64(Object.keys(all).length);
  for (const [k, val] of Object.entries(all)) {
    str(k);
    if (val.t === "str") {
      u32(8);
      str(val.v);
    } else if (val.t === "u32") {
      u32(4);
      u32(val.v);
    } else if (val.t === "f32") {
      u32(6);
      const b = Buffer.alloc(4);
      b.writeFloatLE(val.v);
      parts.push(b);
    } else if (val.t === "bool") {
      u32(7);
      parts.push(Buffer.from([val.v ? 1 : 0]));
    } else if (val.t === "strs") {
      u32(9);
      u32(8);
      u64(val.v.length);
      for (const x of val.v) str(x);
    } else {
      u32(9);
      u32(5);
      u64(val.v.length);
      for (const n of val.v) {
        const b = Buffer.alloc(4);
        b.writeInt32LE(n);
        parts.push(b);
      }
    }
  }
  let offset = 0;
  for (const [name, dims] of tensors) {
    str(name);
    u32(dims.length);
    for (const d of dims) u64(d);
    u32(0); // F32
    u64(offset);
    offset += Math.ceil((dims.reduce((a, b) => a * b, 1) * 4) / 32) * 32;
  }
  const head = Buffer.concat(parts);
  writeFileSync(path, Buffer.concat([head, Buffer.alloc((32 - (head.length % 32)) % 32), Buffer.alloc(offset)]));
}

describe("synthetic vocabulary vs llama.cpp", () => {
  const byteChars: string[] = (() => {
    const direct: number[] = [];
    for (let b = 0x21; b <= 0x7e; b++) direct.push(b);
    for (let b = 0xa1; b <= 0xac; b++) direct.push(b);
    for (let b = 0xae; b <= 0xff; b++) direct.push(b);
    const t = new Array<string>(256);
    for (const b of direct) t[b] = String.fromCodePoint(b);
    let n = 0;
    for (let b = 0; b < 256; b++) t[b] ??= String.fromCodePoint(256 + n++);
    return t;
  })();
  // [text, token_type]; <|eot_id|> and <|file_sep|> are typed NORMAL on purpose (llama.cpp forces
  // them to CONTROL and EOG by name), <tool> is USER_DEFINED, <unused0> UNUSED.
  const specials: [string, number][] = [
    ["<|endoftext|>", 3],
    ["<|im_start|>", 3],
    ["<|im_end|>", 3],
    ["<tool>", 4],
    ["<|eot_id|>", 1],
    ["<|file_sep|>", 1],
    ["<unused0>", 5],
  ];
  // "b c" appears twice: the first (lower) rank must win, so "abc" → a|bc, not ab|c.
  // "x y" merges into "xy", which is not in the vocabulary: emitted as x|y.
  const merges = [
    "b c",
    "a b",
    "b c",
    "a a",
    "Ġ t",
    "h e",
    "t he",
    "Ġt he",
    "Ġ Ġ",
    "1 2",
    "x y",
    "' s",
    "Ġ w",
    "o r",
    "Ġw or",
    "l d",
    "Ġwor ld",
    "Ġ 1",
    "Ċ Ċ",
    "ĠĠ Ġ",
  ];
  const merged = ["bc", "ab", "aa", "Ġt", "he", "the", "Ġthe", "ĠĠ", "12", "'s", "Ġw", "or", "Ġwor", "ld", "Ġworld", "Ġ1", "ĊĊ", "ĠĠĠ"];
  const tokens = [...specials.map((x) => x[0]), ...byteChars, ...merged];
  const types = [...specials.map((x) => x[1]), ...byteChars.map(() => 1), ...merged.map(() => 1)];
  const texts = [
    "abc",
    "aaa",
    "aaaa",
    "the the world",
    " 12 123 x² ١٢",
    "xyxy",
    "it's   a\n\n\nb  \n",
    "<tool>x<|im_end|><|eot_id|><|file_sep|><unused0><|im_start|>",
    "hello , world . it 's ok ' q ' we 're",
  ];

  for (const pre of ["smollm", "gpt-2", "starcoder"]) {
    it(`pre-tokenizer "${pre}": ids, decode, EOG and control flags match`, async () => {
      const dir = mkdtempSync(join(tmpdir(), "ctxbank-tok-"));
      try {
        const file = join(dir, `tiny-${pre}.gguf`);
        writeTinyGguf(
          file,
          {
            "tokenizer.ggml.model": { t: "str", v: "gpt2" },
            "tokenizer.ggml.pre": { t: "str", v: pre },
            "tokenizer.ggml.tokens": { t: "strs", v: tokens },
            "tokenizer.ggml.token_type": { t: "i32s", v: types },
            "tokenizer.ggml.merges": { t: "strs", v: merges },
            "tokenizer.ggml.bos_token_id": { t: "u32", v: 1 },
            "tokenizer.ggml.eos_token_id": { t: "u32", v: 2 },
            "tokenizer.ggml.add_bos_token": { t: "bool", v: false },
          },
          tokens.length,
        );
        const ours = GgufTokenizer.fromGguf(file);
        const theirs = await llama.loadModel({ modelPath: file, vocabOnly: true });
        try {
          const eog: number[] = [];
          for (let i = 0; i < tokens.length; i++) if (theirs.isEogToken(T(i))) eog.push(i);
          expect([...ours.eog].sort((a, b) => a - b)).toEqual(eog);
          expect(eog).toEqual([0, 2, 4, 5]);
          for (let i = 0; i < tokens.length; i++) expect([i, ours.isControl(i)]).toEqual([i, theirs.getTokenAttributes(T(i)).control]);
          for (const s of texts) {
            for (const parseSpecial of [true, false]) {
              const ids = ours.encode(s, { parseSpecial });
              expect({ s, parseSpecial, ids }).toEqual({ s, parseSpecial, ids: theirs.tokenize(s, parseSpecial) });
              expect(ours.decode(ids, { special: parseSpecial })).toBe(theirs.detokenize(TS(ids), parseSpecial));
            }
          }
          const tt = (s: string): string =>
            ours
              .encode(s, { parseSpecial: true })
              .map((i) => ours.tokenText(i))
              .join("|");
          expect(tt("abc")).toBe("a|bc");
          expect(tt("aaa")).toBe("aa|a");
          expect(tt("xyxy")).toBe("x|y|x|y");
          expect(tt("<tool>")).toBe("<tool>");
          expect(ours.encode("<tool>", { parseSpecial: false })).toEqual([3]); // user-defined: always parsed
          expect(tt(" 12")).toBe(pre === "gpt-2" ? "Ġ|12" : "Ġ|1|2");
          const cleaned = ours.decode(ours.encode("hello , world . it 's"));
          expect(cleaned).toBe(pre === "smollm" ? "hello , world . it 's" : "hello, world. it's");
        } finally {
          await theirs.dispose();
        }
      } finally {
        rmSync(dir, { recursive: true, force: true });
      }
    });
  }
});
