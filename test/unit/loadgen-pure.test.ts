// tools/loadgen's pure parts: arrival processes (seeded), percentiles, SLO attainment and
// goodput, multi-turn figures (per round, ctxbank's route/placement/reuse reports), the rate
// sweep's search on synthetic attainment curves, the SSE parser, length distributions, option
// validation and the loopback guard.
import { describe, expect, it } from "vitest";
import { openLoopSchedule } from "../../tools/loadgen/arrivals.ts";
import { checkTarget, isLoopback } from "../../tools/loadgen/host-guard.ts";
import { UsageError } from "../../shared/inference/errors.ts";
import { parseCli } from "../../tools/loadgen/options.ts";
import { exponential, seededRng, standardNormal } from "../../tools/lib/random.ts";
import { SseParser } from "../../tools/loadgen/sse.ts";
import { parseRoute } from "../../tools/loadgen/client.ts";
import { roundsTable, serverCountsLine } from "../../tools/loadgen/report.ts";
import { cdfPoints, latencySummary, meetsSlo, percentile, roundStats, runStats, serverCounts } from "../../tools/loadgen/stats.ts";
import { sweepMaxRate } from "../../tools/loadgen/sweep.ts";
import { sweepDrainS } from "../../tools/loadgen/sweep-run.ts";
import type { RequestResult } from "../../tools/loadgen/types.ts";
import { drawLength, parseLengthDist } from "../../tools/loadgen/workloads.ts";

describe("arrival processes", () => {
  it("Poisson: exponential gaps with mean 1/rate, Poisson counts, reproducible per seed", () => {
    const rate = 5;
    const times = openLoopSchedule({ kind: "poisson", rate }, 20_000, Infinity, seededRng(7));
    expect(times).toHaveLength(20_000);
    const gaps = times.map((t, i) => (i === 0 ? t : t - times[i - 1]!) / 1000);
    const mean = gaps.reduce((s, g) => s + g, 0) / gaps.length;
    const sd = Math.sqrt(gaps.reduce((s, g) => s + (g - mean) ** 2, 0) / (gaps.length - 1));
    expect(mean).toBeGreaterThan(0.2 * 0.97);
    expect(mean).toBeLessThan(0.2 * 1.03);
    expect(sd / mean).toBeGreaterThan(0.96); // exponential: coefficient of variation 1
    expect(sd / mean).toBeLessThan(1.04);
    // Kolmogorov-Smirnov against Exp(rate), 99% critical value 1.63/sqrt(n).
    const sorted = [...gaps].sort((a, b) => a - b);
    let d = 0;
    sorted.forEach((g, i) => {
      const f = 1 - Math.exp(-rate * g);
      d = Math.max(d, Math.abs(f - i / sorted.length), Math.abs(f - (i + 1) / sorted.length));
    });
    expect(d).toBeLessThan(1.63 / Math.sqrt(sorted.length));
    // Counts in 1 s windows: Poisson(5), so variance ≈ mean (index of dispersion ≈ 1).
    const windows = new Array(Math.floor(times.at(-1)! / 1000)).fill(0);
    for (const t of times) if (Math.floor(t / 1000) < windows.length) windows[Math.floor(t / 1000)]++;
    const wm = windows.reduce((s, c) => s + c, 0) / windows.length;
    const wv = windows.reduce((s, c) => s + (c - wm) ** 2, 0) / (windows.length - 1);
    expect(wm).toBeCloseTo(5, 0);
    expect(wv / wm).toBeGreaterThan(0.9);
    expect(wv / wm).toBeLessThan(1.1);
    expect(openLoopSchedule({ kind: "poisson", rate }, 50, Infinity, seededRng(7))).toEqual(times.slice(0, 50));
    expect(openLoopSchedule({ kind: "poisson", rate }, 50, Infinity, seededRng(8))).not.toEqual(times.slice(0, 50));
  });

  it("stops at the duration and the job cap; a regular process with the same seed scales", () => {
    const t = openLoopSchedule({ kind: "poisson", rate: 10 }, 1e6, 30_000, seededRng(1));
    expect(t.at(-1)!).toBeLessThan(30_000);
    expect(t.length).toBeGreaterThan(240);
    expect(t.length).toBeLessThan(360);
    expect(openLoopSchedule({ kind: "poisson", rate: 10 }, 17, 1e9, seededRng(1))).toHaveLength(17);
    // Common random numbers: the same seed at twice the rate gives half the times.
    const half = openLoopSchedule({ kind: "poisson", rate: 20 }, 17, 1e9, seededRng(1));
    half.forEach((x, i) => expect(x).toBeCloseTo(t[i]! / 2, 6));
    expect(() => openLoopSchedule({ kind: "poisson", rate: 0 }, 1, 1, seededRng(1))).toThrow(/rate/);
  });

  it("bursts: N at a time every T seconds", () => {
    expect(openLoopSchedule({ kind: "burst", size: 3, periodS: 2 }, 8, 1e9, seededRng(1))).toEqual([0, 0, 0, 2000, 2000, 2000, 4000, 4000]);
    expect(openLoopSchedule({ kind: "burst", size: 2, periodS: 1 }, 100, 2500, seededRng(1))).toEqual([0, 0, 1000, 1000, 2000, 2000]);
  });

  it("exponential and normal draws have the right moments", () => {
    const rng = seededRng(3);
    const e = Array.from({ length: 50_000 }, () => exponential(rng, 4));
    expect(e.reduce((s, x) => s + x, 0) / e.length).toBeCloseTo(0.25, 2);
    const z = Array.from({ length: 50_000 }, () => standardNormal(rng));
    const zm = z.reduce((s, x) => s + x, 0) / z.length;
    expect(Math.abs(zm)).toBeLessThan(0.02);
    expect(z.reduce((s, x) => s + (x - zm) ** 2, 0) / z.length).toBeCloseTo(1, 1);
  });
});

