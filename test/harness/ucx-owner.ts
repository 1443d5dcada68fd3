// A UCX chunk owner in its own process, for the UCX transport tests: maps an existing shard file
// (argv: path, size, epoch) for remote reads and prints its endpoint as one JSON line. On stdin,
// "close" unmaps it (as a restarted owner does with its old epoch) and answers "closed". The tests
// kill it to play an owner that dies.
import { spawn, type ChildProcess } from "node:child_process";
import { createInterface } from "node:readline";
import { fileURLToPath } from "node:url";
import { UcxShardExposure } from "../../services/handoff/transport/ucx.ts";

export interface UcxOwner {
  endpoint: string;
  child: ChildProcess;
  /** Unmaps the shard in the owner; resolves when it has. */
  unexpose(): Promise<void>;
  kill(): Promise<void>;
}

export async function startUcxOwner(shardPath: string, sizeBytes: number, epoch: number, env: NodeJS.ProcessEnv = {}): Promise<UcxOwner> {
  const child = spawn(process.execPath, ["--import", "tsx", fileURLToPath(import.meta.url), shardPath, String(sizeBytes), String(epoch)], {
    stdio: ["pipe", "pipe", "inherit"],
    env: { ...process.env, ...env },
  });
  const lines = createInterface({ input: child.stdout! })[Symbol.asyncIterator]();
  const first = await lines.next();
  if (first.done) throw new Error("the UCX owner exited before publishing its endpoint");
  const { endpoint } = JSON.parse(first.value as string) as { endpoint: string };
  const exited = new Promise<void>((resolve) => child.once("exit", () => resolve()));
  return {
    endpoint,
    child,
    unexpose: async () => {
      child.stdin!.write("close\n");
      const answer = await lines.next();
      if (answer.value !== "closed") throw new Error(`the UCX owner answered ${String(answer.value)}`);
    },
    kill: async () => {
      if (child.exitCode === null && child.signalCode === null) child.kill("SIGKILL");
      await exited;
    },
  };
}

if (process.argv[1] === fileURLToPath(import.meta.url)) {
  const [shardPath, size, epoch] = process.argv.slice(2);
  const exposure = UcxShardExposure.create({ path: shardPath!, sizeBytes: Number(size), epoch: Number(epoch) });
  process.stdout.write(`${JSON.stringify({ endpoint: exposure.endpoint })}\n`);
  for await (const line of createInterface({ input: process.stdin })) {
    if (line === "close") {
      exposure.close();
      process.stdout.write("closed\n");
    }
  }
}
