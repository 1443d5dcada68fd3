// Runs ctxbank service processes (`tsx bin/ctxbank.ts serve|prefill|decode|router`) for tests,
// benches and tools, finds the URL they listen on in their JSON log, and stops them (SIGTERM, then
// SIGKILL). What only tests use is in test/harness/.
import { spawn, type ChildProcess } from "node:child_process";
import { existsSync } from "node:fs";
import { mkdtemp, rm } from "node:fs/promises";
import os from "node:os";
import path from "node:path";
import { fileURLToPath } from "node:url";

export const root = fileURLToPath(new URL("../..", import.meta.url));

/** The services' shared secret in tests that run separate processes (they need the same one). */
export const TEST_INTERNAL_SECRET = "test-internal-secret-0123456789abcdef";

export interface ServiceProcess {
  child: ChildProcess;
  url: string;
  /** The internal listener (chunks, prefill calls, status: shared secret / capabilities). */
  internalUrl: string;
  /** Everything the process logged so far (JSON lines). */
  log(): string;
  /** Graceful stop: SIGTERM, then SIGKILL after `ms`. Resolves with the exit code. */
  stop(ms?: number): Promise<number | null>;
  /** SIGKILL now (a crash). */
  kill(): Promise<void>;
}

export async function startService(
  role: "serve" | "prefill" | "decode" | "router",
  args: string[],
  env: Record<string, string> = {},
  timeoutMs = 120_000,
): Promise<ServiceProcess> {
  // node with tsx's loader (not the tsx wrapper, which runs the program in a child process that
  // a SIGKILL of the wrapper would leave running).
  const child = spawn(process.execPath, ["--import", "tsx", "bin/ctxbank.ts", role, "--port", "0", ...args], {
    cwd: root,
    env: { ...process.env, CTXBANK_LOG_LEVEL: "info", CTXBANK_INTERNAL_SECRET: TEST_INTERNAL_SECRET, ...env },
    stdio: ["ignore", "pipe", "pipe"],
  });
  let out = "";
  child.stdout!.setEncoding("utf8").on("data", (d: string) => (out += d));
  child.stderr!.setEncoding("utf8").on("data", (d: string) => (out += d));
  const exited = new Promise<number | null>((resolve) => child.once("exit", (code) => resolve(code)));
  const [url, internalUrl] = await new Promise<[string, string]>((resolve, reject) => {
    const timer = setTimeout(() => {
      child.kill("SIGKILL");
      reject(new Error(`${role} did not start in ${timeoutMs} ms:\n${out}`));
    }, timeoutMs);
    const check = () => {
      const m = /"url":"(http:\/\/[^"]+)","internalUrl":"(http:\/\/[^"]+)"[^\n]*"msg":"listening"/.exec(out);
      const router = /"url":"(http:\/\/[^"]+)"[^\n]*"msg":"router listening"/.exec(out);
      if (m || router) {
        clearTimeout(timer);
        resolve(m ? [m[1]!, m[2]!] : [router![1]!, router![1]!]); // a router has no internal listener
      }
    };
    child.stdout!.on("data", check);
    void exited.then((code) => {
      clearTimeout(timer);
      reject(new Error(`${role} exited with ${code} before listening:\n${out}`));
    });
  });
  return {
    child,
    url,
    internalUrl,
    log: () => out,
    async stop(ms = 15_000) {
      if (child.exitCode !== null || child.signalCode !== null) return child.exitCode;
      child.kill("SIGTERM");
      const timer = setTimeout(() => child.kill("SIGKILL"), ms);
      const code = await exited;
      clearTimeout(timer);
      return code;
    },
    async kill() {
      if (child.exitCode !== null || child.signalCode !== null) return;
      child.kill("SIGKILL");
      await exited;
    },
  };
}

/** A fresh shard directory (on tmpfs where there is one), removed by the returned function. */
export async function tempShardDir(): Promise<{ dir: string; remove(): Promise<void> }> {
  const dir = await mkdtemp(path.join(existsSync("/dev/shm") ? "/dev/shm" : os.tmpdir(), "ctxbank-test-shards-"));
  return { dir, remove: () => rm(dir, { recursive: true, force: true }) };
}

/** Polls `check` every 25 ms until it holds; throws naming `what` after `ms`. */
export async function until(what: string, check: () => Promise<boolean> | boolean, ms = 5_000): Promise<void> {
  const end = Date.now() + ms;
  while (!(await check())) {
    if (Date.now() > end) throw new Error(`timed out waiting until ${what}`);
    await new Promise((r) => setTimeout(r, 25));
  }
}

// biome-ignore lint/suspicious/noExplicitAny: any JSON answer, as the test or tool asserting on it reads it
export async function getJson(url: string, headers: Record<string, string> = {}): Promise<{ status: number; body: any }> {
  const res = await fetch(url, { headers });
  return { status: res.status, body: await res.json() };
}