describe("percentiles", () => {
  it("interpolate linearly between closest ranks (numpy's default)", () => {
    expect(percentile([4, 1, 3, 2], 50)).toBe(2.5);
    expect(percentile([1, 2, 3, 4], 90)).toBeCloseTo(3.7, 12);
    expect(percentile([1, 2, 3, 4], 0)).toBe(1);
    expect(percentile([1, 2, 3, 4], 100)).toBe(4);
    expect(percentile([7], 99)).toBe(7);
    const xs = Array.from({ length: 101 }, (_, i) => 100 - i);
    expect(percentile(xs, 99)).toBe(99);
    expect(percentile(xs, 37.5)).toBe(37.5);
    expect(percentile([], 50)).toBeNaN();
    expect(() => percentile([1], 101)).toThrow(RangeError);
  });

  it("summaries and CDF points", () => {
    const s = latencySummary([10, 20, 30, 40, 50]);
    expect(s).toMatchObject({ n: 5, mean: 30, p50: 30, max: 50 });
    expect(s.p90).toBeCloseTo(46, 10);
    const cdf = cdfPoints([3, 1, 2, 4], 4);
    expect(cdf).toEqual([
      [1, 0.25],
      [2, 0.5],
      [3, 0.75],
      [4, 1],
    ]);
    expect(
      cdfPoints(
        Array.from({ length: 1000 }, (_, i) => i),
        10,
      ),
    ).toHaveLength(10);
  });
});

const req = (over: Partial<RequestResult>): RequestResult => ({
  index: 0,
  scheduledMs: 0,
  sentMs: 0,
  ok: true,
  promptTokensSent: 10,
  outputTokens: 10,
  tokenChunks: 10,
  itlMs: [],
  ...over,
});

