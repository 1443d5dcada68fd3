// `ctxbank serve | prefill | decode`: run the services. `serve` runs both in one process with an
// embedded PGlite unless DATABASE_URL says otherwise (what `npm start` runs); `prefill` and
// `decode` run one service each against a shared PostgreSQL (DATABASE_URL), on any host and port;
// `router` sends clients' requests to the decodes.
import { parseArgs } from "node:util";
import { UsageError } from "../shared/inference/errors.ts";
import { ConfigError, configFlags, configHelp, loadConfig, type Config, type ServiceRole } from "../shared/platform/config.ts";
import { faultsFromEnv } from "./faults.ts";

export const SERVICE_COMMANDS: readonly string[] = ["serve", "prefill", "decode", "router"];

const ABOUT: Record<ServiceRole, string> = {
  serve: "both services in one process (default database: embedded PGlite, pglite://memory)",
  prefill: "the prefill service alone (needs DATABASE_URL=postgres://…)",
  decode: "the decode service with the OpenAI-compatible API (needs DATABASE_URL=postgres://…)",
  router:
    "the router in front of the decodes: each request goes to the decode holding its session, else the least loaded (needs DATABASE_URL=postgres://…; loads no model)",
};

export function serviceUsage(role: ServiceRole): string {
  return `Usage: ctxbank ${role} [options]

Runs ${ABOUT[role]}.
Every option can also be set by the environment variable in brackets.

${configHelp()}
  -h, --help               show this help
`;
}

/** Runs a service command until SIGINT/SIGTERM; returns the exit code. */
export async function serviceCommand(role: ServiceRole, argv: string[]): Promise<number> {
  let values: Record<string, string | boolean | undefined>;
  try {
    ({ values } = parseArgs({
      args: argv,
      options: { ...configFlags(), help: { type: "boolean", short: "h" } },
      allowPositionals: false,
      strict: true,
    }));
  } catch (e) {
    throw new UsageError((e as Error).message.split(/\.\s/)[0]!.replace(/^Unknown option/, "unknown option"));
  }
  if (values.help) {
    process.stdout.write(serviceUsage(role));
    return 0;
  }
  let config: Config;
  try {
    config = { ...loadConfig(role, values), faults: faultsFromEnv(process.env.CTXBANK_FAULT_PAUSE) };
  } catch (e) {
    if (e instanceof ConfigError) throw new UsageError(e.message);
    throw e;
  }
  // Loaded here, not at the top: `ctxbank generate` shares this file and must not load the HTTP stack.
  const { runUntilSignalled } = await import("../services/process.ts");
  await runUntilSignalled(config);
  return 0;
}
