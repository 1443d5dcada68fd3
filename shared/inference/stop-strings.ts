// Stop strings over streamed text (used by text-stream.ts).

/**
 * Incremental stop-string matching over streamed text. `push` returns the text that is safe to
 * emit: everything except a tail that could still grow into a stop string. Once a stop string is
 * found, the text is cut right before it and `stopped` is true (the earliest match wins).
 */
export class StopStringFilter {
  private pending = "";

  constructor(private readonly stops: readonly string[]) {}

  push(text: string): { text: string; stopped: boolean } {
    const p = this.pending + text;
    let cut = -1;
    for (const s of this.stops) {
      const i = p.indexOf(s);
      if (i >= 0 && (cut < 0 || i < cut)) cut = i;
    }
    if (cut >= 0) {
      this.pending = "";
      return { text: p.slice(0, cut), stopped: true };
    }
    const keep = this.heldLength(p);
    this.pending = p.slice(p.length - keep);
    return { text: p.slice(0, p.length - keep), stopped: false };
  }

  /** The held-back tail, released when the output ends without a stop string. */
  flush(): string {
    const p = this.pending;
    this.pending = "";
    return p;
  }

  /** Length of the longest suffix of `p` that is a proper prefix of some stop string. */
  private heldLength(p: string): number {
    let best = 0;
    for (const s of this.stops) {
      for (let k = Math.min(s.length - 1, p.length); k > best; k--) {
        if (p.endsWith(s.slice(0, k))) {
          best = k;
          break;
        }
      }
    }
    return best;
  }
}
