// Number formatting for tiles, axes and legends. Every formatter answers "—" for a missing or
// non-finite value, so no NaN or Infinity ever reaches the screen.

export const NONE = "—";
const ok = (x) => typeof x === "number" && Number.isFinite(x);

function fixed(x, digits = 3) {
  if (x === 0) return "0";
  const a = Math.abs(x);
  const d = a >= 100 ? 0 : a >= 10 ? 1 : a >= 1 ? 2 : digits;
  // Trailing zeros after the point only: "1.50" -> "1.5", "2.00" -> "2", "100" stays.
  return x
    .toFixed(d)
    .replace(/(\.\d*?)0+$/, "$1")
    .replace(/\.$/, "");
}

/** A plain count or ratio: 3, 12.5, 0.042. */
export const num = (x) => (ok(x) ? fixed(x) : NONE);

/** Per second: 0.42/s. */
export const perSecond = (x) => (ok(x) ? `${fixed(x)}/s` : NONE);

/** A fraction in [0, 1] as a percentage: 97.5%. */
export const percent = (x) => (ok(x) ? `${fixed(x * 100, 1)}%` : NONE);

/** Seconds as ms under a second: 850 ms, 1.25 s. */
export const duration = (x) => (!ok(x) ? NONE : Math.abs(x) < 1 ? `${fixed(x * 1000)} ms` : `${fixed(x)} s`);

/** x divided by `base` until it is below it, with the unit that many divisions name. */
function scaled(x, base, units) {
  if (!ok(x)) return NONE;
  let i = 0;
  let v = x;
  while (Math.abs(v) >= base && i < units.length - 1) {
    v /= base;
    i++;
  }
  return `${fixed(v, 2)} ${units[i]}`;
}

/** Bytes in binary units: 11.3 MiB. */
export const bytes = (x) => scaled(x, 1024, ["B", "KiB", "MiB", "GiB", "TiB"]);

/** Bytes per second in decimal units, as transfer rates are quoted: 1.2 GB/s. */
export const byteRate = (x) => scaled(x, 1000, ["B/s", "kB/s", "MB/s", "GB/s"]);

/** A span in seconds for labels: 42 s, 5 min. */
export const span = (s) => (!ok(s) ? NONE : s < 90 ? `${Math.round(s)} s` : `${fixed(s / 60, 1)} min`);
