// Per-key limits: a token bucket (requests per second with a burst) and a cap on requests in
// flight. Both answer "no" with how long to wait, which becomes the 429's Retry-After.
import type { KeyLimits } from "./api-keys.ts";

interface KeyState {
  tokens: number;
  at: number;
  inFlight: number;
}

export type Admission =
  | { ok: true; release: () => void }
  | { ok: false; code: "rate_limited" | "concurrency_limited"; retryAfterS: number };

export class KeyLimiter {
  private readonly state = new Map<string, KeyState>();

  /**
   * `gates`: how many processes hold the same keys' limits together (the live routers): each
   * enforces its share, a 1/gates part of every limit (rounded up, so no key is ever shut out).
   */
  constructor(
    private readonly now: () => number = () => performance.now(),
    private readonly gates: () => number = () => 1,
  ) {}

  /** Takes one request for `id` under `limits` (this process's share of them), or says why not and when to retry. */
  admit(id: string, whole: KeyLimits): Admission {
    const limits = share(whole, Math.max(1, this.gates()));
    const t = this.now();
    let s = this.state.get(id);
    if (!s) {
      s = { tokens: limits.burst, at: t, inFlight: 0 };
      this.state.set(id, s);
    }
    if (limits.rate > 0) {
      s.tokens = Math.min(limits.burst, s.tokens + ((t - s.at) / 1000) * limits.rate);
      s.at = t;
      if (s.tokens < 1) return { ok: false, code: "rate_limited", retryAfterS: Math.max(1, Math.ceil((1 - s.tokens) / limits.rate)) };
    }
    if (limits.concurrency > 0 && s.inFlight >= limits.concurrency) return { ok: false, code: "concurrency_limited", retryAfterS: 1 };
    if (limits.rate > 0) s.tokens -= 1;
    s.inFlight++;
    let released = false;
    const state = s;
    return {
      ok: true,
      release: () => {
        if (released) return;
        released = true;
        state.inFlight--;
      },
    };
  }

  inFlight(id: string): number {
    return this.state.get(id)?.inFlight ?? 0;
  }
}

/** One of `n` equal parts of a key's limits: rate divided, burst and concurrency rounded up (0 stays unlimited). */
export function share(limits: KeyLimits, n: number): KeyLimits {
  if (n === 1) return limits;
  return {
    rate: limits.rate / n,
    burst: Math.max(1, Math.ceil(limits.burst / n)),
    concurrency: limits.concurrency === 0 ? 0 : Math.max(1, Math.ceil(limits.concurrency / n)),
  };
}
