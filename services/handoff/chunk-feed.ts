// A queue of chunks that readers take from while it is still being filled: the chunk ids of a
// streamed handle as the prefill commits them (it ends when the handle arrives: its ids are the
// final word, any not announced yet are added, and fails when the prefill does), the ids of a
// client's handle all at once (ChunkFeed.of), or the leased chunks of a load waiting for a reader.

export class ChunkFeed<T = string> {
  private readonly queue: T[] = [];
  private readonly pushed = new Set<T>();
  private waiters: Array<{ resolve(item: T | undefined): void; reject(e: unknown): void }> = [];
  private ended = false;
  private failure: { error: unknown } | undefined;

  /** A feed that holds `items` and has ended. */
  static of<T>(items: readonly T[]): ChunkFeed<T> {
    const feed = new ChunkFeed<T>();
    feed.end(items);
    return feed;
  }

  /** A chunk came (repeats are ignored: a chunk is read once). */
  push(item: T): void {
    if (this.ended || this.failure || this.pushed.has(item)) return;
    this.pushed.add(item);
    const w = this.waiters.shift();
    if (w) w.resolve(item);
    else this.queue.push(item);
  }

  /** Nothing more will come but `items` (for chunk ids: the handle's, which complete the feed). */
  end(items: readonly T[] = []): void {
    for (const item of items) this.push(item);
    this.ended = true;
    for (const w of this.waiters.splice(0)) w.resolve(undefined);
  }

  /** The source failed: readers waiting (and later) get `error`. */
  fail(error: unknown): void {
    if (this.ended || this.failure) return;
    this.failure = { error };
    for (const w of this.waiters.splice(0)) w.reject(error);
  }

  /** Ended, and every chunk taken. */
  get done(): boolean {
    return this.ended && this.queue.length === 0;
  }

  /** The next chunk; undefined once the feed has ended and every chunk was taken. */
  next(signal: AbortSignal): Promise<T | undefined> {
    if (this.queue.length > 0) return Promise.resolve(this.queue.shift());
    if (this.failure) return Promise.reject(this.failure.error);
    if (this.ended) return Promise.resolve(undefined);
    if (signal.aborted) return Promise.reject(signal.reason);
    return new Promise((resolve, reject) => {
      const waiter = {
        resolve: (v: T | undefined) => {
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

  /** Every chunk there is now (waiting for the first); undefined once the feed has ended and every chunk was taken. */
  async take(signal: AbortSignal): Promise<T[] | undefined> {
    const first = await this.next(signal);
    return first === undefined ? undefined : [first, ...this.queue.splice(0)];
  }

  /** Every chunk pushed so far (the end's included once it ended). */
  get seen(): ReadonlySet<T> {
    return this.pushed;
  }
}
