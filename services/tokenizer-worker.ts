// A tokenizer thread: builds the tokenizer and chat template once, from the model metadata the
// pool hands it, then tokenizes prompts (runPromptJob) off the services' event loop.
import Tinypool from "tinypool";
import { ChatTemplate } from "../shared/inference/tokenizer/chat-template.ts";
import { runPromptJob, type PromptJob, type PromptJobResult } from "../shared/inference/tokenizer/prompt-job.ts";
import { GgufTokenizer, type GgufMetadata } from "../shared/inference/tokenizer/tokenizer.ts";

const meta = Tinypool.workerData as GgufMetadata;
const tokenizer = GgufTokenizer.fromMetadata(meta);
const chat = ChatTemplate.fromMetadataIfAny(meta, tokenizer);

export default function tokenize(job: PromptJob): PromptJobResult {
  return runPromptJob(tokenizer, chat, job);
}
