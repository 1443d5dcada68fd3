// Validates rendered Kubernetes objects offline, two ways:
// 1. the JSON-schema validators of kubernetes-models (+ KEDA and prometheus-operator CRD models):
//    types, formats, required fields, enums;
// 2. the same packages' TypeScript interfaces, by type-checking each object as an object literal:
//    TypeScript's excess-property check rejects unknown fields (a misspelt `readinessprobe`
//    passes the JSON schemas, which allow extra properties, but a strict `kubectl apply` refuses
//    it, or an older server silently drops it).
import path from "node:path";
import ts from "typescript";
import { ConfigMap, Namespace, Secret, Service, ServiceAccount } from "kubernetes-models/v1";
import { Deployment, StatefulSet } from "kubernetes-models/apps/v1";
import { HorizontalPodAutoscaler } from "kubernetes-models/autoscaling/v2";
import { PodDisruptionBudget } from "kubernetes-models/policy/v1";
import { ScaledObject } from "@kubernetes-models/keda/keda.sh/v1alpha1";
import { ServiceMonitor } from "@kubernetes-models/prometheus-operator/monitoring.coreos.com/v1";
import type { K8sObject } from "./kustomize.ts";

interface Kind {
  model: new (data: never) => { validate(): void };
  /** Module and interface name for the type check. */
  module: string;
  iface: string;
}

const KINDS: Record<string, Kind> = {
  "v1/Namespace": { model: Namespace, module: "kubernetes-models/v1/Namespace", iface: "INamespace" },
  "v1/ServiceAccount": { model: ServiceAccount, module: "kubernetes-models/v1/ServiceAccount", iface: "IServiceAccount" },
  "v1/ConfigMap": { model: ConfigMap, module: "kubernetes-models/v1/ConfigMap", iface: "IConfigMap" },
  "v1/Secret": { model: Secret, module: "kubernetes-models/v1/Secret", iface: "ISecret" },
  "v1/Service": { model: Service, module: "kubernetes-models/v1/Service", iface: "IService" },
  "apps/v1/Deployment": { model: Deployment, module: "kubernetes-models/apps/v1/Deployment", iface: "IDeployment" },
  "apps/v1/StatefulSet": { model: StatefulSet, module: "kubernetes-models/apps/v1/StatefulSet", iface: "IStatefulSet" },
  "policy/v1/PodDisruptionBudget": {
    model: PodDisruptionBudget,
    module: "kubernetes-models/policy/v1/PodDisruptionBudget",
    iface: "IPodDisruptionBudget",
  },
  "autoscaling/v2/HorizontalPodAutoscaler": {
    model: HorizontalPodAutoscaler,
    module: "kubernetes-models/autoscaling/v2/HorizontalPodAutoscaler",
    iface: "IHorizontalPodAutoscaler",
  },
  "keda.sh/v1alpha1/ScaledObject": {
    model: ScaledObject,
    module: "@kubernetes-models/keda/keda.sh/v1alpha1/ScaledObject",
    iface: "IScaledObject",
  },
  "monitoring.coreos.com/v1/ServiceMonitor": {
    model: ServiceMonitor,
    module: "@kubernetes-models/prometheus-operator/monitoring.coreos.com/v1/ServiceMonitor",
    iface: "IServiceMonitor",
  },
};

export function kindKey(o: Pick<K8sObject, "apiVersion" | "kind">): string {
  return `${o.apiVersion}/${o.kind}`;
}

/** Schema errors of one object ([] = valid); an unknown apiVersion/kind is an error too. */
export function schemaErrors(o: K8sObject): string[] {
  const kind = KINDS[kindKey(o)];
  if (!kind) return [`${kindKey(o)} is not a kind these manifests are validated for`];
  try {
    new kind.model(structuredClone(o) as never).validate();
    return [];
  } catch (e) {
    return [(e as Error).message];
  }
}

/**
 * Type-checks every object against its interface in one TypeScript program; returns the
 * diagnostics, each prefixed with the object it is about. `anchor` is a file path inside the
 * repository, so that the packages resolve from its node_modules.
 */
export function typeErrors(objects: { label: string; object: K8sObject }[], anchor: string): string[] {
  const file = path.join(path.dirname(anchor), "__deploy_typecheck__.ts");
  const used = [...new Set(objects.map((o) => kindKey(o.object)))].filter((k) => KINDS[k]);
  const lines = used.map((k) => `import type { ${KINDS[k]!.iface} } from "${KINDS[k]!.module}";`);
  const starts: { line: number; label: string }[] = [];
  objects.forEach(({ label, object }, i) => {
    const kind = KINDS[kindKey(object)];
    if (!kind) return;
    starts.push({ line: lines.length, label });
    // One property per line, so a diagnostic's line leads back to its object.
    lines.push(`export const o${i}: ${kind.iface} = ${JSON.stringify(object, null, 1)};`.replace(/\n/g, " "));
  });
  const source = lines.join("\n") + "\n";
  const options: ts.CompilerOptions = {
    strict: true,
    noEmit: true,
    skipLibCheck: true,
    target: ts.ScriptTarget.ES2022,
    module: ts.ModuleKind.NodeNext,
    moduleResolution: ts.ModuleResolutionKind.NodeNext,
    types: [],
  };
  const host = ts.createCompilerHost(options);
  const getSourceFile = host.getSourceFile.bind(host);
  host.getSourceFile = (name, version, onError, create) =>
    path.resolve(name) === file ? ts.createSourceFile(name, source, version) : getSourceFile(name, version, onError, create);
  const fileExists = host.fileExists.bind(host);
  host.fileExists = (name) => path.resolve(name) === file || fileExists(name);
  const program = ts.createProgram([file], options, host);
  return ts.getPreEmitDiagnostics(program).map((d) => {
    const text = ts.flattenDiagnosticMessageText(d.messageText, "\n");
    if (!d.file || d.start === undefined || path.resolve(d.file.fileName) !== file) return text;
    const { line } = d.file.getLineAndCharacterOfPosition(d.start);
    const owner = [...starts].reverse().find((s) => s.line <= line);
    const near = source.slice(Math.max(0, d.start - 60), d.start + 40);
    return `${owner?.label ?? "imports"}: ${text} (near …${near}…)`;
  });
}
