// A multi-round chat for Round Attention's watershed: one round states a fact, the others are
// ordinary exchanges, and a final question asks for the fact. Returns the token ids of the whole
// prompt and the token range of each earlier round (user message + assistant reply).
import type { ChatMessage, ChatTemplate } from "../../shared/inference/tokenizer/chat-template.ts";
import type { GgufTokenizer } from "../../shared/inference/tokenizer/tokenizer.ts";
import { PARAGRAPHS } from "../../tools/lib/bench-text.ts";

const EXCHANGES: Array<[string, string]> = [
  ["Can you tell me something about harbour towns?", PARAGRAPHS[0]!],
  ["What does a lighthouse keeper do all day?", PARAGRAPHS[1]!],
  ["Please remember this: my locker code is 4271.", "Noted. Your locker code is 4271."],
  ["Who writes local history books?", PARAGRAPHS[2]!],
  ["What happens when storms damage a coastal path?", PARAGRAPHS[3]!],
  ["How do people remember a special evening?", PARAGRAPHS[4]!],
  ["Give me a tip for a rainy weekend.", "Visit the library, borrow a long novel and make a pot of tea."],
  ["What should I cook tonight?", "A simple vegetable soup with fresh bread is warm and quick to make."],
];

export function multiRoundConversation(tokenizer: GgufTokenizer, chat: ChatTemplate) {
  const encode = (messages: ChatMessage[], generation: boolean) =>
    tokenizer.encode(chat.render(messages, { addGenerationPrompt: generation }), { parseSpecial: true });
  const messages: ChatMessage[] = [];
  const rounds: Array<[number, number]> = [];
  for (const [user, assistant] of EXCHANGES) {
    const start = messages.length === 0 ? 0 : encode(messages, false).length;
    messages.push({ role: "user", content: user }, { role: "assistant", content: assistant });
    rounds.push([start, encode(messages, false).length]);
  }
  messages.push({ role: "user", content: "What is my locker code?" });
  return { ids: encode(messages, true), rounds };
}
