// What every bench repeats: its command line (the bench's own options plus the common --out,
// --quick, --replot and --help), the record that makes a result reproducible (command, date,
// machine, git state), and writing the results: JSON, markdown tables and SVG charts, in
// results/<bench>/ unless --out says otherwise. A --quick run writes to a temporary folder unless
// --out is given, so a smoke run never overwrites committed results.
import { readFile } from "node:fs/promises";
import os from "node:os";
import { join, relative, resolve } from "node:path";
import { parseArgs, type ParseArgsConfig } from "node:util";

import { writeFileAtomic, writeJson } from "./json.ts";
import { gitInfo, machineInfo, type GitInfo, type MachineInfo } from "./machine.ts";

export const REPO_ROOT = resolve(import.meta.dirname, "../..");

type Options = NonNullable<ParseArgsConfig["options"]>;
type Values<O extends Options> = ReturnType<typeof parseArgs<{ options: O; strict: true }>>["values"];

/** Where one bench's committed results live. */
export function resultsDir(bench: string): string {
  return join(REPO_ROOT, "results", bench);
}

/** A folder of results: JSON, markdown and SVG charts, each written atomically. */
export class Results {
  constructor(readonly dir: string) {}

  /** `<dir>/<name>.json`, floats rounded to `digits` significant digits. */
  async json(name: string, value: unknown, digits?: number): Promise<void> {
    await writeJson(join(this.dir, `${name}.json`), value, digits);
  }

  async markdown(name: string, text: string): Promise<void> {
    await writeFileAtomic(join(this.dir, `${name}.md`), text);
  }

  /** Charts are SVG only: text, so a changed chart shows as a diff. */
  async chart(name: string, svg: string): Promise<void> {
    await writeFileAtomic(join(this.dir, `${name}.svg`), svg);
  }

  async readJson<T>(name: string): Promise<T> {
    return JSON.parse(await readFile(join(this.dir, `${name}.json`), "utf8")) as T;
  }

  /** The folder as a path from the repository root when it is inside it (for logs and records). */
  toString(): string {
    const rel = relative(REPO_ROOT, this.dir);
    return rel.startsWith("..") ? this.dir : rel;
  }
}

export interface RunRecord {
  /** The command line that produced the result. */
  command: string;
  /** When the run started (ISO 8601). */
  date: string;
  machine: MachineInfo;
  /** The commit, and which of `watchPaths` had uncommitted changes. */
  git: GitInfo;
}

export function runRecord(command: string, watchPaths: string[] = []): RunRecord {
  return { command, date: new Date().toISOString(), machine: machineInfo(), git: gitInfo(REPO_ROOT, watchPaths) };
}

export interface BenchSpec<O extends Options> {
  /** Its results go to results/<name>/. */
  name: string;
  /** How it is started, up to its options ("npm run bench:engine --"); recorded commands begin with it. */
  script: string;
  /** The bench's own options, for parseArgs, and their lines for --help. */
  options?: O;
  help?: string;
  /** What --quick does, for --help; a bench without it has no --quick. */
  quick?: string;
  /** Whether it has --replot: redraw the tables and charts from the JSON in --out, measuring nothing. */
  replot?: boolean;
}

export interface Bench<V> {
  /** The bench's own options as parsed. */
  values: V;
  quick: boolean;
  replot: boolean;
  /** Where this run writes (and --replot reads). */
  results: Results;
  /** The run's command line, as recorded. */
  command: string;
  /** The record of this run, taken now; `watchPaths` are the folders whose uncommitted changes matter. */
  record(watchPaths?: string[]): RunRecord;
}

/** Parses the command line of a bench; prints --help and exits when asked. */
export function benchCli<const O extends Options = Record<never, never>>(
  spec: BenchSpec<O>,
  argv = process.argv.slice(2),
): Bench<Values<O>> {
  const common = {
    out: { type: "string" },
    help: { type: "boolean", short: "h" },
    ...(spec.quick !== undefined ? { quick: { type: "boolean" } } : {}),
    ...(spec.replot ? { replot: { type: "boolean" } } : {}),
  } satisfies Options;
  const { values } = parseArgs({ args: argv, options: { ...spec.options, ...common }, strict: true });
  if (values.help) {
    process.stdout.write(helpText(spec));
    process.exit(0);
  }
  const quick = values.quick === true;
  const out =
    typeof values.out === "string" ? resolve(values.out) : quick ? join(os.tmpdir(), "ctxbank-bench", spec.name) : resultsDir(spec.name);
  // Without options an npm script needs no "--" before them.
  const command = argv.length > 0 ? `${spec.script} ${argv.join(" ")}` : spec.script.replace(/ --$/, "");
  return {
    values: values as Values<O>,
    quick,
    replot: values.replot === true,
    results: new Results(out),
    command,
    record: (watchPaths) => runRecord(command, watchPaths),
  };
}

function helpText(spec: BenchSpec<Options>): string {
  // The common options' descriptions line up with the bench's own.
  const column = (spec.help && /^ +\S+(?: \S+)? {2,}/.exec(spec.help)?.[0].length) || 19;
  const option = (flag: string, text: string) => `  ${flag}`.padEnd(column) + text;
  const lines = [`Usage: ${spec.script} [options]`, ""];
  if (spec.help) lines.push(spec.help);
  if (spec.quick !== undefined) lines.push(option("--quick", `${spec.quick}; writes to a temporary folder unless --out is given`));
  if (spec.replot) lines.push(option("--replot", "only redraw the tables and charts from the JSON in --out"));
  lines.push(option("--out DIR", `results folder (default results/${spec.name})`), "  -h, --help", "");
  return lines.join("\n");
}
