// Token ids to streamed text for one sequence (generate.ts and the decode service both use it):
// complete UTF-8 only, text that could start a stop string held back, and the finish reason
// decided on the token that ends the output (EOG, the token limit, or a stop string).
import { StopStringFilter } from "./stop-strings.ts";
import type { GgufTokenizer } from "./tokenizer/tokenizer.ts";

export type FinishReason = "stop" | "length" | "stop_string";

export interface TextStep {
  /** Newly printable text (may be empty). */
  text: string;
  /** Set on the token that ends the output. */
  finish?: FinishReason;
}

export class TokenTextStream {
  private readonly detok: ReturnType<GgufTokenizer["createDetokenizer"]>;
  private readonly stops: StopStringFilter;
  private generated = 0;
  private emitted = "";
  readonly ids: number[] = [];

  constructor(
    private readonly tokenizer: Pick<GgufTokenizer, "createDetokenizer" | "isEog">,
    readonly maxTokens: number,
    stop: readonly string[],
  ) {
    this.detok = tokenizer.createDetokenizer();
    this.stops = new StopStringFilter(stop);
  }

  get count(): number {
    return this.generated;
  }

  /** All the text emitted so far: the answer as the client saw it (a stop string left out). */
  get text(): string {
    return this.emitted;
  }

  push(id: number): TextStep {
    this.generated++;
    this.ids.push(id);
    const eog = this.tokenizer.isEog(id);
    const last = eog || this.generated >= this.maxTokens;
    let piece = eog ? "" : this.detok.push(id);
    if (last) piece += this.detok.flush();
    const out = this.stops.push(piece);
    const finish: FinishReason | undefined = out.stopped ? "stop_string" : eog ? "stop" : last ? "length" : undefined;
    const text = out.stopped || !finish ? out.text : out.text + this.stops.flush();
    this.emitted += text;
    return finish ? { text, finish } : { text };
  }
}
