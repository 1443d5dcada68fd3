// Parses the Prometheus text exposition format (version 0.0.4, what prom-client writes) into
// metric families. Runs in the browser (the dashboard) and in Node (its unit tests), so it is
// plain JavaScript with no imports; prom-parse.d.ts gives TypeScript its types.
//
// A sample belongs to the family its `# TYPE` line declares: `x_bucket`, `x_sum` and `x_count`
// to histogram (or summary) `x`, `x_total` to counter `x` where the TYPE line names `x`.
// A sample with no TYPE line is its own family of type "untyped". Malformed lines are skipped and
// reported in `errors` (a dashboard should show what it can rather than nothing).

const NAME = /^[a-zA-Z_:][a-zA-Z0-9_:]*/;
const LABEL_NAME = /^[a-zA-Z_][a-zA-Z0-9_]*/;
const SUFFIXES = {
  histogram: ["_bucket", "_sum", "_count", "_created"],
  summary: ["_sum", "_count", "_created"],
  counter: ["_total", "_created"],
};

/** A Prometheus float: decimal or exponent notation, NaN, +Inf, -Inf (case-insensitive). */
export function parseValue(text) {
  const t = text.toLowerCase();
  if (t === "nan") return NaN;
  if (t === "+inf" || t === "inf") return Infinity;
  if (t === "-inf") return -Infinity;
  if (!/^[+-]?(\d+\.?\d*|\.\d+)(e[+-]?\d+)?$/.test(t)) return undefined;
  return Number(t);
}

/** Reads `{a="x",b="y"}` starting at `s[0] === "{"`; returns the labels and the rest of the line. */
function readLabels(s) {
  const labels = {};
  let i = 1;
  for (;;) {
    while (s[i] === " " || s[i] === "\t") i++;
    if (s[i] === "}") return { labels, rest: s.slice(i + 1) };
    const m = LABEL_NAME.exec(s.slice(i));
    if (!m) throw new Error("bad label name");
    const name = m[0];
    i += name.length;
    while (s[i] === " " || s[i] === "\t") i++;
    if (s[i] !== "=") throw new Error(`expected = after label ${name}`);
    i++;
    while (s[i] === " " || s[i] === "\t") i++;
    if (s[i] !== '"') throw new Error(`expected a quoted value for label ${name}`);
    i++;
    let value = "";
    for (;;) {
      const c = s[i];
      if (c === undefined) throw new Error(`unterminated value for label ${name}`);
      if (c === '"') break;
      if (c === "\\") {
        const n = s[i + 1];
        value += n === "n" ? "\n" : n === "\\" ? "\\" : n === '"' ? '"' : `\\${n ?? ""}`;
        i += 2;
      } else {
        value += c;
        i++;
      }
    }
    i++;
    if (Object.hasOwn(labels, name)) throw new Error(`duplicate label ${name}`);
    labels[name] = value;
    while (s[i] === " " || s[i] === "\t") i++;
    if (s[i] === ",") i++;
    else if (s[i] !== "}") throw new Error("expected , or } after a label");
  }
}

function unescapeHelp(text) {
  return text.replace(/\\(n|\\)/g, (_, c) => (c === "n" ? "\n" : "\\"));
}

/** The family a sample name belongs to, given the TYPE lines seen so far. */
function familyOf(name, families) {
  if (families.has(name)) return families.get(name);
  for (const [type, suffixes] of Object.entries(SUFFIXES)) {
    for (const suffix of suffixes) {
      if (!name.endsWith(suffix)) continue;
      const f = families.get(name.slice(0, -suffix.length));
      if (f && f.type === type) return f;
    }
  }
  return undefined;
}

function family(families, name) {
  let f = families.get(name);
  if (!f) {
    f = { name, type: "untyped", help: "", samples: [] };
    families.set(name, f);
  }
  return f;
}

/**
 * @param {string} text the body of a /metrics answer
 * @returns {{ families: Map<string, {name: string, type: string, help: string, samples: {name: string, labels: Record<string, string>, value: number}[]}>, errors: string[] }}
 */
export function parsePrometheus(text) {
  const families = new Map();
  const errors = [];
  const lines = text.split("\n");
  for (let n = 0; n < lines.length; n++) {
    const line = lines[n].trim();
    if (line === "") continue;
    if (line.startsWith("#")) {
      const m = /^#\s*(HELP|TYPE)\s+(\S+)\s*(.*)$/.exec(line);
      if (!m) continue; // a plain comment
      const [, kind, name, rest] = m;
      if (!NAME.test(name) || NAME.exec(name)[0] !== name) {
        errors.push(`line ${n + 1}: bad metric name in ${kind}`);
        continue;
      }
      if (kind === "HELP") family(families, name).help = unescapeHelp(rest);
      else family(families, name).type = ["counter", "gauge", "histogram", "summary", "untyped"].includes(rest) ? rest : "untyped";
      continue;
    }
    try {
      const m = NAME.exec(line);
      if (!m) throw new Error("no metric name");
      const name = m[0];
      let rest = line.slice(name.length).trimStart();
      let labels = {};
      if (rest.startsWith("{")) ({ labels, rest } = readLabels(rest));
      const parts = rest.trim().split(/\s+/);
      if (parts.length < 1 || parts.length > 2 || parts[0] === "") throw new Error("expected a value and an optional timestamp");
      const value = parseValue(parts[0]);
      if (value === undefined) throw new Error(`bad value ${JSON.stringify(parts[0])}`);
      (familyOf(name, families) ?? family(families, name)).samples.push({ name, labels, value });
    } catch (err) {
      errors.push(`line ${n + 1}: ${err instanceof Error ? err.message : String(err)}`);
    }
  }
  return { families, errors };
}
