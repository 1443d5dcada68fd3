// Device selection through the TS wrapper, the CLI and the service configuration, on a machine
// without a usable GPU (CI): `cuda` fails at once with a clear message and a code, `auto` runs on
// the CPU with the CPU engine's exact logits, bad device strings are refused before anything
// loads. (With a GPU, test/engine/gpu-engine.test.ts compares the CUDA engine with the CPU one.)
import { spawn } from "node:child_process";
import { mkdtemp, rm, writeFile } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { fileURLToPath } from "node:url";
import { afterAll, beforeAll, describe, expect, it } from "vitest";

import { ConfigError, loadConfig } from "../../shared/platform/config.ts";
import { Engine, loadModel, type LoadedModel } from "../../shared/inference/engine/engine.ts";
import { cudaStatus } from "../../shared/inference/engine/native.ts";
import { resolveModel } from "../../shared/inference/model/resolve.ts";
import { tinyLlama } from "../harness/gguf-writer.ts";

const status = cudaStatus();
const gpu = status.usable;
const root = fileURLToPath(new URL("../..", import.meta.url));

let dir: string;
let tinyPath: string;
let tiny: LoadedModel;

beforeAll(async () => {
  dir = await mkdtemp(join(tmpdir(), "ctxbank-device-"));
  tinyPath = join(dir, "tiny.gguf");
  await writeFile(tinyPath, tinyLlama());
  tiny = await loadModel(tinyPath);
});

afterAll(async () => {
  await rm(dir, { recursive: true, force: true });
});

function cli(args: string[], env: Record<string, string> = {}): Promise<{ code: number | null; stderr: string }> {
  return new Promise((resolve, reject) => {
    const child = spawn(join(root, "node_modules/.bin/tsx"), ["bin/ctxbank.ts", ...args], { cwd: root, env: { ...process.env, ...env } });
    let stderr = "";
    child.stderr.setEncoding("utf8").on("data", (d: string) => (stderr += d));
    child.on("error", reject);
    child.on("close", (code) => resolve({ code, stderr }));
    child.stdin.end();
  });
}

describe("cudaStatus", () => {
  it("says whether the build has CUDA and why a GPU cannot be used", () => {
    expect(typeof status.compiled).toBe("boolean");
    if (!status.usable) {
      if (status.compiled) expect(["no_gpu", "cuda_driver_too_old"]).toContain(status.code);
      else expect(status.code).toBe("cuda_unavailable_in_build");
      expect(status.message).toMatch(/\S/);
    }
  });
});

describe.skipIf(gpu)("without a usable GPU", () => {
  it("device cuda fails with the reason and its code", () => {
    for (const device of ["cuda", "cuda:0", "cuda:3"] as const) {
      let err: (Error & { code?: string }) | undefined;
      try {
        new Engine(tiny, { device });
      } catch (e) {
        err = e as Error & { code?: string };
      }
      expect(err, device).toBeInstanceOf(Error);
      expect(err!.code).toBe(status.code);
      expect(err!.message).toBe(status.message);
    }
  });

  it("device auto runs on the CPU, with the CPU engine's logits", async () => {
    const cpu = new Engine(tiny, { device: "cpu" });
    const auto = new Engine(tiny, { device: "auto" });
    expect(auto.device).toBe("cpu");
    expect(auto.native.info.deviceDescription).toMatch(/^CPU, /);
    expect(auto.native.info.deviceWeightBytes).toBe(0);
    const tokens = [1, 5, 9, 2, 7, 3, 11];
    const a = await cpu.prefill(cpu.createSequence(32), tokens);
    const b = await auto.prefill(auto.createSequence(32), tokens);
    expect(b).toEqual(a);
  });

  it("the CLI reports the reason and exits 1", async () => {
    // A model with a tokenizer (the tiny one has none): the default model.
    const r = await cli(["generate", "--model", await resolveModel(), "--raw", "--prompt", "hi", "--device", "cuda", "--max-tokens", "2"]);
    expect(r.code).toBe(1);
    expect(r.stderr).toContain(`ctxbank: ${status.message}`);
  }, 60_000);
});

describe("device strings", () => {
  it("the engine refuses a bad one with invalid_device", () => {
    for (const device of ["gpu", "cuda:", "cuda:01", "CUDA", ""]) {
      let err: (Error & { code?: string }) | undefined;
      try {
        new Engine(tiny, { device: device as "cpu" });
      } catch (e) {
        err = e as Error & { code?: string };
      }
      expect(err?.code, device).toBe("invalid_device");
    }
    expect(() => new Engine(tiny, { device: 1 as unknown as "cpu" })).toThrow(TypeError);
  });

  it("the engine refuses an unknown CUDA kernel set with invalid_cuda_kernels, on any device", () => {
    for (const cudaKernels of ["", "quick", "fast,", "matvec,gemm2", "FAST"]) {
      let err: (Error & { code?: string }) | undefined;
      try {
        new Engine(tiny, { device: "cpu", cudaKernels });
      } catch (e) {
        err = e as Error & { code?: string };
      }
      expect(err?.code, cudaKernels).toBe("invalid_cuda_kernels");
    }
    expect(() => new Engine(tiny, { cudaKernels: 1 as unknown as string })).toThrow(TypeError);
    expect(new Engine(tiny, { device: "cpu", cudaKernels: "matvec,gemm" }).native.info.cudaKernels).toBe("");
  });

  it("the engine says where it runs", () => {
    const e = new Engine(tiny, { device: "cpu" });
    expect(e.device).toBe("cpu");
    expect(e.native.info.device).toBe("cpu");
  });

  it("--device and CTXBANK_DEVICE for the services", () => {
    expect(loadConfig("serve", {}, {}).device).toBe("cpu");
    expect(loadConfig("serve", { device: "cuda:1" }, {}).device).toBe("cuda:1");
    expect(loadConfig("serve", {}, { CTXBANK_DEVICE: "auto" }).device).toBe("auto");
    expect(() => loadConfig("serve", {}, { CTXBANK_DEVICE: "gpu" })).toThrow(ConfigError);
    expect(() => loadConfig("serve", { device: "cuda:x" }, {})).toThrow(/--device: cpu, cuda, cuda:N or auto/);
  });

  it("the CLI refuses a bad --device or CTXBANK_DEVICE before loading anything", async () => {
    const r = await cli(["generate", "--model", join(dir, "missing.gguf"), "--prompt", "hi", "--device", "tpu"]);
    expect(r.code).toBe(2);
    expect(r.stderr).toContain("--device must be cpu, cuda, cuda:N or auto");
    const e = await cli(["generate", "--model", join(dir, "missing.gguf"), "--prompt", "hi"], { CTXBANK_DEVICE: "gpu" });
    expect(e.code).toBe(2);
    expect(e.stderr).toContain("$CTXBANK_DEVICE must be cpu, cuda, cuda:N or auto");
  }, 60_000);
});

describe("the services say which device runs the model", () => {
  it("/v1/models and /metrics (device auto, no GPU: cpu)", async () => {
    const { startServe } = await import("../harness/serve.ts");
    const s = await startServe({ device: gpu ? "cpu" : "auto", shardBytes: 8 << 20 });
    try {
      const models = (await (await fetch(`${s.url}/v1/models`)).json()) as { data: { id: string; device: string }[] };
      expect(models.data[0]!.device).toBe("cpu");
      const metrics = await (await fetch(`${s.url}/metrics`)).text();
      expect(metrics).toContain(`ctxbank:engine_device_info{model="${models.data[0]!.id}",device="cpu"} 1`);
    } finally {
      await s.stop();
    }
  }, 120_000);
});
