// A process with two engines must exit cleanly: at teardown Node finalizes each engine's
// thread-safe function itself, and releasing it again used to abort the process (exit 134).
import { spawnSync } from "node:child_process";
import { fileURLToPath } from "node:url";
import { expect, it } from "vitest";

import { resolveModel } from "../../shared/inference/model/resolve.ts";

it("two engines in one process exit with status 0", async () => {
  const modelPath = await resolveModel();
  const addon = fileURLToPath(new URL("../../native/build/Release/ctxbank_native.node", import.meta.url));
  const script = `
    const n = require(${JSON.stringify(addon)});
    (async () => {
      const model = await n.loadModel(${JSON.stringify(modelPath)});
      const engines = [new n.NativeEngine(model), new n.NativeEngine(model)];
      for (const e of engines) await e.forward([{ seq: e.createSequence(16), tokens: Int32Array.of(1, 2, 3) }]);
      console.log("ok");
    })();`;
  const run = spawnSync(process.execPath, ["-e", script], { encoding: "utf8", timeout: 60_000 });
  expect(run.stdout.trim()).toBe("ok");
  expect(run.status).toBe(0);
});
