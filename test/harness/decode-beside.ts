// A decode-only service beside a running `serve`, in the same process and on its runtime (model,
// engine, registry): what a `ctxbank decode` process is. Its own requests are prefilled by the
// registry's prefill instances (the serve's prefill), their KV read from the shard; the serve's
// decode keeps handing its own over in process.
import type { Config } from "../../shared/platform/config.ts";
import { startServices, type RunningServices } from "../../services/process.ts";

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
