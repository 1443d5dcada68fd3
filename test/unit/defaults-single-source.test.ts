// Every default lives in shared/inference/defaults.ts and the policy's shape in
// shared/inference/policy/schema.ts. This test reads the product's sources (bin, services,
// shared, native/src) and fails when a second place writes one of them again:
// - a default value next to the name it is the default of (`temperature ?? 0.8`,
//   `int budget = 1024;`, `.default(2000)` on sloTtftMs, "(default 256)" in a --max-tokens help);
// - a declaration (interface, type literal, zod object, C++ struct) that lists a policy
//   sub-object's fields, other than the schema and the engine's C++ structs;
// - a default member initialiser in the C++ policy configurations (the engine holds none).
// The addon's parser is held to the schema's field list by test/engine/policy-schema.test.ts.
import { readdirSync, readFileSync, statSync } from "node:fs";
import { join } from "node:path";
import ts from "typescript";
import { describe, expect, it } from "vitest";

import { MAX_TOKENS_DEFAULTS, POLICY_DEFAULTS, SAMPLING_DEFAULTS, SLO_DEFAULTS } from "../../shared/inference/defaults.ts";
import { engineFieldNames, POLICY_PART_SCHEMAS } from "../../shared/inference/policy/schema.ts";

const ROOT = join(import.meta.dirname, "../..");
const PRODUCT = ["bin", "services", "shared", "native/src"];
const HOME = { defaults: "shared/inference/defaults.ts", schema: "shared/inference/policy/schema.ts" };

function files(dir: string): string[] {
  return readdirSync(join(ROOT, dir)).flatMap((name) => {
    const rel = join(dir, name);
    if (statSync(join(ROOT, rel)).isDirectory()) return name === "node_modules" || name === "build" ? [] : files(rel);
    return /\.(ts|cc|h|cu|cuh)$/.test(name) ? [rel] : [];
  });
}

const camel = (k: string) => k.replace(/_([a-z])/g, (_, c: string) => c.toUpperCase());
const kebab = (k: string) => camel(k).replace(/[A-Z]/g, (c) => `-${c.toLowerCase()}`);
/** Every way the sources spell a name: snake_case, camelCase, a --flag. */
const spellings = (...names: string[]) => [...new Set(names.flatMap((n) => [n, camel(n), kebab(n)]))];

interface Default {
  what: string;
  names: string[];
  value: number | string | boolean;
}

/** Each default with the names it goes by in the sources. */
function allDefaults(): Default[] {
  const out: Default[] = [];
  for (const [surface, s] of Object.entries(SAMPLING_DEFAULTS)) {
    out.push({ what: `sampling.${surface}.temperature`, names: spellings("temperature"), value: s.temperature });
    out.push({ what: `sampling.${surface}.topP`, names: spellings("top_p"), value: s.topP });
    out.push({ what: `sampling.${surface}.topK`, names: spellings("top_k"), value: s.topK });
  }
  for (const [k, v] of Object.entries(MAX_TOKENS_DEFAULTS))
    out.push({ what: `maxTokens.${k}`, names: [...spellings("max_tokens", "max_completion_tokens"), "DEFAULT_MAX_TOKENS"], value: v });
  for (const [part, fields] of Object.entries(POLICY_DEFAULTS)) {
    for (const [field, v] of Object.entries(fields)) out.push({ what: `policy.${part}.${field}`, names: spellings(field), value: v });
  }
  out.push({ what: "slo.ttftMs", names: [...spellings("slo_ttft_ms", "ttft_ms"), "slo-ttft"], value: SLO_DEFAULTS.ttftMs });
  out.push({ what: "slo.tpotMs", names: [...spellings("slo_tpot_ms", "tpot_ms"), "slo-tpot"], value: SLO_DEFAULTS.tpotMs });
  out.push({ what: "slo.admissionMargin", names: spellings("admission_margin", "margin"), value: SLO_DEFAULTS.admissionMargin });
  return out;
}