describe("SLO attainment and goodput", () => {
  const slo = { ttftMs: 1000, tpotMs: 50 };
  it("a request meets the SLOs only if it succeeded and met both", () => {
    expect(meetsSlo(req({ ttftMs: 1000, tpotMs: 50 }), slo)).toBe(true);
    expect(meetsSlo(req({ ttftMs: 1001, tpotMs: 10 }), slo)).toBe(false);
    expect(meetsSlo(req({ ttftMs: 10, tpotMs: 51 }), slo)).toBe(false);
    expect(meetsSlo(req({ ttftMs: 10, tpotMs: undefined, outputTokens: 1 }), slo)).toBe(true); // no second token: no TPOT
    expect(meetsSlo(req({ ok: false, errorKind: "rate_limited", ttftMs: 5 }), slo)).toBe(false);
    expect(meetsSlo(req({ ttftMs: undefined }), slo)).toBe(false);
  });

  it("attainment counts failures as misses; goodput is SLO-meeting requests per second", () => {
    const results = [
      req({ index: 0, sentMs: 0, ttftMs: 100, tpotMs: 20, e2eMs: 2000 }), // met
      req({ index: 1, sentMs: 1000, ttftMs: 1500, tpotMs: 20, e2eMs: 3000 }), // TTFT miss
      req({ index: 2, sentMs: 2000, ttftMs: 100, tpotMs: 80, e2eMs: 5000 }), // TPOT miss
      req({ index: 3, sentMs: 3000, ok: false, errorKind: "rate_limited", status: 429, outputTokens: 0 }),
      req({ index: 4, sentMs: 4000, ok: false, errorKind: "http_5xx", status: 502, outputTokens: 0 }),
      req({ index: 5, sentMs: 5000, ttftMs: 200, tpotMs: 40, e2eMs: 5000, itlMs: [30, 50] }), // met; ends at 10 s
    ];
    const s = runStats(results, slo, 0.5);
    expect(s.requests).toBe(6);
    expect(s.ok).toBe(4);
    expect(s.errors.rate_limited).toBe(1);
    expect(s.errors.http_5xx).toBe(1);
    expect(s.elapsedS).toBe(10);
    expect(s.slo!.attainment).toBeCloseTo(2 / 6, 12);
    expect(s.slo!.ttftAttainment).toBeCloseTo(3 / 6, 12);
    expect(s.slo!.tpotAttainment).toBeCloseTo(3 / 6, 12);
    expect(s.slo!.goodputRps).toBeCloseTo(0.2, 12);
    expect(s.throughputRps).toBeCloseTo(0.4, 12);
    expect(s.outputTokPerS).toBeCloseTo(4, 12);
    expect(s.ttftMs.p50).toBe(150);
    expect(s.itlMs.n).toBe(2);
    expect(s.offeredRps).toBe(0.5);
  });
});

