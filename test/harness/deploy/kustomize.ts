// A small kustomize: renders a kustomization directory with exactly the features deploy/k8s uses
// (resources, components, namespace, images) and refuses any other field, so a manifest change
// that needs more is noticed here instead of being silently mis-rendered. The test also compares
// the result with `kubectl kustomize` where kubectl is installed.
import { existsSync, readFileSync, statSync } from "node:fs";
import path from "node:path";
import { parseAllDocuments } from "yaml";

export type K8sObject = {
  apiVersion: string;
  kind: string;
  metadata: { name: string; namespace?: string; labels?: Record<string, string>; annotations?: Record<string, string> };
  [key: string]: unknown;
};

const KUSTOMIZATION_FILES = ["kustomization.yaml", "kustomization.yml", "Kustomization"];
const SUPPORTED = new Set(["apiVersion", "kind", "namespace", "resources", "components", "images"]);
/** Kinds that have no namespace (the ones these manifests could contain). */
const CLUSTER_SCOPED = new Set([
  "Namespace",
  "ClusterRole",
  "ClusterRoleBinding",
  "CustomResourceDefinition",
  "PersistentVolume",
  "StorageClass",
  "PriorityClass",
]);

interface Kustomization {
  apiVersion?: string;
  kind?: "Kustomization" | "Component";
  namespace?: string;
  resources?: string[];
  components?: string[];
  images?: { name: string; newName?: string; newTag?: string }[];
}

export class KustomizeError extends Error {}

/** Parses every YAML document of a file (empty documents skipped); throws on a YAML error. */
export function readYamlDocs(file: string): unknown[] {
  const docs = parseAllDocuments(readFileSync(file, "utf8"), { prettyErrors: true });
  return docs.flatMap((doc) => {
    if (doc.errors.length > 0) throw new KustomizeError(`${file}: ${doc.errors.map((e) => e.message).join("; ")}`);
    const value: unknown = doc.toJS();
    return value === null || value === undefined ? [] : [value];
  });
}

export function kustomizationFile(dir: string): string | undefined {
  return KUSTOMIZATION_FILES.map((f) => path.join(dir, f)).find((f) => existsSync(f));
}

/** Every file a kustomization tree reads (kustomization files included), for the orphan check. */
export function filesUsed(dir: string, into = new Set<string>()): Set<string> {
  const file = kustomizationFile(dir);
  if (!file) throw new KustomizeError(`${dir}: no kustomization file`);
  into.add(file);
  const k = readYamlDocs(file)[0] as Kustomization;
  for (const ref of [...(k.resources ?? []), ...(k.components ?? [])]) {
    const p = path.resolve(dir, ref);
    if (statSync(p).isDirectory()) filesUsed(p, into);
    else into.add(p);
  }
  return into;
}

/** Renders `dir` (a Kustomization; a Component when `asComponent`) to its list of objects. */
export function render(dir: string, asComponent = false): K8sObject[] {
  const file = kustomizationFile(dir);
  if (!file) throw new KustomizeError(`${dir}: no kustomization file`);
  const k = readYamlDocs(file)[0] as Kustomization;
  const unsupported = Object.keys(k).filter((key) => !SUPPORTED.has(key));
  if (unsupported.length > 0) throw new KustomizeError(`${file}: fields this renderer does not implement: ${unsupported.join(", ")}`);
  const expectedKind = asComponent ? "Component" : "Kustomization";
  if ((k.kind ?? "Kustomization") !== expectedKind) throw new KustomizeError(`${file}: kind ${k.kind}, expected ${expectedKind}`);

  const objects: K8sObject[] = [];
  for (const ref of k.resources ?? []) {
    const p = path.resolve(dir, ref);
    if (!existsSync(p)) throw new KustomizeError(`${file}: resource ${ref} does not exist`);
    if (statSync(p).isDirectory()) objects.push(...render(p));
    else objects.push(...readYamlDocs(p).map((doc) => asObject(doc, p)));
  }
  for (const ref of k.components ?? []) {
    const p = path.resolve(dir, ref);
    if (!existsSync(p) || !statSync(p).isDirectory()) throw new KustomizeError(`${file}: component ${ref} is not a directory`);
    objects.push(...render(p, true));
  }

  for (const obj of objects) {
    if (k.namespace && !CLUSTER_SCOPED.has(obj.kind)) obj.metadata.namespace = k.namespace;
    for (const image of k.images ?? []) retag(obj, image);
  }
  const seen = new Set<string>();
  for (const obj of objects) {
    const id = objectId(obj);
    if (seen.has(id)) throw new KustomizeError(`${dir}: ${id} is defined twice`);
    seen.add(id);
  }
  return objects;
}

export function objectId(o: K8sObject): string {
  return `${o.apiVersion}/${o.kind}/${o.metadata.namespace ?? "-"}/${o.metadata.name}`;
}

function asObject(doc: unknown, file: string): K8sObject {
  const o = doc as Partial<K8sObject>;
  if (typeof o !== "object" || typeof o.apiVersion !== "string" || typeof o.kind !== "string" || typeof o.metadata?.name !== "string") {
    throw new KustomizeError(`${file}: a document without apiVersion, kind and metadata.name`);
  }
  return o as K8sObject;
}

/** The containers (and init containers) of a workload's pod template. */
export function podContainers(o: K8sObject): Record<string, unknown>[] {
  const spec = (o.spec as { template?: { spec?: { containers?: unknown[]; initContainers?: unknown[] } } } | undefined)?.template?.spec;
  return [...(spec?.containers ?? []), ...(spec?.initContainers ?? [])] as Record<string, unknown>[];
}

/** kustomize's images transformer: an image whose name (before the tag or digest) matches. */
function retag(o: K8sObject, image: { name: string; newName?: string; newTag?: string }): void {
  for (const c of podContainers(o)) {
    if (typeof c.image !== "string") continue;
    const m = /^(.*?)(?::([^:/@]+))?(@.+)?$/.exec(c.image)!;
    if (m[1] !== image.name) continue;
    c.image = `${image.newName ?? m[1]}${image.newTag !== undefined ? `:${image.newTag}` : m[2] !== undefined ? `:${m[2]}` : ""}${m[3] ?? ""}`;
  }
}
