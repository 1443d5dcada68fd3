// `ctxbank serve` for a test. `startServe(overrides)`: both services in the test's own process on
// one engine (PGlite unless the overrides name a database) and a fresh shard directory, what most
// service tests start; flags and the environment are never read there, a test's settings are its
// overrides (`testConfig` builds the configuration, for tests that start their own roles).
// `startServeProcess(args)`: the same as a child process (`tsx bin/ctxbank.ts serve`, through
// tools/lib/services.ts), for tests of the process itself. `startDecodeBeside`: a decode-only
// service on a running serve's runtime.
import type { Logger } from "pino";
import type { Faults } from "../../shared/platform/faults.ts";
import { loadConfig, type Config } from "../../shared/platform/config.ts";
import { startServices, type RunningServices } from "../../services/process.ts";
import { createLogger, openRuntime, type Runtime } from "../../services/runtime.ts";
import { startService, tempShardDir, type ServiceProcess } from "../../tools/lib/services.ts";

/** Settings a test gives, by their names in Config (as loadConfig's overrides). */
export type ConfigOverrides = NonNullable<Parameters<typeof loadConfig>[3]>;

/** What a fixture's settings default to: any free port, one engine thread, a 64 MiB shard, no log. */
export const TEST_DEFAULTS = { port: 0, threads: 1, shardBytes: 64 << 20, logLevel: "silent" } as const satisfies ConfigOverrides;

/** A `serve` configuration from TEST_DEFAULTS and `overrides` (a shard directory among them). */
export function testConfig(overrides: ConfigOverrides & { shardDir: string }): Config {
  return loadConfig("serve", {}, {}, { ...TEST_DEFAULTS, ...overrides });
}

export interface Serve extends RunningServices {
  /** The shard directory: the fixture's own (removed at stop) unless the overrides named one. */
  readonly shardDir: string;
  /** Stops the services (gracefully), then closes the runtime and removes the shard directory the fixture made. Safe to call more than once. */
  stop(): Promise<void>;
}

export interface ServeOptions {
  /**
   * The services' logger (default: one at the configuration's level). With one, the fixture
   * opens the runtime itself and closes it at stop.
   */
  log?: (config: Config) => Logger;
  /** Fault points to arm (shared/platform/faults.ts). */
  faults?: Faults;
}

/** Starts `serve` in this process: TEST_DEFAULTS, then `overrides`. */
export async function startServe(overrides: ConfigOverrides = {}, options: ServeOptions = {}): Promise<Serve> {
  const own = overrides.shardDir === undefined ? await tempShardDir() : undefined;
  let rt: Runtime | undefined;
  try {
    const config: Config = { ...testConfig({ ...overrides, shardDir: overrides.shardDir ?? own!.dir }), faults: options.faults };
    if (options.log) rt = await openRuntime(config, options.log(config));
    const running = await startServices(config, rt);
    let stopping: Promise<void> | undefined;
    return {
      ...running,
      shardDir: config.shardDir,
      stop() {
        stopping ??= (async () => {
          try {
            await running.stop();
          } finally {
            try {
              await rt?.close();
            } finally {
              await own?.remove();
            }
          }
        })();
        return stopping;
      },
    };
  } catch (err) {
    await rt?.close();
    await own?.remove();
    throw err;
  }
}

export interface ServeProcess extends ServiceProcess {
  /** The shard directory: the fixture's own (removed after the process stops or is killed) unless args named one. */
  readonly shardDir: string;
}

/**
 * `ctxbank serve` as a child process: one engine thread and a 64 MiB shard in a fresh directory,
 * then `args` (a flag given again wins; a `--shard-dir` in them is the caller's, kept), with `env`
 * added to the environment.
 */
export async function startServeProcess(args: string[] = [], env: Record<string, string> = {}): Promise<ServeProcess> {
  const given = args.indexOf("--shard-dir");
  const own = given < 0 ? await tempShardDir() : undefined;
  const shardDir = own?.dir ?? args[given + 1]!;
  const defaults = [
    "--threads",
    String(TEST_DEFAULTS.threads),
    "--shard-bytes",
    String(TEST_DEFAULTS.shardBytes),
    ...(own ? ["--shard-dir", own.dir] : []),
  ];
  let p: ServiceProcess;
  try {
    p = await startService("serve", [...defaults, ...args], env);
  } catch (err) {
    await own?.remove();
    throw err;
  }
  return {
    ...p,
    shardDir,
    async stop(ms?: number) {
      try {
        return await p.stop(ms);
      } finally {
        await own?.remove();
      }
    },
    async kill() {
      try {
        await p.kill();
      } finally {
        await own?.remove();
      }
    },
  };
}

/** A logger writing the services' JSON lines to `write` (to read what they logged). */
export function logTo(write: (line: string) => void): (config: Config) => Logger {
  return (config) => createLogger(config, { write });
}

/**
 * A decode-only service beside a running `serve`, in the same process and on its runtime (model,
 * engine, registry): what a `ctxbank decode` process is. Its own requests are prefilled by the
 * registry's prefill instances (the serve's prefill), their KV read from the shard; the serve's
 * decode keeps handing its own over in process.
 */
export function startDecodeBeside(serve: RunningServices, overrides: Partial<Config> = {}): Promise<RunningServices> {
  const config: Config = {
    ...serve.rt.config,
    role: "decode",
    instanceId: `${serve.rt.config.instanceId}.decode-only`,
    port: 0,
    internalPort: 0,
    publicUrl: undefined,
    internalUrl: undefined,
    internalSecret: serve.security.internalSecret, // its prefill calls and chunk reads are signed for the serve's listener
    ...overrides,
  };
  return startServices(config, { ...serve.rt, config });
}

/**
 * The flags every process of a multi-process test shares: one thread, the test's PostgreSQL and
 * shard directory, and, when given, heartbeats fast enough that a killed process is noticed in
 * the test's time.
 */
export function clusterArgs(o: { databaseUrl: string; shardDir: string; heartbeat?: { everyMs: number; timeoutMs: number } }): string[] {
  const heartbeat = o.heartbeat
    ? ["--heartbeat-ms", String(o.heartbeat.everyMs), "--heartbeat-timeout-ms", String(o.heartbeat.timeoutMs)]
    : [];
  return ["--threads", "1", "--database-url", o.databaseUrl, "--shard-dir", o.shardDir, ...heartbeat];
}
