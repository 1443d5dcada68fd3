// The KV handoff inside one process (`ctxbank serve`): the prefill's own sequence passes to the
// decode as it is — its prompt KV, and what the decode policy keeps of the prompt's queries
// (SCOPE's prompt-pool observation window, the OmniKV window selectors' last queries), which the
// shard path ships as the handle's prompt_state. Nothing is exported, checksummed, written to a shard or read back, and
// the decode makes no HTTP call to its own prefill. Prefill and decode in separate processes
// keep the shard path (writer.ts, reader.ts); see docs/architecture.md.
import type { Logger } from "pino";
import type { NativeSequence } from "../../shared/inference/engine/engine.ts";
import type { Handle, PrefillRequest, PromptHandle } from "../../shared/platform/http/wire.ts";
import type { PrefillService } from "../prefill/service.ts";

/** A prefilled prompt as the decode receives it: a handle to load from shards, or the prefill's sequence itself. */
export type Prefilled =
  | { path: "shard"; handle: Handle }
  /** `seq`: room for prompt + max tokens, the policy set before the prompt; the receiver owns it (and releases it). */
  | { path: "in_process"; handle: PromptHandle; seq: NativeSequence };

/** The decode's prefill calls when a prefill service runs in the same process. */
export class InProcessHandoff {
  /** Sequences handed to a decode, since the start. */
  handed = 0;

  constructor(private readonly prefill: PrefillService) {}

  /** Prefills `body` for `tenant` here; the caller owns the returned sequence. */
  async run(body: PrefillRequest, signal: AbortSignal, tenant: string, log: Logger): Promise<Prefilled> {
    const { handle, seq } = await this.prefill.prefillInProcess(body, signal, log, tenant);
    this.handed++;
    return { path: "in_process", handle, seq };
  }
}
