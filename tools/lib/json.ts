// Result files: written atomically (temp file + rename) so an interrupted run never leaves a
// half-written result behind, with numbers rounded to a sensible precision.
import { mkdir, rename, writeFile } from "node:fs/promises";
import { dirname } from "node:path";

/** Rounds every float in a JSON-able value to `digits` significant digits (integers untouched). */
export function roundDeep<T>(value: T, digits = 6): T {
  return JSON.parse(
    JSON.stringify(value, (_k, v: unknown) =>
      typeof v === "number" && Number.isFinite(v) && !Number.isInteger(v) ? Number(v.toPrecision(digits)) : v,
    ),
  ) as T;
}

export async function writeFileAtomic(path: string, data: string | Uint8Array): Promise<void> {
  await mkdir(dirname(path), { recursive: true });
  const tmp = `${path}.${process.pid}.tmp`;
  await writeFile(tmp, data);
  await rename(tmp, path);
}

export async function writeJson(path: string, value: unknown, digits = 6): Promise<void> {
  await writeFileAtomic(path, JSON.stringify(roundDeep(value, digits), null, 2) + "\n");
}