const escape = (s: string) => s.replace(/[.*+?^${}()|[\]\\-]/g, "\\$&");

/** The value as source writes it: 1024, 2_000, 0.5, 0.f, 0.0f, "last", true. */
function valuePattern(v: Default["value"]): string {
  if (typeof v === "boolean") return String(v);
  if (typeof v === "string")
    return `["'\`]${escape(v)}["'\`]|Selector::${escape(v.charAt(0).toUpperCase() + v.slice(1))}\\b|ScopeMode::${escape(v.charAt(0).toUpperCase() + v.slice(1))}\\b`;
  const digits = String(v).replace(".", "\\.");
  const grouped = v >= 1000 ? `|${escape(v.toLocaleString("en-US").replaceAll(",", "_"))}` : "";
  return `(?:${digits}${grouped})(?:\\.0*)?f?(?![\\w.])`;
}

/** Lines of `text` that give `d` its default value again: "<name> <assigning operator> <value>" on one line. */
export function rewrites(text: string, d: Default): string[] {
  const name = `(?<!\\w)(?:${d.names.map(escape).join("|")})(?!\\w)`;
  // name ?? v | name = v | name: v | name...default(v) | name...(default v   (no statement break between)
  const op = `(?:\\?\\?|(?<![=!<>])=(?!=)|:|\\.default\\(|\\(default|default:)`;
  const re = new RegExp(`${name}[^;\\n]{0,120}?${op}\\s*(?:${valuePattern(d.value)})`);
  return text.split("\n").filter((line) => re.test(line) && !/^\s*(\/\/|\*|#)/.test(line));
}

/** Declarations listing at least half of a policy sub-object's fields (3 at least), by name. */
export function shapeDeclarations(path: string, text: string): string[] {
  const parts = Object.entries(engineFieldNames())
    .map(([part, fields]) => ({
      part,
      names: new Set(fields.flatMap((f) => [f, f.replace(/[A-Z]/g, (c) => `_${c.toLowerCase()}`)])),
      n: fields.length,
    }))
    .filter((p) => p.n >= 3);
  const found: string[] = [];
  const check = (members: string[], where: string) => {
    for (const p of parts) {
      const hits = new Set(members.filter((m) => p.names.has(m)).map(camel));
      if (hits.size >= Math.max(3, Math.ceil(p.n / 2))) found.push(`${where}: ${p.part} fields ${[...hits].join(", ")}`);
    }
  };
  if (path.endsWith(".ts")) {
    const src = ts.createSourceFile(path, text, ts.ScriptTarget.Latest, true);
    const visit = (node: ts.Node) => {
      if (ts.isInterfaceDeclaration(node) || ts.isTypeLiteralNode(node)) {
        check(
          node.members.map((m) => (m.name && ts.isIdentifier(m.name) ? m.name.text : "")),
          `${path}:${src.getLineAndCharacterOfPosition(node.getStart()).line + 1}`,
        );
      }
      // z.object({ ... }) / z.strictObject({ ... }): a schema written again.
      if (
        ts.isCallExpression(node) &&
        /\b(object|strictObject|looseObject)$/.test(node.expression.getText()) &&
        node.arguments[0] &&
        ts.isObjectLiteralExpression(node.arguments[0])
      ) {
        check(
          node.arguments[0].properties.map((p) => (p.name && (ts.isIdentifier(p.name) || ts.isStringLiteral(p.name)) ? p.name.text : "")),
          `${path}:${src.getLineAndCharacterOfPosition(node.getStart()).line + 1}`,
        );
      }
      ts.forEachChild(node, visit);
    };
    visit(src);
  } else {
    for (const m of text.matchAll(/struct\s+(\w+)\s*\{([^}]*)\}/g)) {
      const members = [...m[2]!.matchAll(/\b(\w+)\s*(?:=[^;]*)?;/g)].map((x) => x[1]!);
      check(members, `${path} struct ${m[1]}`);
    }
  }
  return found;
}

/** The C++ policy configurations' members that carry an initialiser (a default). */
export function memberDefaults(header: string): string[] {
  const out: string[] = [];
  for (const m of header.matchAll(/struct\s+(\w+Config)\s*\{([^}]*)\}/g)) {
    const code = m[2]!.replace(/\/\/.*$/gm, "");
    for (const member of code.split(";")) {
      if (/=|\{[^}]*\}\s*$/.test(member)) out.push(`${m[1]}: ${member.trim()}`);
    }
  }
  return out;
}

