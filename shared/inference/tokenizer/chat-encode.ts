/**
 * A conversation's token ids with control tokens only where the chat template writes them, and
 * its Round Attention rounds, in one pass.
 *
 * The template is rendered once with every message content replaced by a unique sentinel; the
 * output splits at the sentinels into the template's own text (control tokens recognised) and the
 * messages' contents (control-token text stays plain text, as llama.cpp's `parse_special=false`
 * does for user text). Plain text still runs on across those boundaries before it is pre-tokenized,
 * so an ordinary chat gets exactly the ids of `encode(render(messages), { parseSpecial: true })`.
 *
 * A template that changes what it is given (`| trim`, branches on the content) does not reproduce
 * the real rendering from the split; then the whole rendering is encoded as before, which is safe
 * only while no content holds a control token's text, so such a request is refused.
 */
import { randomUUID } from "node:crypto";
import { ChatTemplateError, validateMessages, type ChatMessage, type ChatTemplate } from "./chat-template.ts";
import type { GgufTokenizer, PromptPart } from "./tokenizer.ts";

export interface ChatEncodeOptions {
  /** Append the assistant turn header (default true). */
  addGenerationPrompt?: boolean;
  /** Stop once more than this many ids are made (see EncodeOptions.maxTokens). */
  maxTokens?: number;
  /** Also find the rounds: the system part, then one per user message. */
  rounds?: boolean;
}

export interface ChatEncoding {
  ids: number[];
  /**
   * With `rounds`: round 0 from token 0 (the template's system part when it writes one before the
   * first user turn; else the first exchange), then the first token of each user message's turn
   * (a later one's where the conversation rendered up to that message ends). null when the template does not
   * render earlier turns as a prefix of the whole, or a boundary falls inside a token: the request
   * must then give the starts itself.
   */
  roundStarts?: number[] | null;
}

export function encodeChat(tok: GgufTokenizer, chat: ChatTemplate, input: unknown, opts: ChatEncodeOptions = {}): ChatEncoding {
  const messages = validateMessages(input);
  const addGenerationPrompt = opts.addGenerationPrompt ?? true;
  const real = chat.render(messages, { addGenerationPrompt });
  const nonce = randomUUID();
  const sentinel = (i: number) => `\u0000ctxbank:${nonce}:${i}\u0000`;
  const masked = messages.map((m, i) => ({ role: m.role, content: sentinel(i) }));
  let maskedText: string;
  try {
    maskedText = chat.render(masked, { addGenerationPrompt });
  } catch {
    return encodeWhole(tok, real, messages, opts); // a template that looks into the contents
  }

  // Template text and contents, in order; where each content ends in the real text.
  const parts: PromptPart[] = [];
  const contentEnd: number[][] = messages.map(() => []);
  const templateAfter: string[] = messages.map(() => "");
  const re = new RegExp(`\u0000ctxbank:${nonce}:(\\d+)\u0000`, "g");
  let from = 0;
  let at = 0;
  let last = -1;
  for (let m = re.exec(maskedText); m !== null; m = re.exec(maskedText)) {
    const i = Number(m[1]);
    const between = maskedText.slice(from, m.index);
    parts.push({ text: between, parseSpecial: true });
    if (last >= 0) templateAfter[last] = between;
    at += between.length;
    parts.push({ text: messages[i]!.content, parseSpecial: false });
    at += messages[i]!.content.length;
    contentEnd[i]!.push(at);
    from = m.index + m[0].length;
    last = i;
  }
  const tail = maskedText.slice(from);
  parts.push({ text: tail, parseSpecial: true });
  if (last >= 0) templateAfter[last] = tail;

  if (parts.map((p) => p.text).join("") !== real) return encodeWhole(tok, real, messages, opts);

  const marks = opts.rounds ? roundMarks(chat, masked, maskedText, messages, contentEnd, templateAfter, sentinel) : null;
  const bos = needsBos(tok, real);
  const limit = opts.maxTokens === undefined ? {} : { maxTokens: opts.maxTokens - bos.length };
  const enc = tok.encodeParts(parts, { ...limit, marks: marks ?? [] });
  const ids = [...bos, ...enc.ids];
  if (!opts.rounds) return { ids };
  if (marks === null || enc.marks.some((n) => n < 0)) return { ids, roundStarts: null };
  const starts = [0, ...enc.marks.map((n) => n + bos.length)];
  return { ids, roundStarts: starts.every((s, i) => i === 0 || s > starts[i - 1]!) ? starts : null };
}

