// KV memory per token of a model with sliding-window layers (Gemma 3), measured on the engine's
// own sequences against the bound of the issue: every global layer's K and V rows per token, plus
// each sliding layer's window once. Two sequences per length, as the services hold them:
// - a prefill's: the prompt computed in 512-token micro-batches, rings of the window + 512 rows;
// - a decode's: the same KV imported the way the handoff moves it (the global layers whole, the
//   sliding layers' last window: heldChunks) into rings of the window + 64 rows (DECODE_RING_BATCH).
// deviceBytesUsed is the engine's count of the rows it holds; RSS growth of the process is
// reported beside it as the operating system's view.
//
//   npm run bench:kvmem [-- --model gemma-3-270m] [--lengths 512,8192,16384,30720] [--threads 2]
import { heldChunks, kvShape } from "../../services/handoff/index.ts";
import { DECODE_RING_BATCH, Engine, loadModel } from "../../shared/inference/engine/engine.ts";
import { resolveModel } from "../../shared/inference/model/resolve.ts";
import { benchCli } from "../../tools/lib/bench-runner.ts";
import { renderChart } from "../../tools/lib/svg-chart.ts";

const bench = benchCli({
  name: "kvmem",
  script: "npm run bench:kvmem --",
  options: {
    model: { type: "string", default: "gemma-3-270m" },
    lengths: { type: "string", default: "512,8192,16384,30720" },
    threads: { type: "string", default: "2" },
  },
  help: `  --model NAME|PATH   a model with sliding-window layers (default gemma-3-270m)
  --lengths LIST      prompt tokens (default 512,8192,16384,30720)
  --threads N         engine threads (default 2)`,
});
const args = bench.values;
const lengths = args.lengths!.split(",").map(Number);
const model = await loadModel(await resolveModel({ path: args.model }));
const c = model.config;
if (c.slidingWindow === 0) throw new Error(`${c.name} has no sliding-window layers: this bench measures their rings`);
const engine = new Engine(model, { threads: Number(args.threads), maxContext: Math.max(...lengths) + 1 });
const shape = kvShape(c);
const pair = 2 * c.nHeadKv * c.headDim * 2; // one token's K and V rows of one layer, f16
const nSliding = c.slidingLayers.length;
const nGlobal = c.nLayer - nSliding;
const rss = () => process.memoryUsage().rss;

const rows = [];
for (const n of lengths) {
  const ids = Array.from({ length: n }, (_, i) => 1000 + ((i * 7919) % 20000));
  const bound = n * nGlobal * pair + nSliding * Math.min(n, c.slidingWindow) * pair;
  const rss0 = rss();
  const prefill = engine.createSequence(n);
  const t0 = performance.now();
  for (let i = 0; i < n; i += engine.ubatch) await engine.prefill(prefill, ids.slice(i, i + engine.ubatch));
  const prefillS = (performance.now() - t0) / 1000;
  const prefillBytes = prefill.deviceBytesUsed;
  const rssPrefill = rss() - rss0;
  const decode = engine.createSequence(n + 1, { ringBatch: DECODE_RING_BATCH });
  for (const ch of heldChunks(shape, n, 512)) {
    const buf = new Uint8Array(ch.tokenCount * ch.layerIds.length * pair);
    prefill.exportRows(buf, ch.layerIds, ch.tokenStart, ch.tokenCount);
    decode.importRows(buf, ch.layerIds, ch.tokenStart, ch.tokenCount);
  }
  decode.setLength(n);
  const decodeBytes = decode.deviceBytesUsed;
  const wholeBytes = n * c.nLayer * pair; // every layer's rows, as without rings
  prefill.release();
  decode.release();
  const row = {
    tokens: n,
    boundBytes: bound,
    decodeBytes,
    prefillBytes,
    wholeBytes,
    decodeVsBound: decodeBytes / bound,
    prefillVsBound: prefillBytes / bound,
    wholeVsDecode: wholeBytes / decodeBytes,
    decodeBytesPerToken: decodeBytes / n,
    prefillRssGrowth: rssPrefill,
    prefillS,
  };
  rows.push(row);
  console.log(
    `${n} tokens: bound ${(bound / 2 ** 20).toFixed(1)} MiB; decode ${(decodeBytes / 2 ** 20).toFixed(1)} MiB (${((row.decodeVsBound - 1) * 100).toFixed(1)}% over); ` +
      `prefill ${(prefillBytes / 2 ** 20).toFixed(1)} MiB (${((row.prefillVsBound - 1) * 100).toFixed(1)}% over); every row ${(wholeBytes / 2 ** 20).toFixed(1)} MiB (${row.wholeVsDecode.toFixed(2)}x the decode's)`,
  );
}
await bench.results.json("kvmem", {
  what: "KV bytes a sequence holds (deviceBytesUsed) vs the bound: global layers x 2 x head dim x KV heads x 2 bytes per token, plus each sliding layer's window",
  ...bench.record(),
  model: { name: c.name, fingerprint: model.fingerprint, nLayer: c.nLayer, slidingLayers: c.slidingLayers, slidingWindow: c.slidingWindow },
  prefillRingRows: engine.info.ringRows,
  rows,
});
const mib = (b: number) => b / 2 ** 20;
await bench.results.chart(
  "kvmem",
  renderChart(
    [
      {
        title: "KV held per sequence",
        xLabel: "prompt tokens",
        yLabel: "MiB",
        series: [
          {
            name: "every layer's rows (no rings)",
            color: "#999999",
            dash: "6 4",
            points: rows.map((r) => [r.tokens, mib(r.wholeBytes)] as [number, number]),
          },
          {
            name: "prefill sequence (rings of window + 512)",
            color: "#ff7f0e",
            points: rows.map((r) => [r.tokens, mib(r.prefillBytes)] as [number, number]),
          },
          {
            name: "decode sequence (rings of window + 64)",
            color: "#1f77b4",
            points: rows.map((r) => [r.tokens, mib(r.decodeBytes)] as [number, number]),
          },
          {
            name: "bound: global rows + the windows",
            color: "#333333",
            dash: "2 3",
            points: rows.map((r) => [r.tokens, mib(r.boundBytes)] as [number, number]),
          },
        ],
      },
    ],
    {
      title: `${c.name}: KV memory with sliding-window rings`,
      subtitle: `${nGlobal} global and ${nSliding} sliding layers (window ${c.slidingWindow}); deviceBytesUsed after the prompt`,
      panelWidth: 640,
      panelHeight: 360,
    },
  ),
);
