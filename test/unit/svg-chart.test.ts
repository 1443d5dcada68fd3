// The benchmark charts' value labels say the values: three significant digits, whole numbers
// from 100 up (a label once read "12" for 120 ms: trailing zeros were cut from an integer).
import { describe, expect, it } from "vitest";
import { renderChart } from "../../tools/lib/svg-chart.ts";

function labels(ys: number[]): string[] {
  const svg = renderChart(
    [
      {
        title: "t",
        xLabel: "x",
        yLabel: "y",
        series: [{ name: "s", color: "#000", labels: true, points: ys.map((y, i) => [i + 1, y] as [number, number]) }],
      },
    ],
    { title: "chart" },
  );
  return [...svg.matchAll(/class="vlabel"[^>]*>([^<]*)</g)].map((m) => m[1]!);
}

describe("svg chart value labels", () => {
  it("keep the zeros of whole numbers and drop those after a decimal point", () => {
    expect(labels([120.2, 1538, 43.6, 0.634, 3.0301, 2.5, 100, 0.1])).toEqual([
      "120",
      "1538",
      "43.6",
      "0.634",
      "3.03",
      "2.5",
      "100",
      "0.1",
    ]);
  });
});
