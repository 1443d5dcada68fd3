import { defineConfig } from "vitest/config";

export default defineConfig({
  test: {
    include: ["test/**/*.test.ts"],
    // Model-backed tests load a 98 MB GGUF and run real forward passes on 2 cores.
    testTimeout: 300_000,
    hookTimeout: 300_000,
    // One engine per file at a time keeps memory and CPU contention predictable on small machines.
    fileParallelism: false,
  },
});
