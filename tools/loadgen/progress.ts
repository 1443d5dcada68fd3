// Progress of a load run on stderr: a cli-progress bar on a terminal (requests done of the
// planned total, errors, 429s, SLO attainment so far), a line every 10 s otherwise (logs of the
// committed suite stay readable).
import cliProgress from "cli-progress";

export interface RunProgress {
  update(done: number, payload: { ok: number; errors: number; limited: number; attainment?: number }): void;
  stop(): void;
}

export function runProgress(label: string, total: number, enabled: boolean): RunProgress {
  if (!enabled) return { update: () => undefined, stop: () => undefined };
  const fmt = (p: { ok: number; errors: number; limited: number; attainment?: number }) =>
    `ok ${p.ok} | err ${p.errors} | 429 ${p.limited}${p.attainment === undefined ? "" : ` | SLO ${(100 * p.attainment).toFixed(0)}%`}`;
  if (!process.stderr.isTTY) {
    let lastLine = 0;
    return {
      update(done, p) {
        const now = Date.now();
        if (now - lastLine < 10_000 && done < total) return;
        lastLine = now;
        process.stderr.write(`[loadgen] ${label}: ${done}/${total} | ${fmt(p)}\n`);
      },
      stop: () => undefined,
    };
  }
  const bar = new cliProgress.SingleBar(
    {
      stream: process.stderr,
      format: `${label} [{bar}] {value}/{total} | {status} | {duration_formatted}`,
      barsize: 24,
      hideCursor: true,
      clearOnComplete: false,
      fps: 5,
    },
    cliProgress.Presets.shades_classic,
  );
  bar.start(total, 0, { status: "" });
  return {
    update: (done, p) => bar.update(done, { status: fmt(p) }),
    stop: () => bar.stop(),
  };
}
