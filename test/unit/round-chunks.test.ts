// Round Attention across the handoff (services/handoff/round-chunks.ts): chunks never span two
// rounds, a decode loads the layers up to the watershed whole and above it only the current and
// the picked rounds, and a load that left rounds behind still passes the coverage check while
// one that lost anything else does not.
import { describe, expect, it } from "vitest";
import { coverageProblem } from "../../services/handoff/format/seq-io.ts";
import {
  chunkNeeded,
  earlierRoundBounds,
  leftOutOf,
  pickFor,
  roundBlocks,
  wholePrefix,
  type RoundsLayout,
} from "../../services/handoff/round-chunks.ts";
import type { ResolvedPolicy } from "../../shared/inference/policy/request.ts";

// Rounds [0, 100), [100, 250), [250, 300), the current round from 300; 400 tokens, 6 layers.
const layout: RoundsLayout = { watershedLayer: 2, starts: [0, 100, 250, 300] };
const N = 400;
const LOWER = [0, 1, 2];
const UPPER = [3, 4, 5];
const SIX = { nLayer: 6, slidingLayers: [], slidingWindow: 0 };

describe("round chunks", () => {
  it("blocks are the fixed blocks cut again at every round's start", () => {
    expect(roundBlocks(N, 128, layout).map((b) => [b.tokenStart, b.tokenEnd])).toEqual([
      [0, 100],
      [100, 128],
      [128, 250],
      [250, 256],
      [256, 300],
      [300, 384],
      [384, 400],
    ]);
    expect(earlierRoundBounds(layout, N)).toEqual([0, 100, 250, 300]);
    // A prompt that ends inside a round: that round is the current one.
    expect(earlierRoundBounds(layout, 280)).toEqual([0, 100, 250, 280]);
  });

  it("a decode needs every layer up to the watershed, and above it the current and the picked rounds", () => {
    const blocks = roundBlocks(N, 128, layout);
    const needed = (layers: number[], picked?: number[]) =>
      blocks.filter((b) => chunkNeeded(layout, N, layers, b, picked)).map((b) => b.tokenStart);
    expect(needed(LOWER)).toEqual(blocks.map((b) => b.tokenStart));
    expect(needed(UPPER)).toEqual([300, 384]); // the pick not known yet: the current round only
    expect(needed(UPPER, [1])).toEqual([100, 128, 300, 384]);
    expect(needed(UPPER, [0, 2])).toEqual([0, 250, 256, 300, 384]);
    // A chunk spanning two rounds (written without the cuts) is always needed.
    expect(chunkNeeded(layout, N, UPPER, { tokenStart: 0, tokenEnd: 128 }, [])).toBe(true);
  });

  it("coverage: the unpicked rounds may be missing above the watershed, nothing else", () => {
    const blocks = roundBlocks(N, 128, layout);
    const picked = [1];
    const read = [
      ...blocks.map((b) => ({ layerIds: LOWER, ...b })),
      ...blocks.filter((b) => chunkNeeded(layout, N, UPPER, b, picked)).map((b) => ({ layerIds: UPPER, ...b })),
    ];
    const leftOut = leftOutOf(layout, N, picked);
    expect(leftOut).toEqual({
      aboveLayer: 2,
      ranges: [
        { tokenStart: 0, tokenEnd: 100 },
        { tokenStart: 250, tokenEnd: 300 },
      ],
    });
    expect(coverageProblem(read, SIX, N, leftOut)).toBeNull();
    expect(coverageProblem(read, SIX, N)).toMatch(/layer 3: tokens 0..100 are missing/);
    // A picked round missing, or a lower layer missing a left-out round, is still a gap.
    expect(coverageProblem(read, SIX, N, leftOutOf(layout, N, [0, 1]))).toMatch(/layer 3: tokens 0..100 are missing/);
    expect(
      coverageProblem(
        read.filter((c) => !(c.layerIds === LOWER && c.tokenStart === 0)),
        SIX,
        N,
        leftOut,
      ),
    ).toMatch(/layer 0: tokens 0..100 are missing/);
    expect(wholePrefix(N, leftOut)).toBe(0);
    expect(wholePrefix(N, leftOutOf(layout, N, [0]))).toBe(100);
    expect(wholePrefix(N, leftOutOf(layout, N, [0, 1, 2]))).toBe(N);
  });

  it("refuses a pick that is not ascending earlier rounds", () => {
    expect(() => leftOutOf(layout, N, [3])).toThrow(/ascending indices of the 3 rounds before the current one/);
    expect(() => leftOutOf(layout, N, [1, 0])).toThrow(/ascending/);
    expect(() => leftOutOf(layout, N, [0.5])).toThrow(/ascending/);
  });

  it("a decode uses the pick only under the very policy the prefill resolved", () => {
    const policy: ResolvedPolicy = { kind: "rounds", rounds: { watershedLayer: 2, starts: [0, 100, 250, 300], topK: 1 } };
    const resolved = { kind: "rounds", rounds: { watershed_layer: 2, starts: [0, 100, 250, 300], top_k: 1 } };
    const handle = { resolved_policy: resolved, rounds_picked: [0, 1] };
    expect(pickFor(policy, handle)).toEqual([0, 1]);
    expect(pickFor(policy, undefined)).toBeUndefined();
    expect(pickFor(policy, { resolved_policy: resolved })).toBeUndefined();
    expect(pickFor({ kind: "full" } as ResolvedPolicy, handle)).toBeUndefined();
    const other = (rounds: Record<string, unknown>) => ({
      ...handle,
      resolved_policy: { kind: "rounds", rounds: { ...resolved.rounds, ...rounds } },
    });
    expect(pickFor(policy, other({ top_k: 2 }))).toBeUndefined();
    expect(pickFor(policy, other({ watershed_layer: 3 }))).toBeUndefined();
    expect(pickFor(policy, other({ starts: [0, 100, 250] }))).toBeUndefined();
  });
});
