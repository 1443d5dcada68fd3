// Round Attention across the handoff (docs/algorithms.md, docs/kv-format.md): which of a prompt's
// chunks a decode loads under a `rounds` policy. The layers up to the watershed attend every
// token, so their chunks always move; above it a decode attends only the rounds the prefill picked
// where the prompt ended (engine.pickRounds, the handle's `rounds_picked`) and the current round, so
// the other rounds' chunks for those layers stay in the prefill's shard. A chunk never spans two
// rounds (roundBlocks): a round moves whole or not at all. The decode decides, from its own
// policy: one that does not run the very policy the pick was made under loads every chunk.
import { isDeepStrictEqual } from "node:util";
import { resolvedSpec, type ResolvedPolicy } from "../../shared/inference/policy/request.ts";
import { ApiError } from "../../shared/platform/http/errors.ts";
import type { Handle } from "../../shared/platform/http/wire.ts";
import type { BlockRange } from "./format/seq-io.ts";

/** Where a `rounds` prompt's rounds are, and which layers attend every one. */
export interface RoundsLayout {
  /** Layers up to and including it attend every token. */
  watershedLayer: number;
  /** First token of each round, from 0, strictly increasing; the last one starts the current round. */
  starts: readonly number[];
}

/** The rounds of a resolved policy, when it is Round Attention. */
export function roundsLayoutOf(policy: ResolvedPolicy | undefined): RoundsLayout | undefined {
  return policy?.kind === "rounds" ? { watershedLayer: policy.rounds.watershedLayer, starts: policy.rounds.starts } : undefined;
}

/** A load under a `rounds` policy: the chunks above the watershed of earlier rounds wait for the pick, and only the picked ones are read (reader.ts). */
export interface RoundsLoad {
  layout: RoundsLayout;
  /** The picked rounds, asked once the chunk list has ended (the handle came); undefined: read every chunk. */
  picked(): readonly number[] | undefined;
}

/** What a handle says of Round Attention: the policy the prefill resolved, and its pick. */
export type PickedHandle = Pick<Handle, "resolved_policy" | "rounds_picked">;

/** The load a decode running `policy` does of a handle, which `handle()` gives once it came; undefined unless the policy is rounds. */
export function roundsLoadFor(policy: ResolvedPolicy | undefined, handle: () => PickedHandle | undefined): RoundsLoad | undefined {
  const layout = roundsLayoutOf(policy);
  return layout && { layout, picked: () => pickFor(policy, handle()) };
}

/**
 * The picked rounds a decode running `policy` attends, from the handle: only when it runs the
 * very policy the prefill resolved and picked under (its rounds, watershed and top_k); else
 * undefined, and it loads every chunk and picks for itself.
 */
export function pickFor(policy: ResolvedPolicy | undefined, handle: PickedHandle | undefined): number[] | undefined {
  if (!handle?.rounds_picked || policy?.kind !== "rounds") return undefined;
  return isDeepStrictEqual(resolvedSpec(policy), handle.resolved_policy) ? handle.rounds_picked : undefined;
}

/** Earlier round r of a prompt of n tokens is [bounds[r], bounds[r + 1]); the current round starts at the last bound (as the engine counts them). */
export function earlierRoundBounds(layout: RoundsLayout, nTokens: number): number[] {
  const current = Math.min(layout.starts.at(-1)!, nTokens);
  return [...layout.starts.filter((s) => s < current), current];
}

/** Blocks of at most blockTokens tokens that never span two rounds: the fixed blocks, cut again at every round's start. */
export function roundBlocks(nTokens: number, blockTokens: number, layout: RoundsLayout): BlockRange[] {
  const cuts = new Set<number>(layout.starts.filter((s) => s > 0 && s < nTokens));
  for (let s = blockTokens; s < nTokens; s += blockTokens) cuts.add(s);
  const ends = [...[...cuts].sort((a, b) => a - b), nTokens];
  return ends.map((end, i) => ({ tokenStart: i === 0 ? 0 : ends[i - 1]!, tokenEnd: end }));
}

/**
 * Whether a decode loads the chunk of `layerIds` over `block`: every chunk holding a layer up to
 * the watershed, and above it the current round's and the picked rounds'. `picked` undefined: the
 * pick is not known yet (the prompt is still computing): only what any pick needs. A chunk that
 * spans two rounds (not cut by roundBlocks) is always needed.
 */
export function chunkNeeded(
  layout: RoundsLayout,
  nTokens: number,
  layerIds: readonly number[],
  block: BlockRange,
  picked?: readonly number[],
): boolean {
  if (layerIds.some((l) => l <= layout.watershedLayer)) return true;
  const bounds = earlierRoundBounds(layout, nTokens);
  const round = bounds.findLastIndex((b) => b <= block.tokenStart);
  if (round === bounds.length - 1 || block.tokenEnd > bounds[round + 1]!) return true;
  return picked?.includes(round) ?? false;
}

/** What a decode that loads a picked prompt goes without: the unpicked earlier rounds, in the layers above the watershed. */
export interface LeftOut {
  aboveLayer: number;
  ranges: BlockRange[];
}

/** The unpicked earlier rounds' token ranges; RangeError when `picked` is not ascending indices of earlier rounds. */
export function leftOutOf(layout: RoundsLayout, nTokens: number, picked: readonly number[]): LeftOut {
  const bounds = earlierRoundBounds(layout, nTokens);
  const earlier = bounds.length - 1;
  picked.forEach((r, i) => {
    if (!Number.isInteger(r) || r < 0 || r >= earlier || (i > 0 && r <= picked[i - 1]!))
      throw new RangeError(`rounds_picked must be ascending indices of the ${earlier} rounds before the current one`);
  });
  const ranges: BlockRange[] = [];
  for (let r = 0; r < earlier; r++) if (!picked.includes(r)) ranges.push({ tokenStart: bounds[r]!, tokenEnd: bounds[r + 1]! });
  return { aboveLayer: layout.watershedLayer, ranges };
}

/**
 * Checks a handle's pick where a decode running `policy` would use it (pickFor), before the
 * handle is taken: ApiError 400 when it is not ascending indices of the prompt's earlier rounds.
 */
export function checkPickedRounds(policy: ResolvedPolicy, handle: PickedHandle & Pick<Handle, "prompt_tokens">): void {
  const picked = pickFor(policy, handle);
  if (!picked) return;
  try {
    leftOutOf(roundsLayoutOf(policy)!, handle.prompt_tokens, picked);
  } catch (e) {
    throw new ApiError(400, "invalid_request", `handle.${(e as Error).message}`, "handle.rounds_picked");
  }
}

/** Tokens from 0 that every layer holds after a load that left `leftOut` behind: what a parked session may keep. */
export function wholePrefix(nTokens: number, leftOut: LeftOut | undefined): number {
  return leftOut?.ranges[0]?.tokenStart ?? nTokens;
}