describe("multi-turn figures and ctxbank's reports", () => {
  it("reads the router's x-ctxbank-route header", () => {
    expect(parseRoute("decode-2; reason=holder_busy")).toEqual({ decode: "decode-2", reason: "holder_busy" });
    expect(parseRoute(["  d1 ;reason=session", "other"])).toEqual({ decode: "d1", reason: "session" });
    expect(parseRoute("d1")).toEqual({ decode: "d1", reason: "unknown" });
    expect(parseRoute(undefined)).toBeUndefined();
    expect(parseRoute("")).toBeUndefined();
  });

  const slo = { ttftMs: 1000, tpotMs: 50 };
  const turns = [
    req({
      index: 0,
      session: 0,
      round: 0,
      ttftMs: 100,
      tpotMs: 10,
      promptTokens: 100,
      reusedTokens: 0,
      prefill: { where: "remote", cause: "long" },
      route: { decode: "d1", reason: "load" },
    }),
    req({ index: 1, session: 1, round: 0, ttftMs: 300, tpotMs: 10, promptTokensSent: 90, route: { decode: "d2", reason: "load" } }),
    req({
      index: 2,
      session: 0,
      round: 1,
      ttftMs: 200,
      tpotMs: 10,
      promptTokens: 200,
      reusedTokens: 110,
      prefill: { where: "local", cause: "fraction" },
      route: { decode: "d1", reason: "session" },
    }),
    req({
      index: 3,
      session: 1,
      round: 1,
      ttftMs: 2000,
      tpotMs: 10,
      promptTokens: 190,
      reusedTokens: 0,
      prefill: { where: "remote" },
      route: { decode: "d1", reason: "round_robin" },
    }),
    req({ index: 4, session: 2, round: 1, ok: false, errorKind: "http_5xx", outputTokens: 0 }),
    req({ index: 5 }), // not a session's turn: no round
  ];

  it("per round: sorted by round index, TTFT over the successes, attainment over every request, reuse over those that reported it", () => {
    // Out of order on purpose: the rows come sorted by round.
    const rounds = roundStats([...turns].reverse(), slo);
    expect(rounds.map((r) => [r.round, r.requests, r.ok])).toEqual([
      [0, 2, 2],
      [1, 3, 2],
    ]);
    expect(rounds[0]!.ttftMs.p50).toBe(200);
    expect(rounds[1]!.ttftMs).toMatchObject({ n: 2, p50: 1100, max: 2000 });
    expect(rounds[0]!.promptTokens.mean).toBe(95); // the server's count, else ours
    expect(rounds[0]!.reusedTokens).toMatchObject({ n: 1, mean: 0 });
    expect(rounds[1]!.reusedTokens).toMatchObject({ n: 2, mean: 55 });
    expect(rounds[0]!.slo).toEqual({ met: 2, attainment: 1 });
    expect(rounds[1]!.slo!.met).toBe(1);
    expect(rounds[1]!.slo!.attainment).toBeCloseTo(1 / 3, 12);
    expect(roundStats(turns)[0]!.slo).toBeUndefined();
    expect(roundStats([req({})])).toEqual([]);
    const table = roundsTable([{ label: "kv", rounds }]);
    expect(table.split("\n")).toHaveLength(4); // header, rule, 2 rounds
    expect(table).toContain("| kv | 2 | 3 | 2 |"); // rounds are shown 1-based
  });

  it("counts what the server reported: route reasons and decodes, placements, session reuse", () => {
    const c = serverCounts(turns)!;
    expect(c.routeReason).toEqual({ load: 2, session: 1, round_robin: 1 });
    expect(c.routeDecode).toEqual({ d1: 3, d2: 1 });
    expect(c.prefillWhere).toEqual({ remote: 2, local: 1 });
    expect(c.prefillCause).toEqual({ "remote/long": 1, "local/fraction": 1, remote: 1 });
    expect(c.sessions).toEqual({ reported: 3, reused: 1, reusedTokens: 110, promptTokens: 490 });
    expect(serverCountsLine(c)).toBe(
      "route reasons: load 2, round_robin 1, session 1; decodes: d1 3, d2 1; prefill: local/fraction 1, remote 1, remote/long 1; sessions: 1/3 turns reused KV, 110 of their 490 prompt tokens (22.4%)",
    );
    expect(serverCounts([req({}), req({ index: 1 })])).toBeUndefined();
    expect(serverCountsLine(undefined)).toMatch(/^server reports: none/);
  });
});

