// Task generators for the fidelity bench (docs/algorithms.md, evaluation tasks): passkey, 2StageRetr and LongGenBench-style
// long generation. Pure functions: the only outside input is `measure`, which returns the token
// count of a user message as the model will see it (chat template included), so prompts can be
// sized to a target token count with the real tokenizer (tests pass a fake one).

import { PARAGRAPHS } from "../../tools/lib/bench-text.ts";
import { seededRng, uniformInt } from "../../tools/lib/random.ts";

/** Token count of the whole prompt built around `userText` (template + answer prefix included). */
export type Measure = (userText: string) => number;

export interface TaskPrompt {
  task: "passkey" | "multikey" | "2stage" | "longgen";
  /** The user message (wrapped in the chat template by the runner). */
  user: string;
  /** Text appended after the template's assistant header, so the answer starts in the right form. */
  answerPrefix: string;
  /** What the score looks for. */
  answer: string;
  /** Tokens of the prompt as sized (from `measure`). */
  tokens: number;
  meta: Record<string, number | string | number[]>;
}

/**
 * Largest count n in [0, hi] with measure(build(n)) <= target, starting from a linear estimate.
 * `build(n)` must grow with n.
 */
function fitCount(build: (n: number) => string, measure: Measure, target: number, hi = 1 << 16): number {
  const t0 = measure(build(0));
  if (t0 > target) throw new Error(`the prompt without filler already has ${t0} tokens, more than the target ${target}`);
  const t1 = measure(build(1));
  const per = Math.max(1e-6, t1 - t0);
  let n = Math.min(hi, Math.max(0, Math.floor((target - t0) / per)));
  // Correct the estimate: step up while it still fits, down while it does not.
  while (n > 0 && measure(build(n)) > target) n = Math.max(0, n - Math.max(1, Math.ceil((measure(build(n)) - target) / per)));
  while (n < hi && measure(build(n + 1)) <= target) n++;
  return n;
}

// --- Passkey (InfiniteBench style; InfiniteBench's text) ---------------------------------------

export const PASSKEY_FILLER = "The grass is green. The sky is blue. The sun is yellow. Here we go. There and back again.\n";
export const PASSKEY_QUESTION = "What is the pass key?";
export const passkeyNeedle = (key: string) => `The pass key is ${key}. Remember it. ${key} is the pass key.\n`;
export const passkeyPromptText = (context: string, question: string) =>
  `There is an important info hidden inside a lot of irrelevant text. Find it and memorize them. I will quiz you about the important information there.\n\n${context}\n\n${question}`;

/** Passkey context: `n` filler lines with the needle after round(depth * n) of them. */
export function passkeyContext(n: number, depth: number, key: string): string {
  const at = Math.round(Math.min(1, Math.max(0, depth)) * n);
  return PASSKEY_FILLER.repeat(at) + passkeyNeedle(key) + PASSKEY_FILLER.repeat(n - at);
}

export function passkeyTask(opts: { targetTokens: number; depth: number; seed: number; measure: Measure }): TaskPrompt {
  const rng = seededRng(opts.seed);
  const key = String(uniformInt(rng, 10000, 99999));
  const build = (n: number) => passkeyPromptText(passkeyContext(n, opts.depth, key), PASSKEY_QUESTION);
  const n = fitCount(build, opts.measure, opts.targetTokens);
  const user = build(n);
  return {
    task: "passkey",
    user,
    answerPrefix: "The pass key is",
    answer: key,
    tokens: opts.measure(user),
    meta: { depth: opts.depth, fillerLines: n, seed: opts.seed },
  };
}

/** Passkey score: the key appears in the output. */
export function scorePasskey(output: string, key: string): number {
  return output.includes(key) ? 1 : 0;
}

// --- Several needles at once (the passkey task with numbered keys) ------------------------------

export const numberedNeedle = (i: number, key: string) =>
  `The pass key number ${i} is ${key}. Remember it. ${key} is pass key number ${i}.\n`;

/**
 * `keys.length` numbered needles spread evenly through `n` filler lines (needle i after
 * round((i + 0.5) / K * n) of them); the question asks for number `ask` (1-based). A policy must
 * keep the one asked for and not confuse it with its neighbours.
 */
export function multikeyTask(opts: { targetTokens: number; needles: number; seed: number; measure: Measure }): TaskPrompt {
  const rng = seededRng(opts.seed);
  const keys = Array.from({ length: opts.needles }, () => String(uniformInt(rng, 10000, 99999)));
  const ask = 1 + uniformInt(rng, 0, opts.needles - 1);
  const context = (n: number) => {
    let out = "",
      done = 0;
    keys.forEach((key, i) => {
      const at = Math.round(((i + 0.5) / keys.length) * n);
      out += PASSKEY_FILLER.repeat(at - done) + numberedNeedle(i + 1, key);
      done = at;
    });
    return out + PASSKEY_FILLER.repeat(n - done);
  };
  const build = (n: number) => passkeyPromptText(context(n), `What is pass key number ${ask}?`);
  const n = fitCount(build, opts.measure, opts.targetTokens);
  const user = build(n);
  return {
    task: "multikey",
    user,
    answerPrefix: `The pass key number ${ask} is`,
    answer: keys[ask - 1]!,
    tokens: opts.measure(user),
    meta: { needles: opts.needles, ask, keys: keys.map(Number), fillerLines: n, seed: opts.seed },
  };
}

