// Run as its own process by test/unit/transport-ucx.test.ts: which of UCX's libraries this process has
// mapped after loading the engine's addon, after asking whether UCX is available, and after
// loading the UCX addon; prints one JSON line. argv[2] = "engine" loads the engine's addon first.
import { readFileSync } from "node:fs";
import { fileURLToPath } from "node:url";
import { addon } from "../../shared/inference/engine/native.ts";
import { loadUcx, ucxAvailable } from "../../services/handoff/transport/ucx.ts";

export interface UcxLoadProbe {
  /** UCX's shared libraries mapped into the process at each step (empty: none). */
  afterEngine: string[];
  afterAvailable: string[];
  afterLoad: string[];
  available: boolean;
  availableAfterLoad: boolean;
  /** The load's error message, when it threw. */
  loadError?: string;
}

function ucxLibraries(): string[] {
  const names = new Set<string>();
  for (const line of readFileSync("/proc/self/maps", "utf8").split("\n")) {
    const m = /\/(lib(?:ucp|ucs|uct|ucm)\.so[^/\s]*)$/.exec(line);
    if (m) names.add(m[1]!);
  }
  return [...names].sort();
}

if (process.argv[1] === fileURLToPath(import.meta.url)) {
  if (process.argv[2] === "engine") addon().crc32c(new Uint8Array(8));
  const out: Partial<UcxLoadProbe> = { afterEngine: ucxLibraries() };
  out.available = ucxAvailable();
  out.afterAvailable = ucxLibraries();
  try {
    loadUcx();
  } catch (err) {
    out.loadError = (err as Error).message;
  }
  out.afterLoad = ucxLibraries();
  out.availableAfterLoad = ucxAvailable();
  process.stdout.write(`${JSON.stringify(out)}\n`);
}
