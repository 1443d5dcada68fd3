// Texts the tokenizers are compared with llama.cpp on: the corpus (code, Unicode from many scripts,
// emoji, whitespace runs, numbers, special-token text inside user text, empty string, long words)
// and deterministic random strings mixing the same classes.

export const CORPUS: string[] = [
  "",
  "Hello world",
  "Hello, world! How are you?",
  // digits, long numbers, Unicode numbers (llama.cpp isolates every \p{N})
  " 123",
  "3.14159265358979323846 and 12345678901234567890 and 0x7fffffff",
  "Call 555-0199 by 2024-12-31T23:59:59Z, total $1,234.56 (−7%)",
  "x²+y³=z¹ ½ ¾ Ⅻ ١٢٣ ５６７ ⑤",
  // contractions
  "I'm sure you can't, won't, shouldn't; they're, we've, he'll, she'd. IT'S ALL'S 'S",
  "'s 't 're 've 'm 'll 'd ' s''",
  // punctuation
  "!!!???... ,,, ;; :: -- —— … «quoted» „low“ ¿qué? ¡sí!",
  // runs of spaces / newlines / tabs / CR
  "   leading spaces",
  "trailing spaces   ",
  "a  b   c    d     e",
  "\n\n\nx\n",
  "para one\n\npara two\n\n\n\npara three",
  "\t\ttabs\tand\t \tmixed",
  "\r\n\r\nwindows\r\nlines\r\n",
  " \n \n  \n",
  "x \u2028y\u2029z",
  // exotic whitespace: NEL is White_Space for llama.cpp, BOM/ZWSP are not
  "a\u0085b \u00a0c\u3000d\ufeffe\u200bf\u202fg",
  "x \u0085\u0085 y\ufeff\ufeff! \u0085z \ufeff.\u00a0\u00a0w",
  // accented letters
  "Café déjà vu, naïve façade, Ærøskøbing, Straße, İstanbul, ǅemal",
  "e\u0301 (combining) vs é",
  // CJK / other scripts
  "日本語のテキスト、中文。한국어 텍스트",
  "Привет, мир! Γειά σου κόσμε. שלום עולם. مرحبا بالعالم. नमस्ते दुनिया",
  // emoji incl. ZWJ sequences, skin tones, flags, variation selectors
  "emoji 😀👍🏽 👨‍👩‍👧‍👦 🏳️‍🌈 🇫🇷 ❤️ ✌🏿 🧑‍💻",
  "😀😀😀😀😀",
  // code
  "function f(x) { return x*2; } // comment\n\tif (a<=b && c!==d) { arr[i++] = `t${v}`; }",
  "def main():\n    print(\"hi\")  # py\n\n    return {'a': [1, 2, 3]}\n",
  '#include <stdio.h>\nint main(void){printf("%d\\n", 42);}',
  "SELECT * FROM t WHERE id IN (1,2,3) AND name LIKE '%x%';",
  "https://example.com/path?q=1&r=two#frag user@example.org",
  // special tokens, partial specials, adjacent specials
  "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n",
  "<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n",
  "<|endoftext|><reponame>x<file_sep>y<filename>z<gh_stars>",
  "<|im_start|<|im_end|>|> <|im_start|> <|im_end|",
  "text<|im_end|><|im_end|>text",
  // byte-level look-alikes, control characters, lone surrogate (becomes U+FFFD)
  "Ġ Ċ ĉ",
  "\u0000 nul \u0007 bell \u001b[0m",
  "lone \ud800 surrogate",
  "\u{10FFFF} \u{E000} private use",
  "ab".repeat(300),
  " ".repeat(64) + "x" + "\n".repeat(17),
];

/**
 * More texts for the other tokenizers: their special-token texts written by a user, SentencePiece's
 * "▁" and byte-token look-alikes, Llama 3's case-insensitive contractions and digit groups, runs that
 * user-defined whitespace tokens match (Gemma 3), CR-only lines, punctuation before newlines.
 */
