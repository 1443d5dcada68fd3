/** What `ctxbank models` shows: the catalogue, and what of it (and else) the model cache holds. */
import { readdir, stat } from "node:fs/promises";
import { join, resolve as resolvePath } from "node:path";
import { defaultCacheDir, inspectCached } from "./cache.ts";
import { MODEL_CATALOGUE, type CatalogueModel, type ModelCatalogue } from "./catalogue.ts";
import type { Env } from "./env.ts";
import type { Logger } from "./progress.ts";

/** A model's file in the cache: verified (sha256 checked), unverified (right size, not hashed yet), or invalid. */
export interface CachedCopy {
  path: string;
  /** Its size in bytes (absent when it is not a regular file). */
  size?: number;
  state: "verified" | "unverified" | "invalid";
  /** What is wrong with an invalid one (it is replaced on the model's next use). */
  problem?: string;
}

export interface ListedModel extends CatalogueModel {
  default: boolean;
  /** Null when the model is not in the cache (it is downloaded on first use). */
  cached: CachedCopy | null;
}

export interface ModelListing {
  cacheDir: string;
  defaultModel: string;
  models: ListedModel[];
  /** GGUF files in the cache that are no model of the catalogue (an older release, a copy). */
  otherFiles: { path: string; size: number }[];
}

export interface ListModelsOptions {
  /** Cache directory (default from env, as the resolver). */
  cacheDir?: string;
  env?: Env;
  catalogue?: ModelCatalogue;
  /** Hash cached files whose sha256 was never checked (and record the result, as the resolver does). */
  verify: boolean;
  /** Where the "verifying" lines go. */
  log: Logger;
}

export async function listModels(o: ListModelsOptions): Promise<ModelListing> {
  const catalogue = o.catalogue ?? MODEL_CATALOGUE;
  const cacheDir = o.cacheDir !== undefined ? resolvePath(o.cacheDir) : defaultCacheDir(o.env);
  const models: ListedModel[] = [];
  for (const model of catalogue.models) {
    const path = join(cacheDir, model.fileName);
    const found = await inspectCached(path, model, o.verify, o.log);
    const cached: CachedCopy | null = found.state === "missing" ? null : { path, ...found };
    models.push({ ...model, default: model.name === catalogue.defaultModel, cached });
  }
  const known = new Set(catalogue.models.map((m) => m.fileName));
  return { cacheDir, defaultModel: catalogue.defaultModel, models, otherFiles: await otherGgufFiles(cacheDir, known) };
}

async function otherGgufFiles(dir: string, known: ReadonlySet<string>): Promise<{ path: string; size: number }[]> {
  let names: string[];
  try {
    names = await readdir(dir);
  } catch {
    return []; // no cache yet
  }
  const files: { path: string; size: number }[] = [];
  for (const name of names.sort()) {
    if (!name.endsWith(".gguf") || name.startsWith(".") || known.has(name)) continue;
    const path = join(dir, name);
    const st = await stat(path).catch(() => undefined);
    if (st?.isFile()) files.push({ path, size: st.size });
  }
  return files;
}
