// Chained hashes of a conversation's messages: entry i is the sha256 of entry i-1 and message i's
// role and text, so it names messages 0..i together. A decode records them when it parks a session
// (the turn's messages and its answer); the router hashes an incoming request's messages the same
// way and asks the registry which session holds the longest prefix of them. No tokenizer is needed:
// the router runs without a model.
import { createHash } from "node:crypto";

export interface HashedMessage {
  role: string;
  content: string;
}

/** Messages past this many are not hashed: the longest prefix the router can match. */
export const MAX_HASHED_MESSAGES = 1_024;

export function messageHashes(messages: readonly HashedMessage[]): string[] {
  const out: string[] = [];
  let previous = "ctxbank-messages-v1";
  for (const m of messages.slice(0, MAX_HASHED_MESSAGES)) {
    // JSON keeps the three parts apart whatever characters they hold.
    previous = createHash("sha256")
      .update(JSON.stringify([previous, m.role, m.content]))
      .digest("hex");
    out.push(previous);
  }
  return out;
}

/** A raw (non-chat) prompt hashes as one message of its own role, so it only ever matches itself. */
export function promptMessages(prompt: { messages?: readonly HashedMessage[]; prompt?: string }): HashedMessage[] {
  return prompt.messages ? [...prompt.messages] : prompt.prompt !== undefined ? [{ role: "prompt", content: prompt.prompt }] : [];
}
