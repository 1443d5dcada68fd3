// Staging buffers for chunk reads that land in memory of the reader's own (HTTP), kept from one
// load to the next. A fresh multi-MiB buffer per worker per load is external memory V8 answers
// with a full mark-compact about once per load: a quarter or more of the reader's CPU per GB at
// 4K tokens on the 2-core box (bench/handoff); a reused buffer costs nothing after the first load.

export interface Scratch {
  buf: Buffer;
}

export class ScratchPool {
  private readonly free: Buffer[] = [];

  /** Keeps at most `keep` buffers (one per read in flight is enough for one load at a time). */
  constructor(private readonly keep: number) {}

  /** A worker's scratch: a kept buffer when there is one (grown by the reader when too small). */
  take(): Scratch {
    return { buf: this.free.pop() ?? Buffer.allocUnsafe(0) };
  }

  /** Gives the buffer back; only once nothing writes into it any more (its reads have settled). */
  put(scratch: Scratch): void {
    if (scratch.buf.byteLength > 0 && this.free.length < this.keep) this.free.push(scratch.buf);
    scratch.buf = Buffer.allocUnsafe(0);
  }
}