describe("rate sweep", () => {
  const step = (cap: number) => async (rate: number) => (rate <= cap ? 0.95 : 0.5);

  it("brackets upwards then bisects to within the tolerance", async () => {
    const r = await sweepMaxRate(step(3.7), { startRate: 1, relTol: 0.05 });
    expect(r.stoppedBy).toBe("converged");
    expect(r.maxRate!).toBeLessThanOrEqual(3.7);
    expect(r.failRate!).toBeGreaterThan(3.7);
    expect(r.failRate! / r.maxRate!).toBeLessThanOrEqual(1.05);
    expect(r.points.slice(0, 3).map((p) => p.rate)).toEqual([1, 2, 4]);
  });

  it("brackets downwards from a failing start", async () => {
    const r = await sweepMaxRate(step(0.3), { startRate: 2, relTol: 0.1 });
    expect(r.points.slice(0, 4).map((p) => [p.rate, p.pass])).toEqual([
      [2, false],
      [1, false],
      [0.5, false],
      [0.25, true],
    ]);
    expect(r.maxRate!).toBeLessThanOrEqual(0.3);
    expect(r.failRate! / r.maxRate!).toBeLessThanOrEqual(1.1);
  });

  it("uses the target: a smooth attainment curve crosses 90% where expected", async () => {
    // attainment = 1 / (1 + (rate/2)^6): 0.9 at rate = 2 · (1/9)^(1/6) ≈ 1.387
    const f = async (rate: number) => 1 / (1 + (rate / 2) ** 6);
    const r = await sweepMaxRate(f, { startRate: 0.5, relTol: 0.02 });
    const exact = 2 * (1 / 9) ** (1 / 6);
    expect(r.maxRate!).toBeLessThanOrEqual(exact);
    expect(r.failRate!).toBeGreaterThan(exact);
    const r80 = await sweepMaxRate(f, { startRate: 0.5, relTol: 0.02, target: 0.8 });
    expect(r80.maxRate!).toBeGreaterThan(r.maxRate!);
  });

  it("stops at the point cap, the rate limits and the deadline", async () => {
    const capped = await sweepMaxRate(step(100), { startRate: 1, maxPoints: 3 });
    expect(capped.stoppedBy).toBe("max-points");
    expect(capped.points).toHaveLength(3);
    expect(capped.failRate).toBeUndefined();
    const never = await sweepMaxRate(async () => 0, { startRate: 1, minRate: 0.1 });
    expect(never.stoppedBy).toBe("min-rate");
    expect(never.maxRate).toBeUndefined();
    expect(never.points.at(-1)!.rate).toBe(0.1);
    const always = await sweepMaxRate(async () => 1, { startRate: 1, maxRate: 5 });
    expect(always.stoppedBy).toBe("max-rate");
    expect(always.maxRate).toBe(5);
    // Fake clock: each point takes 100 s of "time"; a 350 s budget fits 3 points (the 4th would end at 400 s).
    let clock = 0;
    const timed = await sweepMaxRate(
      async (rate) => {
        clock += 100_000;
        return rate <= 3 ? 1 : 0;
      },
      { startRate: 1, deadlineMs: 350_000, now: () => clock, expectedPointMs: () => 100_000 },
    );
    expect(timed.stoppedBy).toBe("deadline");
    expect(timed.points).toHaveLength(3);
    expect(timed.maxRate).toBe(2);
    expect(timed.failRate).toBe(4);
  });

  it("drain bound: a request still running after it has missed its SLOs", () => {
    expect(sweepDrainS({ ttftMs: 2000, tpotMs: 50 }, 128)).toBeCloseTo(1.1 * (2 + 6.4) + 5, 10);
  });
});

describe("SSE parser", () => {
  const stream = 'data: {"a":1}\n\n: comment\n\nevent: token\ndata: line1\ndata: line2\n\ndata:no-space\r\n\r\ndata: [DONE]\r\r';
  const expected = [
    { event: "message", data: '{"a":1}' },
    { event: "token", data: "line1\nline2" },
    { event: "message", data: "no-space" },
    { event: "message", data: "[DONE]" },
  ];

  it("parses a whole stream and every two-piece split of it the same way", () => {
    expect(new SseParser().feed(stream)).toEqual(expected);
    for (let cut = 0; cut <= stream.length; cut++) {
      const p = new SseParser();
      expect([...p.feed(stream.slice(0, cut)), ...p.feed(stream.slice(cut)), ...p.end()]).toEqual(expected);
    }
  });

  it("byte by byte, and an unterminated last event at the end", () => {
    const p = new SseParser();
    const out = [...stream].flatMap((c) => p.feed(c));
    expect(out).toEqual(expected);
    const q = new SseParser();
    expect(q.feed("data: tail")).toEqual([]);
    expect(q.end()).toEqual([{ event: "message", data: "tail" }]);
  });
});

