// Service-level objectives for one request and its verdict against them. A request meets an SLO
// when its figure is at most the target; `all` is every configured SLO met at once, which is
// what DistServe's goodput counts (requests per second that meet both TTFT and TPOT).

export type SloName = "ttft" | "tpot" | "e2e";
export const SLO_NAMES: readonly SloName[] = ["ttft", "tpot", "e2e"];

/** Targets in milliseconds; an absent one is not an objective. */
export interface SloTargets {
  ttftMs?: number | undefined;
  tpotMs?: number | undefined;
  e2eMs?: number | undefined;
}

/** What a finished request is judged on (milliseconds). tpotMs is null with fewer than 2 tokens. */
export interface SloInput {
  ttftMs: number;
  tpotMs: number | null;
  e2eMs: number;
}

/** true = met, per configured SLO, and `all`. */
export type SloVerdict = Partial<Record<SloName, boolean>> & { all: boolean };

const TARGET: Record<SloName, keyof SloTargets> = { ttft: "ttftMs", tpot: "tpotMs", e2e: "e2eMs" };

/** The SLOs that have a target, in a fixed order. */
export function configuredSlos(targets: SloTargets): SloName[] {
  return SLO_NAMES.filter((name) => targets[TARGET[name]] !== undefined);
}

/**
 * Judges one finished request. A request with one token has no time per output token, so it
 * cannot miss the TPOT objective (it is met). With no SLO configured, `all` is true.
 */
export function evaluateSlo(targets: SloTargets, t: SloInput): SloVerdict {
  const each: Partial<Record<SloName, boolean>> = {};
  let all = true;
  for (const name of configuredSlos(targets)) {
    const target = targets[TARGET[name]]!;
    const value = name === "ttft" ? t.ttftMs : name === "e2e" ? t.e2eMs : t.tpotMs;
    const met = value === null || value <= target;
    each[name] = met;
    all &&= met;
  }
  return { ...each, all };
}
