// The planner's hardware figures: each one given on the command line, or else probed.
import os from "node:os";
import type { Hardware } from "./costs.ts";
import type { ProbeResult } from "./probe.ts";

/** Given figures win; the rest come from the probe (the link: shm or loopback TCP). */
export function hardwareFrom(
  probe: ProbeResult | undefined,
  given: Partial<Record<"flops" | "decodeFlops" | "memBw" | "mem" | "linkBw", number>>,
  link: "shm" | "tcp",
): Hardware {
  const need = <T>(v: T | undefined, what: string): T => {
    if (v === undefined) throw new Error(`no ${what}: give it or let it be probed`);
    return v;
  };
  const decode = given.decodeFlops ?? probe?.flops1;
  return {
    flops: need(given.flops ?? probe?.flops, "--flops"),
    memBw: need(given.memBw ?? probe?.memReadBw, "--mem-bw"),
    memBytes: given.mem ?? probe?.memBytes ?? os.totalmem(),
    linkBw: need(given.linkBw ?? (link === "shm" ? probe?.shmBw : probe?.tcpBw), "--link-bw"),
    ...(decode !== undefined ? { decodeFlops: { rate: decode, upToBatch: 4 } } : {}),
  };
}
