/**
 * One prompt to tokenize, as the services hand it to a tokenizer thread: plain text (a completion's
 * prompt, user text: control tokens are not parsed) or a conversation (rendered with the chat
 * template, control tokens only from the template). Encoding stops just past `maxTokens`.
 * A plain function of serialisable data, so it runs the same inline or in a worker thread.
 */
import { ChatTemplateError, noChatTemplate, type ChatTemplate } from "./chat-template.ts";
import { encodeChat, needsBos } from "./chat-encode.ts";
import type { GgufTokenizer } from "./tokenizer.ts";

export type PromptJob =
  | { kind: "text"; text: string; maxTokens: number }
  | { kind: "chat"; messages: unknown; maxTokens: number; addGenerationPrompt?: boolean; rounds?: boolean };

/** `ids` holds at most maxTokens + 1 ids: more than maxTokens means the prompt is longer. */
export type PromptJobResult =
  | { ok: true; ids: number[]; roundStarts?: number[] | null }
  | { ok: false; param: "messages" | "prompt"; message: string };

export function runPromptJob(tok: GgufTokenizer, chat: ChatTemplate | undefined, job: PromptJob): PromptJobResult {
  if (job.kind === "text") {
    // User text never yields control tokens, so the model's BOS (when it wants one) is always added.
    const bos = needsBos(tok, "");
    return { ok: true, ids: [...bos, ...tok.encode(job.text, { maxTokens: job.maxTokens - bos.length })] };
  }
  if (!chat) return { ok: false, param: "messages", message: noChatTemplate().message };
  try {
    const enc = encodeChat(tok, chat, job.messages, {
      maxTokens: job.maxTokens,
      ...(job.addGenerationPrompt === undefined ? {} : { addGenerationPrompt: job.addGenerationPrompt }),
      ...(job.rounds ? { rounds: true } : {}),
    });
    return { ok: true, ...enc };
  } catch (e) {
    if (e instanceof ChatTemplateError) return { ok: false, param: "messages", message: e.message };
    throw e;
  }
}
