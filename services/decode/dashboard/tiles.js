// The headline tiles: one figure each (with `data-value` holding the raw number, empty when
// there is none) and a line of context under it.
import { byteRate, bytes, duration, num, percent, perSecond, span } from "./format.js";

const sumOf = (xs) => (xs.some((x) => x !== null) ? xs.reduce((a, x) => a + (x ?? 0), 0) : null);
const join = (parts) => parts.filter(Boolean).join(" · ");

function latencyTile(label, kind) {
  return {
    id: kind,
    label: `${label} p50`,
    figure: (w, now) => {
      const q = w?.[kind] ?? [null, null, null];
      const target = now.targets[kind] ?? null;
      return {
        value: q[0],
        text: duration(q[0]),
        sub: join([`p90 ${duration(q[1])}`, `p99 ${duration(q[2])}`, target !== null && `target ${duration(target)}`]),
        over: target !== null && q[1] !== null && q[1] > target,
      };
    },
  };
}

export const TILES = [
  {
    id: "requests",
    label: "Requests/s",
    figure: (w, now) => ({
      value: w?.requestRate ?? null,
      text: perSecond(w?.requestRate),
      sub: join([`${num(w?.requests)} in ${span(w?.seconds)}`, `${num(now.requestsSinceStart)} since start`]),
    }),
  },
  {
    id: "goodput",
    label: "Goodput",
    figure: (w) => ({
      value: w?.goodput ?? null,
      text: perSecond(w?.goodput),
      sub: `requests/s meeting every SLO; failures ${perSecond(w?.failureRate)}`,
    }),
  },
  {
    id: "attainment",
    label: "SLO attainment",
    figure: (w, now) => ({
      value: w?.attainment.all ?? null,
      text: percent(w?.attainment.all),
      sub: `in ${span(w?.seconds)}; ${percent(now.attainmentSinceStart)} since start`,
    }),
  },
  latencyTile("TTFT", "ttft"),
  latencyTile("TPOT", "tpot"),
  {
    id: "queues",
    label: "Running / waiting",
    figure: (_w, now) => {
      const qs = Object.entries(now.queues);
      const running = sumOf(qs.map(([, q]) => q.running));
      const waiting = sumOf(qs.map(([, q]) => q.waiting));
      return {
        value: running,
        text: `${num(running)} / ${num(waiting)}`,
        sub: qs.length ? qs.map(([s, q]) => `${s} ${num(q.running)}/${num(q.waiting)}`).join(" · ") : "no queue gauges",
      };
    },
  },
  {
    id: "kv",
    label: "KV memory (device)",
    figure: (_w, now) => {
      const tier = (name) => {
        const kv = now.kv[name];
        if (!kv) return null;
        if (!(kv.capacity > 0)) return `${name} ${kv.inUse ? bytes(kv.inUse) : "off"}`;
        return `${name} ${bytes(kv.inUse)} of ${bytes(kv.capacity)} (${percent(kv.inUse / kv.capacity)})`;
      };
      const device = now.kv.device?.inUse ?? null;
      return { value: device, text: bytes(device), sub: join(["device", "host", "shard"].map(tier)) || "no KV gauges" };
    },
  },
  {
    id: "transfer",
    label: "KV transfer",
    figure: (w) => {
      const rates = Object.entries(w?.kvTransferRate ?? {});
      const total = sumOf(rates.map(([, r]) => r));
      return {
        value: total,
        text: byteRate(total),
        sub: rates.length ? rates.map(([t, r]) => `${t} ${byteRate(r)}`).join(" · ") : "no transfers yet",
      };
    },
  },
  {
    id: "tokens",
    label: "Tokens generated/s",
    figure: (w) => ({
      value: w?.generationTokenRate ?? null,
      text: perSecond(w?.generationTokenRate),
      sub: `prompt ${perSecond(w?.promptTokenRate)}`,
    }),
  },
];

/** Builds the tiles into `parent`; answers a function that shows new figures. */
export function mountTiles(parent) {
  const els = TILES.map((def) => {
    const el = document.createElement("div");
    el.className = "tile";
    el.dataset.tile = def.id;
    el.innerHTML = `<div class="label"></div><div class="value"></div><div class="sub"></div>`;
    el.querySelector(".label").textContent = def.label;
    parent.append(el);
    return { def, el, value: el.querySelector(".value"), sub: el.querySelector(".sub") };
  });
  return (figures) => {
    for (const { def, el, value, sub } of els) {
      const f = figures ? def.figure(figures.window, figures.now) : { value: null, text: "—", sub: "waiting for /metrics" };
      value.textContent = f.text;
      value.dataset.value = f.value === null || !Number.isFinite(f.value) ? "" : String(f.value);
      sub.textContent = f.sub;
      el.classList.toggle("over", Boolean(f.over));
    }
  };
}
