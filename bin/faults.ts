// Tests only: the fault points a test arms in a `ctxbank` process it starts, from
// `CTXBANK_FAULT_PAUSE=<point>:<ms>[,…]`: the first request that passes each named point waits
// there `ms` milliseconds (shared/platform/faults.ts names the points and says why). bin/serve.ts
// reads the variable once, at the process boundary, and puts the Faults in the configuration; a
// test in its own process passes a Faults object there instead. Nothing else reads a fault from the
// environment. Unset: no faults.
import { ConfigError } from "../shared/platform/config.ts";
import { FAULT_POINTS, Faults, type FaultPauses, type FaultPoint } from "../shared/platform/faults.ts";

export function faultsFromEnv(spec: string | undefined): Faults | undefined {
  if (spec === undefined || spec.trim() === "") return undefined;
  const pauses: FaultPauses = {};
  for (const part of spec.split(",")) {
    const m = /^\s*([a-z]+\.[a-z]+):(\d+)\s*$/.exec(part);
    if (!m || !Object.hasOwn(FAULT_POINTS, m[1]!)) {
      throw new ConfigError(
        `$CTXBANK_FAULT_PAUSE: "${part.trim()}" is not <point>:<ms> with a point among ${Object.keys(FAULT_POINTS).join(", ")}`,
      );
    }
    pauses[m[1] as FaultPoint] = Number(m[2]);
  }
  return new Faults(pauses);
}
