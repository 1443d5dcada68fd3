// Workloads: what each job sends. A job is one request (fixed or random lengths, long-document
// QA) or a multi-turn session (rounds of chat with the history growing, think time between).
// Lengths come from seeded draws; prompts are corpus text cut to the drawn token count. A multi-turn
// session names its conversation (`x-session-id`, unique per run and session) unless session ids
// are off, so a server that keeps a conversation's KV between turns (ctxbank's sessions) can.
import type { ChatMessage } from "../../shared/inference/tokenizer/chat-template.ts";
import type { Endpoint, RequestSpec } from "./client.ts";
import type { PromptSource } from "./prompts.ts";
import { randomBytes } from "node:crypto";
import { exponential, standardNormal, uniformInt, type Rng } from "../lib/random.ts";

export type LengthDist =
  | { kind: "fixed"; value: number }
  | { kind: "uniform"; min: number; max: number }
  | { kind: "normal"; mean: number; sd: number; min: number; max: number };

export function drawLength(d: LengthDist, rng: Rng): number {
  if (d.kind === "fixed") return d.value;
  if (d.kind === "uniform") return uniformInt(rng, d.min, d.max);
  return Math.min(d.max, Math.max(d.min, Math.round(d.mean + d.sd * standardNormal(rng))));
}

/** "256", "100-400" (uniform) or "256~64" (normal, mean~sd, clamped to [1, 4·mean]). */
export function parseLengthDist(s: string, what: string): LengthDist {
  const int = (x: string) => {
    const n = Number(x);
    if (!Number.isInteger(n) || n < 1) throw new Error(`${what}: ${JSON.stringify(x)} is not a positive integer`);
    return n;
  };
  const range = /^(\d+)-(\d+)$/.exec(s);
  if (range) {
    const [min, max] = [int(range[1]!), int(range[2]!)];
    if (min > max) throw new Error(`${what}: ${s} has min > max`);
    return { kind: "uniform", min, max };
  }
  const normal = /^(\d+)~(\d+)$/.exec(s);
  if (normal) {
    const mean = int(normal[1]!);
    return { kind: "normal", mean, sd: Number(normal[2]), min: 1, max: 4 * mean };
  }
  return { kind: "fixed", value: int(s) };
}

export const describeLength = (d: LengthDist) =>
  d.kind === "fixed"
    ? String(d.value)
    : d.kind === "uniform"
      ? `uniform ${d.min}-${d.max}`
      : `normal ${d.mean}±${d.sd} in [${d.min}, ${d.max}]`;

export type WorkloadSpec =
  | { kind: "synthetic"; endpoint: Endpoint; input: LengthDist; output: LengthDist; promptFormat: "text" | "ids" }
  | { kind: "longdoc"; endpoint: Endpoint; input: LengthDist; output: LengthDist }
  | {
      kind: "multiturn";
      rounds: number;
      thinkS: number;
      input: LengthDist;
      output: LengthDist;
      /** Send `x-session-id: <run-unique id>` with each round (default on). */
      sessionIds?: boolean;
    };

/** Whether a multi-turn workload names its sessions (on unless turned off). */
export const sendsSessionIds = (w: WorkloadSpec) => w.kind === "multiturn" && w.sessionIds !== false;

export interface SingleJob {
  kind: "single";
  spec: RequestSpec;
  /** Long-document QA: does the answer contain what the document says? */
  check?: (text: string) => boolean;
}

export interface SessionJob {
  kind: "session";
  rounds: number;
  /** The conversation's `x-session-id`, when the workload sends one. */
  sessionId?: string;
  /** Think time before round r (r >= 1), ms. */
  thinkMs: (round: number) => number;
  /** The request of round r given the conversation so far (which it extends). */
  round: (round: number, history: ChatMessage[]) => { spec: RequestSpec; history: ChatMessage[] };
}

export type Job = SingleJob | SessionJob;

export function describeWorkload(w: WorkloadSpec): string {
  const io = `${describeLength(w.input)} in / ${describeLength(w.output)} out`;
  if (w.kind === "synthetic") return `synthetic ${io}, ${w.endpoint}${w.endpoint === "completions" ? `, prompt as ${w.promptFormat}` : ""}`;
  if (w.kind === "longdoc") return `long-document QA ${io}, ${w.endpoint}`;
  return `multi-turn chat, ${w.rounds} rounds, ${describeLength(w.input)} new tokens per user turn / ${describeLength(w.output)} out, think ${w.thinkS} s (exponential), ${sendsSessionIds(w) ? "session ids sent" : "no session ids"}`;
}

const QA_INTRO = "Read the document below and answer the question after it.\n\n";
const QA_QUESTION =
  "\n\nQuestion: what is the reference code given in the document? State the code, then summarise what the document explains, in detail.";
const needle = (code: string) => `\n\nThe reference code for this document is ${code}.\n\n`;

