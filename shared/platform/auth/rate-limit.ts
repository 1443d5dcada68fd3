// Per-key limits: a token bucket (requests per second with a burst) and a cap on requests in
// flight. Both answer "no" with how long to wait, which becomes the 429's Retry-After.
import type { KeyLimits } from "./api-keys.ts";

interface KeyState {
  tokens: number;
  at: number;
  inFlight: number;
}

export type Admission = { ok: true; release: () => void } | { ok: false; code: "rate_limited" | "concurrency_limited"; retryAfterS: number };

export class KeyLimiter {
  private readonly state = new Map<string, KeyState>();

  constructor(private readonly now: () => number = () => performance.now()) {}

  /** Takes one request for `id` under `limits`, or says why not and when to retry. */
  admit(id: string, limits: KeyLimits): Admission {
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
