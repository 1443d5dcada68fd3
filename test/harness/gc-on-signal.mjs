// Preloaded into a service under test (NODE_OPTIONS="--expose-gc --import <this file>"): SIGUSR2
// runs a full garbage collection, so a test can read the process's memory without the garbage
// V8 has not collected yet. Memory then measures what is retained, not when V8 last collected.
import { isMainThread } from "node:worker_threads";

if (isMainThread && typeof globalThis.gc === "function") {
  process.on("SIGUSR2", () => {
    globalThis.gc();
    globalThis.gc(); // a second pass frees what the first one's finalizers released
  });
}
