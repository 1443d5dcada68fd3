// Resident memory of this process (Linux /proc/self/status VmRSS), bytes.
import { readFileSync } from "node:fs";

export function rssBytes(): number {
  const m = /VmRSS:\s+(\d+) kB/.exec(readFileSync("/proc/self/status", "utf8"));
  if (!m) throw new Error("no VmRSS in /proc/self/status (Linux only)");
  return Number(m[1]) * 1024;
}
