// Reads a Dockerfile into instructions and stages (line continuations, comments and parser
// directives handled; heredocs are not used here and are refused), and evaluates .dockerignore
// patterns the way BuildKit does: the last matching pattern wins, `!` re-includes, and a pattern
// that matches a parent directory covers everything below it.

export interface Instruction {
  keyword: string; // upper case
  /** Flags such as --from=deps, --chown=1:1 (name -> value). */
  flags: Record<string, string>;
  /** The arguments after the flags, as written. */
  rest: string;
  line: number;
}

export interface Stage {
  name: string | undefined;
  /** The image after ARG defaults are substituted. */
  image: string;
  instructions: Instruction[];
}

export function parseDockerfile(text: string): { args: Record<string, string>; stages: Stage[] } {
  const instructions: Instruction[] = [];
  const lines = text.split("\n");
  for (let i = 0; i < lines.length; i++) {
    const start = i;
    let line = lines[i]!;
    if (/^\s*(#.*)?$/.test(line)) continue;
    while (/\\\s*$/.test(line) && i + 1 < lines.length) {
      i++;
      const next = lines[i]!;
      if (/^\s*#/.test(next)) continue; // comment lines inside a continuation are dropped
      line = line.replace(/\\\s*$/, " ") + next;
    }
    const m = /^\s*([A-Za-z]+)\s+(.*)$/.exec(line);
    if (!m) throw new Error(`Dockerfile line ${start + 1}: cannot parse ${JSON.stringify(line)}`);
    if (/<<-?["']?[A-Z]/.test(m[2]!)) throw new Error(`Dockerfile line ${start + 1}: heredocs are not supported by this reader`);
    const flags: Record<string, string> = {};
    let rest = m[2]!.trim();
    for (let f = /^--([a-z-]+)(?:=(\S*))?\s+/.exec(rest); f; f = /^--([a-z-]+)(?:=(\S*))?\s+/.exec(rest)) {
      flags[f[1]!] = f[2] ?? "";
      rest = rest.slice(f[0].length);
    }
    instructions.push({ keyword: m[1]!.toUpperCase(), flags, rest, line: start + 1 });
  }
  // ARGs before the first FROM are global and usable in FROM lines.
  const args: Record<string, string> = {};
  const stages: Stage[] = [];
  for (const ins of instructions) {
    if (ins.keyword === "FROM") {
      const m = /^(\S+)(?:\s+AS\s+(\S+))?$/i.exec(ins.rest);
      if (!m) throw new Error(`Dockerfile line ${ins.line}: bad FROM`);
      const image = m[1]!.replace(/\$\{(\w+)\}|\$(\w+)/g, (_, a: string | undefined, b: string | undefined) => args[(a ?? b)!] ?? "");
      stages.push({ name: m[2], image, instructions: [] });
    } else if (stages.length === 0) {
      if (ins.keyword !== "ARG") throw new Error(`Dockerfile line ${ins.line}: ${ins.keyword} before the first FROM`);
      const [name, value] = ins.rest.split("=", 2) as [string, string | undefined];
      args[name.trim()] = (value ?? "").trim();
    } else {
      stages.at(-1)!.instructions.push(ins);
    }
  }
  return { args, stages };
}

/** The JSON array of an exec-form instruction (CMD ["a"]), or undefined for the shell form. */
export function execForm(rest: string): string[] | undefined {
  if (!rest.trim().startsWith("[")) return undefined;
  const parsed: unknown = JSON.parse(rest);
  return Array.isArray(parsed) && parsed.every((s) => typeof s === "string") ? parsed : undefined;
}

/** COPY/ADD sources and destination (exec form or space-separated). */
export function copyPaths(ins: Instruction): { sources: string[]; dest: string } {
  const parts = execForm(ins.rest) ?? ins.rest.split(/\s+/);
  if (parts.length < 2) throw new Error(`Dockerfile line ${ins.line}: ${ins.keyword} needs a source and a destination`);
  return { sources: parts.slice(0, -1), dest: parts.at(-1)! };
}

function globToRegExp(glob: string): RegExp {
  let re = "";
  for (let i = 0; i < glob.length; i++) {
    const c = glob[i]!;
    if (c === "*" && glob[i + 1] === "*") {
      // `**/` matches any number of directories, including none.
      re += glob[i + 2] === "/" ? "(?:.*/)?" : ".*";
      i += glob[i + 2] === "/" ? 2 : 1;
    } else if (c === "*") re += "[^/]*";
    else if (c === "?") re += "[^/]";
    else re += c.replace(/[.+^${}()|[\]\\]/g, "\\$&");
  }
  return new RegExp(`^${re}$`);
}

/** .dockerignore patterns (comments and blank lines dropped, leading `/` and trailing `/` removed). */
export function parseDockerignore(text: string): { negate: boolean; re: RegExp; pattern: string }[] {
  return text
    .split("\n")
    .map((l) => l.trim())
    .filter((l) => l !== "" && !l.startsWith("#"))
    .map((l) => {
      const negate = l.startsWith("!");
      const pattern = (negate ? l.slice(1) : l).replace(/^\/+/, "").replace(/\/+$/, "");
      return { negate, re: globToRegExp(pattern), pattern };
    });
}

/** Whether a context-relative path is left out of the build context. */
export function isIgnored(relPath: string, patterns: ReturnType<typeof parseDockerignore>): boolean {
  const parts = relPath.replace(/^\.\//, "").replace(/\/+$/, "").split("/");
  const candidates = parts.map((_, i) => parts.slice(0, i + 1).join("/"));
  let ignored = false;
  for (const p of patterns) {
    if (candidates.some((c) => p.re.test(c))) ignored = !p.negate;
  }
  return ignored;
}
