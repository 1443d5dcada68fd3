// The KV handoff inside one process (`ctxbank serve`): the prefill's own sequence passes to the
// decode as it is — its prompt KV, and what the decode policy keeps of the prompt's queries
// (SCOPE's prompt-pool observation window, the OmniKV window selectors' last queries), which the
// shard path ships as the handle's prompt_state. Nothing is exported, checksummed, written to a
// shard or read back, and the decode makes no HTTP call to its own prefill. A client's handle
// names chunks in a shard, so it is read as across processes (shard-handoff.ts); see
// docs/architecture.md.
import type { Logger } from "pino";
import type { NativeSequence } from "../../shared/inference/engine/engine.ts";
import type { PrefillRequest } from "../../shared/platform/http/wire.ts";
import type { ResolvedPolicy } from "../../shared/inference/policy/request.ts";
import type { Handle, PromptHandle } from "./handle.ts";
import type {
  Handover,
  HandoffReader,
  InProcessPrefill,
  KvFailureChoice,
  LoadedKv,
  OwnRequest,
  ReaderStatus,
  SequencePlan,
} from "./handoff.ts";

export class InProcessHandoff implements HandoffReader {
  /** Sequences handed to a decode, since the start. */
  private handed = 0;

  constructor(
    private readonly prefiller: InProcessPrefill,
    /** For clients' handles, and the prefill calls nobody makes here. */
    private readonly shard: HandoffReader,
  ) {}

  get prefillCalls() {
    return this.shard.prefillCalls;
  }

  /** Prefills `body` here (as the decode planned it, if it did), into the sequence the decode will own. */
  async prefill(body: PrefillRequest, own: OwnRequest, signal: AbortSignal, log: Logger): Promise<Handover> {
    const { handle, seq, policy } = await this.prefiller.prefillInProcess(body, own.plan, signal, log, own.tenant);
    this.handed++;
    return new InProcessHandover(handle, policy, seq);
  }

  accept(handle: Handle, onKvFailure: KvFailureChoice): Handover {
    return this.shard.accept(handle, onKvFailure);
  }

  status(): ReaderStatus {
    return { ...this.shard.status(), in_process: this.handed };
  }

  close(): Promise<void> {
    return this.shard.close();
  }
}

/** The prefill's sequence: room for prompt + max tokens, the policy set before the prompt. */
class InProcessHandover implements Handover {
  readonly path = "in_process";
  readonly ringBatch = undefined; // the prefill's sequence
  private seq: NativeSequence | undefined;

  constructor(
    readonly handle: PromptHandle,
    readonly policy: ResolvedPolicy,
    seq: NativeSequence,
  ) {
    this.seq = seq;
  }

  sequence(plan: SequencePlan): NativeSequence {
    const seq = this.seq!;
    this.seq = undefined;
    if (seq.capacity < plan.capacity || seq.nPast !== this.handle.prompt_tokens) {
      seq.release();
      throw new Error(
        `the in-process prefill handed over a sequence of ${seq.nPast}/${seq.capacity} tokens for ${this.handle.prompt_tokens} + room to ${plan.capacity}`,
      );
    }
    return seq;
  }

  /** The KV is in the sequence already: nothing moved. */
  async load(): Promise<LoadedKv> {
    return { kv: { transport: "in_process", chunks: 0, bytes: 0, ms: 0, recomputed: false }, warnings: [] };
  }

  async dispose(): Promise<void> {
    this.seq?.release();
    this.seq = undefined;
  }
}
