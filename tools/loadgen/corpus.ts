// Local text the load generator builds prompts from: the README files of the packages in
// node_modules (pinned by package-lock.json, so the same on every checkout of a commit), sorted
// by path, joined until `maxChars`. Ordinary technical prose with code, in English; tokenized
// once with our tokenizer so prompts can be cut to exact token counts.
import { readdirSync, readFileSync, statSync } from "node:fs";
import { join } from "node:path";

function readmePaths(nodeModules: string): string[] {
  const out: string[] = [];
  const visit = (dir: string, depth: number) => {
    let entries: string[];
    try {
      entries = readdirSync(dir).sort();
    } catch {
      return;
    }
    for (const name of entries) {
      const p = join(dir, name);
      if (/^readme\.md$/i.test(name)) out.push(p);
      else if (depth > 0 && !name.startsWith(".") && name !== "node_modules") {
        try {
          if (statSync(p).isDirectory()) visit(p, depth - 1);
        } catch {
          /* broken link */
        }
      }
    }
  };
  visit(nodeModules, 2); // node_modules/pkg/README.md and node_modules/@scope/pkg/README.md
  return out;
}

/** The corpus text and the files it came from. */
export function loadCorpus(nodeModules: string, maxChars = 600_000): { text: string; files: string[] } {
  const files: string[] = [];
  let text = "";
  for (const p of readmePaths(nodeModules)) {
    if (text.length >= maxChars) break;
    // Drop badges, HTML and long code fences' noise only as far as cheap: keep the text as is,
    // minus runs of blank lines.
    const body = readFileSync(p, "utf8")
      .replace(/\n{3,}/g, "\n\n")
      .trim();
    if (body.length < 2000) continue; // skip stubs
    text += body + "\n\n";
    files.push(p);
  }
  if (text.length < 50_000)
    throw new Error(`too little text for prompts in ${nodeModules} (${text.length} chars): is node_modules installed?`);
  return { text: text.slice(0, maxChars), files };
}
