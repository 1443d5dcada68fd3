// Starts a throw-away PostgreSQL 15 server for a test file and stops it afterwards:
// initdb into a fresh temp dir (as the `postgres` user when we are root, since initdb refuses to
// run as root), trust auth, a free 127.0.0.1 port, the unix socket inside the temp dir.
import { execFile } from "node:child_process";
import { existsSync, readFileSync } from "node:fs";
import { chown, copyFile, mkdtemp, rm } from "node:fs/promises";
import net from "node:net";
import os from "node:os";
import path from "node:path";
import { promisify } from "node:util";
import pg from "pg";

const run = promisify(execFile);
const PG_BIN = process.env.CTXBANK_PG_BIN ?? "/usr/lib/postgresql/15/bin";
const SUPERUSER = "app";

export interface TestPostgres {
  url: string;
  /** The postmaster's process id (backends are its children), while it runs. */
  pid(): number | undefined;
  /** Stops and removes the cluster. */
  stop(): Promise<void>;
  /** An outage: stops the server (fast shutdown: clients are disconnected), keeping its data. */
  shutDown(): Promise<void>;
  /** Starts it again after `shutDown`, on the same port with the same data. */
  startUp(): Promise<void>;
}

export interface StartOptions {
  /** Copy the server's log here when it stops (it logs statements over 200 ms and lock waits). */
  keepLogAt?: string;
  /** Where the cluster's temp dir goes (default os.tmpdir()); a tmpfs keeps its files off the disk. */
  baseDir?: string;
}

export async function startPostgres(database = "ctxbank_test", options: StartOptions = {}): Promise<TestPostgres> {
  if (!existsSync(path.join(PG_BIN, "initdb"))) {
    throw new Error(`PostgreSQL binaries not found in ${PG_BIN} (set CTXBANK_PG_BIN)`);
  }
  const dir = await mkdtemp(path.join(options.baseDir ?? os.tmpdir(), "ctxbank-pg-"));
  const dataDir = path.join(dir, "data");
  const asRoot = process.getuid?.() === 0;
  const pgUser = asRoot ? await lookupUser("postgres") : undefined;
  if (pgUser) await chown(dir, pgUser.uid, pgUser.gid);
  const pgctl = (...args: string[]) => exec(asRoot, path.join(PG_BIN, "pg_ctl"), ["-D", dataDir, ...args]);

  try {
    await exec(asRoot, path.join(PG_BIN, "initdb"), [
      "-D",
      dataDir,
      "-A",
      "trust",
      "-U",
      SUPERUSER,
      "-E",
      "UTF8",
      "--no-locale",
      "--no-sync",
    ]);
    const port = await freePort();
    const logging = options.keepLogAt
      ? " -c log_min_duration_statement=200 -c log_lock_waits=on -c log_connections=on -c log_disconnections=on"
      : "";
    const serverOptions = `-p ${port} -k ${dir} -c listen_addresses=127.0.0.1 -c fsync=off -c max_connections=50${logging}`;
    const startServer = () => pgctl("-o", serverOptions, "-l", path.join(dir, "server.log"), "-w", "-t", "60", "start");
    await startServer();
    const admin = new pg.Client({ connectionString: `postgresql://${SUPERUSER}@127.0.0.1:${port}/postgres` });
    await admin.connect();
    try {
      await admin.query(`create database ${database}`);
    } finally {
      await admin.end();
    }
    let stopped = false;
    return {
      url: `postgresql://${SUPERUSER}@127.0.0.1:${port}/${database}`,
      pid() {
        try {
          return Number(readFileSync(path.join(dataDir, "postmaster.pid"), "utf8").split("\n")[0]) || undefined;
        } catch {
          return undefined; // not running
        }
      },
      shutDown: () => pgctl("-m", "fast", "-w", "stop"),
      startUp: startServer,
      async stop() {
        if (stopped) return;
        stopped = true;
        try {
          await pgctl("-m", "fast", "-w", "stop").catch(() => {}); // already down after shutDown()
          if (options.keepLogAt) await copyFile(path.join(dir, "server.log"), options.keepLogAt).catch(() => {});
        } finally {
          await rm(dir, { recursive: true, force: true });
        }
      },
    };
  } catch (err) {
    await pgctl("-m", "immediate", "stop").catch(() => {});
    await rm(dir, { recursive: true, force: true });
    throw err;
  }
}

async function exec(asRoot: boolean, file: string, args: string[]): Promise<void> {
  const [cmd, argv] = asRoot ? ["runuser", ["-u", "postgres", "--", file, ...args]] : [file, args];
  try {
    await run(cmd, argv, { env: { ...process.env, LC_ALL: "C" } });
  } catch (err) {
    const e = err as Error & { stderr?: string };
    throw new Error(`${path.basename(file)} ${args.join(" ")} failed: ${e.stderr?.trim() || e.message}`);
  }
}

async function lookupUser(name: string): Promise<{ uid: number; gid: number }> {
  const { stdout } = await run("id", [name]).catch(() => {
    throw new Error(`running as root needs a "${name}" system user to own the test cluster`);
  });
  const uid = /uid=(\d+)/.exec(stdout)?.[1];
  const gid = /gid=(\d+)/.exec(stdout)?.[1];
  if (!uid || !gid) throw new Error(`cannot parse \`id ${name}\`: ${stdout}`);
  return { uid: Number(uid), gid: Number(gid) };
}

function freePort(): Promise<number> {
  return new Promise((resolve, reject) => {
    const server = net.createServer();
    server.once("error", reject);
    server.listen(0, "127.0.0.1", () => {
      const address = server.address();
      server.close(() => (typeof address === "object" && address ? resolve(address.port) : reject(new Error("no port"))));
    });
  });
}
