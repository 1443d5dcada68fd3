// A tokenizer thread: builds the tokenizer and chat template once, from the model metadata the
// pool hands it, then tokenizes prompts (runPromptJob) off the services' event loop.
import Tinypool from "tinypool";
import { ChatTemplate, ChatTemplateError } from "../shared/tokenizer/chat-template.ts";
import { runPromptJob, type PromptJob, type PromptJobResult } from "../shared/tokenizer/prompt-job.ts";
import { GgufTokenizer, type GgufMetadata } from "../shared/tokenizer/tokenizer.ts";

const meta = Tinypool.workerData as GgufMetadata;
const tokenizer = GgufTokenizer.fromMetadata(meta);
let chat: ChatTemplate | undefined;
try {
  chat = ChatTemplate.fromMetadata(meta, tokenizer);
} catch (e) {
  if (!(e instanceof ChatTemplateError && e.code === "NO_TEMPLATE")) throw e;
}

export default function tokenize(job: PromptJob): PromptJobResult {
  return runPromptJob(tokenizer, chat, job);
}