/** The model's BOS id when it asks for one and the text does not begin with it. */
export function needsBos(tok: GgufTokenizer, text: string): number[] {
  const bos = tok.special.bos;
  return tok.addBos && bos !== undefined && !text.startsWith(tok.tokenText(bos)) ? [bos] : [];
}

/**
 * Where each round starts, as offsets into the real text: the first user turn (after the
 * template's system part, when the template writes one), then each later user message's turn, at
 * the end of the conversation rendered up to that message. That rendering is made once per role of the message
 * before it (at most three renders, not one per message); its text after that message's content
 * (the turn's footer) must begin the template text that follows the same role's content elsewhere.
 */
function roundMarks(
  chat: ChatTemplate,
  masked: ChatMessage[],
  maskedText: string,
  messages: ChatMessage[],
  contentEnd: number[][],
  templateAfter: string[],
  sentinel: (i: number) => string,
): number[] | null {
  const footers = new Map<string, string>();
  const marks: number[] = [];
  let header: string | undefined;
  for (let i = 1; i < messages.length; i++) {
    if (messages[i]!.role !== "user") continue;
    const prev = i - 1;
    if (contentEnd[prev]!.length !== 1) return null; // a template that drops or repeats a message
    const role = messages[prev]!.role;
    let footer = footers.get(role);
    if (footer === undefined) {
      let upTo: string;
      try {
        upTo = chat.render(masked.slice(0, i), { addGenerationPrompt: false });
      } catch {
        return null; // a template that refuses a conversation ending there
      }
      const s = sentinel(prev);
      const end = upTo.indexOf(s);
      if (!maskedText.startsWith(upTo) || end < 0) return null;
      footer = upTo.slice(end + s.length);
      footers.set(role, footer);
    }
    if (!templateAfter[prev]!.startsWith(footer)) return null;
    marks.push(contentEnd[prev]![0]! + footer.length);
    // The user turn's header (what the template writes between the footer and a user message's
    // content), seen here, also opens the first user turn: the text before it is the template's
    // system part (the system prompt, a default one, or just the start), a round of its own.
    header ??= templateAfter[prev]!.slice(footer.length);
  }
  const first = messages.findIndex((m) => m.role === "user");
  if (header === undefined || first < 0 || contentEnd[first]!.length !== 1) return marks;
  const contentStart = contentEnd[first]![0]! - messages[first]!.content.length;
  const before = maskedText.slice(0, maskedText.indexOf(sentinel(first)));
  const system = contentStart - header.length;
  return before.endsWith(header) && system > 0 && (marks.length === 0 || system < marks[0]!) ? [system, ...marks] : marks;
}

/** The old whole-string encoding, for templates that transform contents; refuses contents that hold control-token text. */
function encodeWhole(tok: GgufTokenizer, real: string, messages: ChatMessage[], opts: ChatEncodeOptions): ChatEncoding {
  for (let i = 0; i < messages.length; i++) {
    const forged = tok.controlTextIn(messages[i]!.content);
    if (forged !== undefined) {
      throw new ChatTemplateError(
        "invalid_messages",
        `messages[${i}].content contains the control token ${JSON.stringify(forged)}, which this model's chat template cannot keep apart from its own; remove it`,
      );
    }
  }
  const bos = needsBos(tok, real);
  const ids = [
    ...bos,
    ...tok.encode(real, { parseSpecial: true, ...(opts.maxTokens === undefined ? {} : { maxTokens: opts.maxTokens - bos.length }) }),
  ];
  return opts.rounds ? { ids, roundStarts: null } : { ids };
}