// --- 2StageRetr (OmniKV appendix) ---------------------------------------------------------------

export const COLOURS = [
  "red",
  "green",
  "blue",
  "yellow",
  "orange",
  "purple",
  "pink",
  "brown",
  "black",
  "white",
  "gray",
  "cyan",
  "magenta",
  "indigo",
  "violet",
  "beige",
  "maroon",
  "navy",
  "olive",
  "teal",
  "lime",
  "silver",
  "gold",
] as const;

export interface Dict2Stage {
  entries: Array<[number, string]>;
  a: number;
  b: number;
  key: number;
  colour: string;
}

/** `n` distinct keys in [10, 10 + max(1000, 4n)) with random colours; a + b is one of the keys. */
export function twoStageDict(n: number, seed: number): Dict2Stage {
  if (n < 1) throw new Error("2StageRetr needs at least one entry");
  const rng = seededRng(seed);
  const span = Math.max(1000, 4 * n);
  const keys = new Set<number>();
  while (keys.size < n) keys.add(10 + uniformInt(rng, 0, span - 1));
  const entries: Array<[number, string]> = [...keys].map((k) => [k, COLOURS[uniformInt(rng, 0, COLOURS.length - 1)]!]);
  const [key, colour] = entries[uniformInt(rng, 0, n - 1)]!;
  const a = uniformInt(rng, 1, key - 1);
  return { entries, a, b: key - a, key, colour };
}

export function twoStageText(d: Dict2Stage): string {
  const lines = d.entries.map(([k, c]) => `${k}: ${c}`).join("\n");
  // A worked example on a real entry (not the asked one) shows the two-step answer format.
  const [ek, ec] = d.entries.find(([k]) => k !== d.key) ?? [d.key + 1, "blue"];
  const ea = Math.max(1, Math.floor(ek / 3));
  return (
    `Here is a dictionary that maps numbers to colours:\n\n${lines}\n\n` +
    `Example: for the question ${ea} + ${ek - ea} = ? the answer is "${ea} + ${ek - ea} = ${ek}, and ${ek} is ${ec}."\n\n` +
    `Question: ${d.a} + ${d.b} = ? Compute the sum, then give the colour of that number in the dictionary.`
  );
}

export function twoStageTask(opts: { targetTokens: number; seed: number; measure: Measure }): TaskPrompt {
  const build = (n: number) => twoStageText(twoStageDict(Math.max(1, n), opts.seed));
  // The dict changes with n (same seed), so fit on the entry count, then build once more.
  const n = Math.max(1, fitCount(build, opts.measure, opts.targetTokens, 4096));
  const d = twoStageDict(n, opts.seed);
  const user = twoStageText(d);
  return {
    task: "2stage",
    user,
    answerPrefix: `${d.a} + ${d.b} =`,
    answer: d.colour,
    tokens: opts.measure(user),
    meta: { entries: n, a: d.a, b: d.b, key: d.key, seed: opts.seed },
  };
}

/** Score: the colour appears in the output (word match, case-insensitive). */
export function scoreTwoStage(output: string, colour: string): number {
  return new RegExp(`\\b${colour}\\b`, "i").test(output) ? 1 : 0;
}

/** Stricter: the first colour word in the output is the right one. */
export function firstColour(output: string): string | undefined {
  const m = new RegExp(`\\b(${COLOURS.join("|")})\\b`, "i").exec(output);
  return m?.[1]?.toLowerCase();
}

// --- Long generation (LongGenBench style) -------------------------------------------------------

export interface LongGenQuestion {
  text: string;
  answer: number;
}

const NAMES = ["Anna", "Ben", "Chloe", "David", "Emma", "Felix", "Grace", "Hugo", "Iris", "Jack", "Kate", "Leo"];
const THINGS = ["apples", "books", "coins", "marbles", "pencils", "stamps", "shells", "cards", "eggs", "flowers"];

/** One two-step word problem: a person has x things, gets y more, gives z away. */
export function longGenQuestion(rng: () => number): LongGenQuestion {
  const who = NAMES[uniformInt(rng, 0, NAMES.length - 1)]!;
  const what = THINGS[uniformInt(rng, 0, THINGS.length - 1)]!;
  const x = uniformInt(rng, 5, 60),
    y = uniformInt(rng, 2, 40),
    z = uniformInt(rng, 1, x + y - 1);
  return {
    text: `${who} has ${x} ${what}, buys ${y} more and then gives away ${z}. How many ${what} does ${who} have now?`,
    answer: x + y - z,
  };
}

