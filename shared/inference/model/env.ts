/** Reading the resolver's settings from the environment. */
import { homedir } from "node:os";
import { join } from "node:path";

export type Env = Readonly<Record<string, string | undefined>>;

/** The trimmed value, or undefined when unset or blank. */
export function nonEmpty(s: string | undefined): string | undefined {
  return s !== undefined && s.trim() !== "" ? s.trim() : undefined;
}

/** `~` and `~/…` → the home directory (shells do this, but env values and flags may carry it literally). */
export function expandHome(p: string): string {
  return p === "~" ? homedir() : p.startsWith("~/") ? join(homedir(), p.slice(2)) : p;
}
