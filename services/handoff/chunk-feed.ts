// The chunk ids of a streamed handle as the prefill commits them: a queue the decode's readers
// take from while the prefill is still computing. It ends when the handle arrives (its ids are
// the final word: any not announced yet are added) and fails when the prefill does.

export class ChunkFeed {
  private readonly queue: string[] = [];
  private readonly seen = new Set<string>();
  private waiters: Array<{ resolve(id: string | undefined): void; reject(e: unknown): void }> = [];
  private ended = false;
  private failure: { error: unknown } | undefined;

  /** A chunk was committed (repeats are ignored: a chunk is read once). */
  push(id: string): void {
    if (this.ended || this.failure || this.seen.has(id)) return;
    this.seen.add(id);
    const w = this.waiters.shift();
    if (w) w.resolve(id);
    else this.queue.push(id);
  }

  /** The handle arrived: its ids complete the feed. */
  end(ids: readonly string[] = []): void {
    for (const id of ids) this.push(id);
    this.ended = true;
    for (const w of this.waiters.splice(0)) w.resolve(undefined);
  }

  /** The prefill failed: readers waiting (and later) get `error`. */
  fail(error: unknown): void {
    if (this.ended || this.failure) return;
    this.failure = { error };
    for (const w of this.waiters.splice(0)) w.reject(error);
  }

  /** The next chunk id; undefined once the handle has arrived and every id was taken. */
  next(signal: AbortSignal): Promise<string | undefined> {
    const id = this.queue.shift();
    if (id !== undefined) return Promise.resolve(id);
    if (this.failure) return Promise.reject(this.failure.error);
    if (this.ended) return Promise.resolve(undefined);
    if (signal.aborted) return Promise.reject(signal.reason);
    return new Promise((resolve, reject) => {
      const waiter = {
        resolve: (v: string | undefined) => {
          signal.removeEventListener("abort", onAbort);
          resolve(v);
        },
        reject: (e: unknown) => {
          signal.removeEventListener("abort", onAbort);
          reject(e);
        },
      };
      const onAbort = () => {
        this.waiters = this.waiters.filter((w) => w !== waiter);
        reject(signal.reason);
      };
      signal.addEventListener("abort", onAbort, { once: true });
      this.waiters.push(waiter);
    });
  }

  /** Every id announced so far (the handle's included once it ended). */
  get ids(): ReadonlySet<string> {
    return this.seen;
  }
}