describe("one place for each default and for the policy's shape", () => {
  const sources = PRODUCT.flatMap(files).map((path) => ({ path, text: readFileSync(join(ROOT, path), "utf8") }));

  it("reads the product's sources (the scan has something to scan)", () => {
    expect(sources.length).toBeGreaterThan(100);
    expect(sources.some((s) => s.path === "native/src/policy.h")).toBe(true);
  });

  it("writes no default a second time", () => {
    const found: string[] = [];
    for (const d of allDefaults()) {
      for (const { path, text } of sources) {
        if (path === HOME.defaults) continue;
        for (const line of rewrites(text, d)) found.push(`${d.what} = ${JSON.stringify(d.value)} in ${path}: ${line.trim()}`);
      }
    }
    expect(found).toEqual([]);
  });

  it("declares no policy sub-object's fields outside the schema and the engine's structs", () => {
    const found = sources
      .filter(({ path }) => path !== HOME.schema && path !== "native/src/policy.h")
      .flatMap(({ path, text }) => shapeDeclarations(path, text));
    expect(found).toEqual([]);
  });

  it("gives the engine's policy configurations no default member initialisers", () => {
    const header = readFileSync(join(ROOT, "native/src/policy.h"), "utf8");
    expect(header).toMatch(/struct OmniKvConfig/);
    expect(memberDefaults(header)).toEqual([]);
  });

  it("would catch each kind of second definition (the scanners are not blind)", () => {
    const d = allDefaults();
    const find = (what: string) => d.find((x) => x.what === what)!;
    expect(rewrites("  const t = o.temperature ?? 0.8;", find("sampling.cli.temperature"))).toHaveLength(1);
    expect(rewrites("  sloTtftMs: sloMs.default(2_000),", find("slo.ttftMs"))).toHaveLength(1);
    expect(rewrites("  --max-tokens N  most tokens (default 256, less if short)", find("maxTokens.generate"))).toHaveLength(1);
    expect(rewrites("  int budget = 1024;  // tokens", find("policy.omnikv.budget"))).toHaveLength(1);
    expect(rewrites("  float lazy_iou = 0.f;", find("policy.omnikv.lazy_iou"))).toHaveLength(1);
    expect(rewrites("  Selector selector = Selector::Last;", find("policy.omnikv.selector"))).toHaveLength(1);
    expect(rewrites('  cfg.recent = int_field(ho, "recent", cfg.recent); // fallback', find("policy.h2o.recent"))).toHaveLength(0);
    expect(rewrites("  const ring = options.ring ?? 4;", find("policy.streaming.sinks"))).toHaveLength(0);
    expect(
      shapeDeclarations("x.ts", "interface O { filterLayers: number[]; budget: number; selector?: string; guard?: boolean }"),
    ).toHaveLength(1);
    expect(shapeDeclarations("x.ts", "const S = z.object({ beta1: Count, beta2: Count, max_output: Count, alpha1: Count });")).toHaveLength(
      1,
    );
    expect(shapeDeclarations("x.h", "struct ScopeCfg { int beta1; int beta2; int max_output; int alpha1; };")).toHaveLength(1);
    expect(memberDefaults("struct H2oConfig { int budget = 1024; int recent; };")).toHaveLength(1);
    expect(Object.keys(POLICY_PART_SCHEMAS)).toEqual(Object.keys(POLICY_DEFAULTS));
  });
});