const worked = (q: string, x: number, y: number, z: number) =>
  `Question: ${q}\nAnswer: First ${x} + ${y} = ${x + y}. Then ${x + y} - ${z} = ${x + y - z}. The answer is ${x + y - z}.`;

export function longGenText(questions: LongGenQuestion[]): string {
  const examples = [
    worked("Mia has 12 shells, buys 7 more and then gives away 5. How many shells does Mia have now?", 12, 7, 5),
    worked("Tom has 30 cards, buys 15 more and then gives away 20. How many cards does Tom have now?", 30, 15, 20),
  ].join("\n\n");
  const list = questions.map((q, i) => `Question ${i + 1}: ${q.text}`).join("\n");
  return (
    `Here are two worked examples.\n\n${examples}\n\n` +
    `Now answer all ${questions.length} questions below, in order. For each question write ` +
    `"Answer <i>:", work it out step by step as in the examples, and end with "The answer is <number>."\n\n${list}`
  );
}

export function longGenTask(opts: { questions: number; seed: number; measure: Measure }): TaskPrompt & { questions: LongGenQuestion[] } {
  const rng = seededRng(opts.seed);
  const questions = Array.from({ length: opts.questions }, () => longGenQuestion(rng));
  const user = longGenText(questions);
  return {
    task: "longgen",
    user,
    answerPrefix: "Answer 1: First",
    answer: questions.map((q) => q.answer).join(","),
    tokens: opts.measure(user),
    meta: { questions: opts.questions, seed: opts.seed },
    questions,
  };
}

/**
 * Long-generation score: the numbers after each "The answer is" in order, compared with the
 * expected answers; the share of the K questions answered right (missing answers count wrong).
 */
export function scoreLongGen(output: string, answers: number[]): { score: number; answered: number } {
  const got = [...output.matchAll(/The answer is\s*(-?\d+)/g)].map((m) => Number(m[1]));
  let right = 0;
  for (let i = 0; i < answers.length; i++) if (got[i] === answers[i]) right++;
  return { score: answers.length === 0 ? 0 : right / answers.length, answered: Math.min(got.length, answers.length) };
}

// --- Multi-round recall (Round Attention) ------------------------------------------------------

/** One chat message of a multi-round conversation. */
export interface RoundMessage {
  role: "user" | "assistant";
  content: string;
}

export interface MultiRoundPrompt {
  task: "rounds";
  /** The conversation: `rounds` earlier exchanges, then the question (a user message). */
  messages: RoundMessage[];
  /** Text appended after the template's assistant header. */
  answerPrefix: string;
  /** The code the answer must contain. */
  answer: string;
  /** The earlier round (0-based) whose exchange states the fact. */
  factRound: number;
}

const ROUND_QUESTIONS = [
  "Tell me about the harbour town in winter.",
  "What was life like for the lighthouse keeper?",
  "Who keeps the town's history?",
  "What happens after a storm on the coast path?",
  "How do people remember a special evening?",
  "What is the market like on a Saturday?",
] as const;

/**
 * A conversation of `rounds` earlier exchanges (ordinary questions answered with
 * `paragraphsPerReply` paragraphs of prose), one of which (`factRound`) states a four-digit locker
 * code; the last question asks for it (SPEC: multi-round recall). Pure: the same seed gives the
 * same conversation.
 */
export function multiRoundTask(opts: { rounds: number; factRound: number; seed: number; paragraphsPerReply: number }): MultiRoundPrompt {
  const { rounds, factRound, paragraphsPerReply } = opts;
  if (rounds < 2 || factRound < 0 || factRound >= rounds)
    throw new Error("multi-round recall needs >= 2 rounds and the fact in one of them");
  const rng = seededRng(opts.seed);
  const code = String(uniformInt(rng, 1000, 9999));
  const offset = uniformInt(rng, 0, PARAGRAPHS.length - 1);
  const messages: RoundMessage[] = [];
  for (let r = 0; r < rounds; r++) {
    const reply = Array.from({ length: paragraphsPerReply }, (_, i) => PARAGRAPHS[(offset + r + i) % PARAGRAPHS.length]!).join("\n\n");
    const question = ROUND_QUESTIONS[(offset + r) % ROUND_QUESTIONS.length]!;
    if (r === factRound)
      messages.push(
        { role: "user", content: `Please remember this: my locker code is ${code}. ${question}` },
        { role: "assistant", content: `Noted: your locker code is ${code}.\n\n${reply}` },
      );
    else messages.push({ role: "user", content: question }, { role: "assistant", content: reply });
  }
  messages.push({ role: "user", content: "What is my locker code?" });
  return { task: "rounds", messages, answerPrefix: "Your locker code is", answer: code, factRound };
}
