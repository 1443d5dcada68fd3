// `node --import ./test/harness/record-imports.mjs …` appends one line per module import the
// process resolves, "parent URL<TAB>resolved URL", to the file named by $CTXBANK_IMPORT_LOG: the
// import graph a run really loaded (test/unit/architecture.test.ts checks `ctxbank generate`'s).
import { appendFileSync } from "node:fs";
import { register } from "node:module";
import { isMainThread } from "node:worker_threads";

let log;

/** Runs in the loader thread with the data given to register(). */
export function initialize(data) {
  log = data.log;
}

export async function resolve(specifier, context, next) {
  const resolved = await next(specifier, context);
  appendFileSync(log, `${context.parentURL ?? ""}\t${resolved.url}\n`);
  return resolved;
}

if (isMainThread) {
  if (!process.env.CTXBANK_IMPORT_LOG) throw new Error("record-imports.mjs: set CTXBANK_IMPORT_LOG to the log file");
  register(import.meta.url, { data: { log: process.env.CTXBANK_IMPORT_LOG } });
}
