/** Status lines and download/extract progress on stderr: a bar on a TTY, else a few plain lines. */
import cliProgress from "cli-progress";

export type ProgressMode = "auto" | "lines" | "none";
export type ProgressStream = NodeJS.WritableStream & { isTTY?: boolean; columns?: number };

export interface ProgressHandle {
  update(done: number): void;
  stop(ok: boolean): void;
}

export interface Logger {
  line(msg: string): void;
  progress(label: string, total: number | undefined): ProgressHandle;
}

export function makeLogger(mode: ProgressMode, stream: ProgressStream): Logger {
  if (mode === "none") {
    return { line: () => undefined, progress: () => ({ update: () => undefined, stop: () => undefined }) };
  }
  const tty = mode === "auto" && stream.isTTY === true;
  return {
    line: (msg) => {
      stream.write(`ctxbank: ${msg}\n`);
    },
    progress: (label, total) =>
      tty && total !== undefined && total > 0 ? barProgress(stream, label, total) : lineProgress(stream, label, total),
  };
}

function barProgress(stream: NodeJS.WritableStream, label: string, total: number): ProgressHandle {
  const started = Date.now();
  const bar = new cliProgress.SingleBar(
    {
      stream: stream as NodeJS.WritableStream,
      format: `ctxbank: ${label} [{bar}] {percentage}% | {doneMB}/{totalMB} | {rate} | ETA {etaText}`,
      barsize: 24,
      hideCursor: true,
      clearOnComplete: false,
      fps: 8,
      etaBuffer: 50,
    },
    cliProgress.Presets.shades_classic,
  );
  const payload = (done: number) => {
    const secs = (Date.now() - started) / 1000;
    const rate = secs > 0 ? done / secs : 0;
    return {
      doneMB: formatBytes(done),
      totalMB: formatBytes(total),
      rate: `${formatBytes(rate)}/s`,
      etaText: rate > 0 ? fmtDuration((total - done) / rate) : "?",
    };
  };
  bar.start(total, 0, payload(0));
  return {
    update: (done) => bar.update(Math.min(done, total), payload(done)),
    stop: (ok) => {
      if (ok) bar.update(total, payload(total));
      bar.stop();
    },
  };
}

/** Non-TTY progress: a handful of plain lines (every 25 %, or every 15 s when the size is unknown). */
function lineProgress(stream: NodeJS.WritableStream, label: string, total: number | undefined): ProgressHandle {
  const started = Date.now();
  let nextPct = 25;
  let lastAt = started;
  const say = (done: number, pct?: number): void => {
    const secs = (Date.now() - started) / 1000;
    const rate = secs > 0 ? done / secs : 0;
    let s = `ctxbank: ${label}: `;
    if (total !== undefined && total > 0) {
      s += `${pct ?? Math.floor((done / total) * 100)}% (${formatBytes(done)} of ${formatBytes(total)}, ${formatBytes(rate)}/s`;
      s += done < total && rate > 0 ? `, ETA ${fmtDuration((total - done) / rate)})` : ")";
    } else {
      s += `${formatBytes(done)} (${formatBytes(rate)}/s)`;
    }
    stream.write(s + "\n");
  };
  let last = 0;
  return {
    update: (done) => {
      last = done;
      if (total !== undefined && total > 0) {
        const pct = (done / total) * 100;
        if (pct >= nextPct && done < total) {
          say(done, nextPct);
          while (nextPct <= pct) nextPct += 25;
        }
      } else if (Date.now() - lastAt > 15_000) {
        lastAt = Date.now();
        say(done);
      }
    },
    stop: (ok) => {
      if (ok) say(last);
    },
  };
}

/** 98.4 MB, 1.25 GB: a size for people. */
export function formatBytes(n: number): string {
  if (n >= 1e9) return `${(n / 1e9).toFixed(2)} GB`;
  if (n >= 1e6) return `${(n / 1e6).toFixed(1)} MB`;
  if (n >= 1e3) return `${(n / 1e3).toFixed(1)} kB`;
  return `${Math.round(n)} B`;
}

function fmtDuration(s: number): string {
  if (!Number.isFinite(s)) return "?";
  const t = Math.max(0, Math.round(s));
  if (t < 60) return `${t}s`;
  const m = Math.floor(t / 60);
  if (m < 60) return `${m}m${String(t % 60).padStart(2, "0")}s`;
  return `${Math.floor(m / 60)}h${String(m % 60).padStart(2, "0")}m`;
}