export class WorkloadFactory {
  /** Prefix of this factory's session ids: `lg-<runTag>-<n>`, n counting the sessions it made. */
  readonly runTag: string;
  private sessions = 0;

  constructor(
    readonly spec: WorkloadSpec,
    private readonly prompts: PromptSource,
    opts: { runTag?: string } = {},
  ) {
    this.runTag = opts.runTag ?? randomBytes(4).toString("hex");
    if (!/^[A-Za-z0-9._-]{1,100}$/.test(this.runTag))
      throw new Error(`run tag ${JSON.stringify(this.runTag)}: letters, digits and . _ - only`);
    if (spec.kind === "multiturn" && !(spec.rounds >= 1)) throw new Error("multi-turn needs rounds >= 1");
  }

  /** The next job; all randomness comes from `rng`. */
  next(rng: Rng): Job {
    const w = this.spec;
    if (w.kind === "synthetic") return this.synthetic(w, rng);
    if (w.kind === "longdoc") return this.longdoc(w, rng);
    return this.session(w, rng);
  }

  private measure(endpoint: Endpoint) {
    return endpoint === "chat"
      ? (text: string) => this.prompts.chatTokens([{ role: "user", content: text }])
      : (text: string) => this.prompts.textTokens(text);
  }

  private synthetic(w: Extract<WorkloadSpec, { kind: "synthetic" }>, rng: Rng): SingleJob {
    const n = drawLength(w.input, rng);
    const maxTokens = drawLength(w.output, rng);
    if (w.endpoint === "completions" && w.promptFormat === "ids") {
      return {
        kind: "single",
        spec: { endpoint: "completions", body: { prompt: this.prompts.slice(rng, n), max_tokens: maxTokens }, promptTokensSent: n },
      };
    }
    const { text, tokens } = this.prompts.fit(rng, n, (body) => body, this.measure(w.endpoint));
    const body = w.endpoint === "chat" ? { messages: [{ role: "user", content: text }] } : { prompt: text };
    return { kind: "single", spec: { endpoint: w.endpoint, body: { ...body, max_tokens: maxTokens }, promptTokensSent: tokens } };
  }

  private longdoc(w: Extract<WorkloadSpec, { kind: "longdoc" }>, rng: Rng): SingleJob {
    const n = drawLength(w.input, rng);
    const maxTokens = drawLength(w.output, rng);
    const code = `${uniformInt(rng, 100, 999)}-${uniformInt(rng, 1000, 9999)}`;
    const depth = rng();
    // The needle goes at a random depth of the document (by characters of the cut).
    const build = (doc: string) => {
      const at = Math.floor(doc.length * depth);
      return QA_INTRO + doc.slice(0, at) + needle(code) + doc.slice(at) + QA_QUESTION + (w.endpoint === "completions" ? "\nAnswer:" : "");
    };
    const { text, tokens } = this.prompts.fit(rng, n, build, this.measure(w.endpoint));
    const body = w.endpoint === "chat" ? { messages: [{ role: "user", content: text }] } : { prompt: text };
    return {
      kind: "single",
      spec: { endpoint: w.endpoint, body: { ...body, max_tokens: maxTokens }, promptTokensSent: tokens },
      check: (answer) => answer.includes(code),
    };
  }

  private session(w: Extract<WorkloadSpec, { kind: "multiturn" }>, rng: Rng): SessionJob {
    // Draw everything up front so a session's content does not depend on timing.
    const turns = Array.from({ length: w.rounds }, () => {
      const n = drawLength(w.input, rng);
      const ids = this.prompts.slice(rng, n);
      return {
        user: `${this.prompts.decode(ids)}\n\nWhat does this part say? Answer briefly.`,
        tokens: n,
        maxTokens: drawLength(w.output, rng),
      };
    });
    const think = turns.map(() => exponential(rng, 1 / Math.max(1e-9, w.thinkS)) * 1000);
    // Numbered in the order sessions are made (not drawn from rng: the content stays the same with ids on or off).
    const sessionId = sendsSessionIds(w) ? `lg-${this.runTag}-${this.sessions++}` : undefined;
    const headers = sessionId ? { "x-session-id": sessionId } : undefined;
    return {
      kind: "session",
      rounds: w.rounds,
      ...(sessionId ? { sessionId } : {}),
      thinkMs: (r) => (w.thinkS > 0 ? think[r]! : 0),
      round: (r, history) => {
        const t = turns[r]!;
        const messages: ChatMessage[] = [...history, { role: "user", content: t.user }];
        return {
          spec: {
            endpoint: "chat",
            body: { messages, max_tokens: t.maxTokens },
            promptTokensSent: this.prompts.chatTokens(messages),
            ...(headers ? { headers } : {}),
          },
          history: messages,
        };
      },
    };
  }
}
