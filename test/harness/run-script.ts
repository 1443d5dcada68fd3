// Runs a TypeScript entry point of the repository (tsx) in a child process with only the given
// environment, and collects its exit code and output.
import { spawn } from "node:child_process";

export interface ScriptResult {
  code: number | null;
  stdout: string;
  stderr: string;
}

/** `node --import tsx <script> ...args`, from the repository root, with PATH plus `env` as its environment. */
export function runScript(script: string, args: string[], env: Record<string, string>): Promise<ScriptResult> {
  return new Promise((resolve, reject) => {
    const child = spawn(process.execPath, ["--import", "tsx", script, ...args], {
      env: { PATH: process.env.PATH ?? "", ...env },
      stdio: ["ignore", "pipe", "pipe"],
    });
    let stdout = "";
    let stderr = "";
    child.stdout.setEncoding("utf8").on("data", (d: string) => (stdout += d));
    child.stderr.setEncoding("utf8").on("data", (d: string) => (stderr += d));
    child.on("error", reject);
    child.on("close", (code) => resolve({ code, stdout, stderr }));
  });
}