export const MORE_CORPUS: string[] = [
  " ",
  "  ",
  "\n",
  "Hello",
  " Hello",
  "<bos><start_of_turn>user\nHi<end_of_turn>\n<start_of_turn>model\n",
  "<s>[INST] hi [/INST] ok</s><s>",
  "<|begin_of_text|><|start_header_id|>user<|end_header_id|>\n\nHi<|eot_id|>",
  "<|im_start|>system\nYou are a helpful assistant<|im_end|>\n<|endoftext|><|fim_prefix|>",
  "<unk> <pad> <mask> <eos> </s> <unused0> <unused6241> [multimodal] <start_of_image>",
  "<table><tr><td>1</td></tr></table> <h1>T</h1> <b>b</b><i>i</i><s>s</s>",
  "▁ ▁▁ a▁b ▁▁▁x <0x41><0x0A> <0xZZ>",
  "IT'S I'LL YOU'RE WE'VE I'M HE'D DON'T 'S 'T 'Re 'vE 'lL",
  "1 12 123 1234 12345 123456 1234567 ١٢٣٤ 12,345.6789 0.000001 1e-10",
  "    four\n        eight\n\t\ttab\n \n  \n\n\n\n\n",
  "line1\rline2\r\rline3\r\n\r\n",
  "end.\n\nNext!\r\n?? \n...\n\n",
  " ".repeat(100) + "x" + "\t".repeat(40) + "y" + "\n".repeat(40) + "z",
  "a".repeat(1000),
  "Donaudampfschifffahrtsgesellschaftskapitänswitwe".repeat(20),
  "😀".repeat(100),
  "\u{1F9D1}\u{1F3FD}\u200D\u{1F4BB} \u{E0067}\u{E0062} \uFFFD \uFFFE",
  "Ελληνικά Ἀθῆναι ქართული Հայերեն ትግርኛ ᏣᎳᎩ ꦗꦮ 𐌰𐌱 ᚠᚢᚦ",
  "ภาษาไทย ລາວ ខ្មែរ မြန်မာ བོད་ཡིག ᠮᠣᠩᠭᠣᠯ 한글 ㄅㄆㄇ",
];

// Deterministic random strings mixing all the classes above (and `extra` pieces).
export function fuzzCorpus(n: number, extra: readonly string[] = []): string[] {
  let seed = 0x2545f491;
  const rnd = (): number => {
    seed ^= seed << 13;
    seed ^= seed >>> 17;
    seed ^= seed << 5;
    return (seed >>> 0) / 2 ** 32;
  };
  const pool = [
    " ",
    "  ",
    "\n",
    "\t",
    "\r\n",
    "a",
    "Z",
    "é",
    "ß",
    "'",
    "'s",
    "'ll",
    "0",
    "7",
    "١",
    "²",
    "½",
    ".",
    ",",
    "!",
    "?",
    "-",
    "_",
    "(",
    ")",
    "{",
    "}",
    "<",
    ">",
    "|",
    "日",
    "本",
    "한",
    "😀",
    "👍🏽",
    "👨‍👩‍👧",
    "\u200d",
    "\ufe0f",
    "\u0301",
    "<|im_start|>",
    "<|im_end|>",
    "<|endoftext|>",
    "Ġ",
    "\u00a0",
    "\u3000",
    "\u0085",
    "the",
    " the",
    "ing",
    "http://x.y/z?q=1",
    "\\",
    '"',
    "#",
    "$",
    "%",
    "^",
    "&",
    "*",
    "🏳️‍🌈",
    "\u{1F9D1}",
    ...extra,
  ];
  const out: string[] = [];
  for (let k = 0; k < n; k++) {
    const len = 1 + Math.floor(rnd() * 30);
    let s = "";
    for (let i = 0; i < len; i++) s += pool[Math.floor(rnd() * pool.length)];
    out.push(s);
  }
  return out;
}