describe("lengths, options, target guard", () => {
  it("length distributions", () => {
    expect(parseLengthDist("256", "x")).toEqual({ kind: "fixed", value: 256 });
    expect(parseLengthDist("10-20", "x")).toEqual({ kind: "uniform", min: 10, max: 20 });
    expect(parseLengthDist("100~10", "x")).toEqual({ kind: "normal", mean: 100, sd: 10, min: 1, max: 400 });
    expect(() => parseLengthDist("20-10", "x")).toThrow(/min > max/);
    expect(() => parseLengthDist("0", "x")).toThrow(/positive/);
    const rng = seededRng(5);
    const u = Array.from({ length: 5000 }, () => drawLength({ kind: "uniform", min: 10, max: 20 }, rng));
    expect(Math.min(...u)).toBe(10);
    expect(Math.max(...u)).toBe(20);
    const n = Array.from({ length: 5000 }, () => drawLength({ kind: "normal", mean: 100, sd: 10, min: 90, max: 400 }, rng));
    expect(Math.min(...n)).toBe(90);
    expect(n.reduce((s, x) => s + x, 0) / n.length).toBeGreaterThan(100);
  });

  it("options are validated", () => {
    const o = parseCli(["--rate", "2", "--slo-ttft", "500", "--slo-tpot", "40", "--sweep"], {});
    expect(o).toMatchObject({ arrivals: { kind: "poisson", rate: 2 }, slo: { ttftMs: 500, tpotMs: 40 }, sweep: { target: 0.9 } });
    expect(parseCli(["--burst", "4", "--every", "2"], {})).toMatchObject({ arrivals: { kind: "burst", size: 4, periodS: 2 } });
    expect(parseCli(["--workload", "random", "--input", "10-20"], {})).toMatchObject({
      workload: { kind: "synthetic", input: { kind: "uniform" } },
    });
    expect(parseCli(["--help"], {})).toBe("help");
    // Multi-turn names its sessions unless told not to.
    expect(parseCli(["--workload", "multiturn"], {})).toMatchObject({ workload: { kind: "multiturn", sessionIds: true } });
    expect(parseCli(["--workload", "multiturn", "--session-ids", "off"], {})).toMatchObject({
      workload: { kind: "multiturn", sessionIds: false },
    });
    for (const bad of [
      ["--workload", "multiturn", "--session-ids", "yes"],
      ["--session-ids", "on"],
      ["--rate", "0"],
      ["--rate", "1", "--concurrency", "2"],
      ["--burst", "3"],
      ["--sweep"],
      ["--slo-ttft", "10"],
      ["--workload", "nope"],
      ["--workload", "multiturn", "--endpoint", "completions"],
      ["--prompt-format", "ids"],
      ["--extra-body", "[1]"],
      ["--bogus"],
      ["--requests", "1.5"],
    ]) {
      expect(() => parseCli(bad, {}), bad.join(" ")).toThrow(UsageError);
    }
  });

  it("loads only loopback unless the host is allowed", () => {
    for (const h of ["localhost", "127.0.0.1", "127.8.9.10", "::1", "[::1]", "api.localhost"]) expect(isLoopback(h), h).toBe(true);
    for (const h of ["10.0.0.1", "example.com", "128.0.0.1", "localhost.example.com"]) expect(isLoopback(h), h).toBe(false);
    expect(checkTarget("http://127.0.0.1:8080/v1", []).port).toBe("8080");
    expect(() => checkTarget("http://example.com/v1", [])).toThrow(/--allow-host example.com/);
    expect(checkTarget("http://Example.com/v1", ["example.com"]).hostname).toBe("example.com");
    expect(() => checkTarget("ftp://127.0.0.1/", [])).toThrow(/http/);
    expect(() => checkTarget("not a url", [])).toThrow(/not a URL/);
  });
});
