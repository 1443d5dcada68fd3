// Chunk checksum throughput, one run: the engine's CRC-32C (SSE4.2; the chunk checksum since
// layout version 2) against zlib.crc32 (layout version 1) and sha256, over one chunk's worth of
// bytes and more. Best of 7 per point (the box is shared); GB = 10^9 bytes.
//
//   npm run bench:checksum
import { createHash, randomFillSync } from "node:crypto";
import zlib from "node:zlib";

import { crc32c } from "../../shared/inference/engine/native.ts";
import { benchCli } from "../../tools/lib/bench-runner.ts";
import { otherLoad } from "../../tools/lib/timing.ts";
import { renderChart, type Series } from "../../tools/lib/svg-chart.ts";

const bench = benchCli({ name: "checksum", script: "npm run bench:checksum --" });

const MiB = 2 ** 20;
const SIZES = [1 * MiB, 11.25 * MiB, 64 * MiB]; // 11.25 MiB = one 512-token chunk of SmolLM2-135M
const REPS = 7;
const algorithms: Array<{ id: string; color: string; run: (b: Buffer) => unknown }> = [
  { id: "crc32c (engine, SSE4.2)", color: "#2ca02c", run: (b) => crc32c(b) },
  { id: "zlib.crc32", color: "#1f77b4", run: (b) => zlib.crc32(b) },
  { id: "sha256", color: "#d62728", run: (b) => createHash("sha256").update(b).digest() },
];

const rows: Array<{ algorithm: string; bytes: number; gbps: number }> = [];
const load = await otherLoad();
for (const bytes of SIZES) {
  const buf = randomFillSync(Buffer.allocUnsafe(bytes));
  for (const a of algorithms) {
    a.run(buf); // warm-up
    let best = Infinity;
    for (let r = 0; r < REPS; r++) {
      const t0 = process.hrtime.bigint();
      a.run(buf);
      best = Math.min(best, Number(process.hrtime.bigint() - t0) / 1e9);
    }
    rows.push({ algorithm: a.id, bytes, gbps: bytes / best / 1e9 });
    console.log(`${a.id.padEnd(24)} ${(bytes / MiB).toFixed(2).padStart(6)} MiB  ${(bytes / best / 1e9).toFixed(2)} GB/s`);
  }
}
await bench.results.json("checksum", {
  what: "checksum throughput, best of 7, one thread, GB = 1e9 bytes",
  ...bench.record(),
  otherCoresAtStart: load ?? null,
  rows,
});
const series: Series[] = algorithms.map((a) => ({
  name: a.id,
  color: a.color,
  labels: true,
  points: rows.filter((r) => r.algorithm === a.id).map((r) => [r.bytes / MiB, r.gbps] as [number, number]),
}));
await bench.results.chart(
  "checksum",
  renderChart([{ title: "Checksum throughput", xLabel: "bytes checked (MiB; 11.25 = one chunk)", yLabel: "GB/s", xLog2: true, series }], {
    title: "KV chunk checksums",
    subtitle: `best of ${REPS}, one thread`,
    panelWidth: 620,
    panelHeight: 340,
  }),
);
