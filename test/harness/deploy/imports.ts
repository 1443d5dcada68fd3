// What a TypeScript entry point needs at run time: the local files it imports (transitively), the
// files they read next to themselves (`new URL("./x", import.meta.url)`), and the npm packages
// they import or resolve. Type-only imports are left out (tsx erases them). Used to check that
// the runtime image holds every file the service loads, and that none of its packages is a
// devDependency (the image installs production dependencies only).
import { existsSync, readFileSync } from "node:fs";
import { builtinModules } from "node:module";
import path from "node:path";

export interface RuntimeNeeds {
  /** Source files reached from the entry point (absolute). */
  modules: string[];
  /** Files and directories read through new URL(…, import.meta.url) (absolute). */
  assets: string[];
  /** npm package names (scope included). */
  packages: string[];
}

const BUILTINS = new Set(builtinModules);
// `import … from "x"`, `export … from "x"`, `import "x"`; type-only forms are filtered below.
const STATIC = /^\s*(import|export)\s+(type\s+)?([^;]*?)\s+from\s+["']([^"']+)["']|^\s*import\s+["']([^"']+)["']/gm;
const DYNAMIC = /\bimport\(\s*["']([^"']+)["']\s*\)/g;
const ASSET = /new URL\(\s*["'](\.{1,2}\/[^"']+)["']\s*,\s*import\.meta\.url\s*\)/g;
const RESOLVE = /\.resolve\(\s*[`"']((?:@[^/`"'$]+\/)?[^/`"'$.][^/`"'$]*)/g;

function packageName(spec: string): string {
  const parts = spec.split("/");
  return spec.startsWith("@") ? parts.slice(0, 2).join("/") : parts[0]!;
}

/** Whether an import clause brings in values (not `{ type A, type B }` alone). */
function importsValues(clause: string): boolean {
  const braces = /^\{([^}]*)\}$/.exec(clause.trim());
  if (!braces) return true;
  const names = braces[1]!
    .split(",")
    .map((s) => s.trim())
    .filter(Boolean);
  return names.length === 0 || names.some((n) => !n.startsWith("type "));
}

export function runtimeNeeds(entry: string): RuntimeNeeds {
  const modules = new Set<string>();
  const assets = new Set<string>();
  const packages = new Set<string>();
  const queue = [path.resolve(entry)];
  while (queue.length > 0) {
    const file = queue.pop()!;
    if (modules.has(file)) continue;
    modules.add(file);
    const text = readFileSync(file, "utf8");
    const specs: string[] = [];
    for (const m of text.matchAll(STATIC)) {
      if (m[5] !== undefined) specs.push(m[5]);
      else if (!m[2] && importsValues(m[3]!)) specs.push(m[4]!);
    }
    for (const m of text.matchAll(DYNAMIC)) specs.push(m[1]!);
    for (const m of text.matchAll(ASSET)) assets.add(path.resolve(path.dirname(file), m[1]!));
    for (const m of text.matchAll(RESOLVE)) if (!BUILTINS.has(m[1]!) && !m[1]!.startsWith("node:")) packages.add(packageName(m[1]!));
    for (const spec of specs) {
      if (spec.startsWith("node:") || BUILTINS.has(spec)) continue;
      if (spec.startsWith(".")) {
        const target = path.resolve(path.dirname(file), spec);
        if (!existsSync(target)) throw new Error(`${file} imports ${spec}, which does not exist`);
        if (/\.(ts|mts|js|mjs)$/.test(target)) queue.push(target);
        else assets.add(target); // JSON and other data imports
      } else {
        packages.add(packageName(spec));
      }
    }
  }
  return { modules: [...modules], assets: [...assets], packages: [...packages] };
}
