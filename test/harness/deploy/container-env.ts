// The environment a ctxbank container starts with, assembled the way the kubelet does it: the
// image's ENV, then envFrom ConfigMaps, then `env` entries in order, with $(VAR) references
// expanded from what is defined before them. Values only the cluster knows (pod IP, secrets) are
// stand-ins. Reports what would break: a missing ConfigMap, a $(VAR) that nothing defines (the
// kubelet would leave it in the value literally).
import type { K8sObject } from "./kustomize.ts";

export interface ContainerEnv {
  env: Record<string, string>;
  /** Names set by the manifests (envFrom keys and env entries), not by the image. */
  names: string[];
  /** Names referenced as $(NAME) by another entry. */
  referenced: Set<string>;
  problems: string[];
}

interface EnvVar {
  name: string;
  value?: string;
  valueFrom?: {
    fieldRef?: { fieldPath: string };
    secretKeyRef?: { name: string; key: string };
    configMapKeyRef?: { name: string; key: string };
  };
}

const FIELD_STANDINS: Record<string, string> = {
  "status.podIP": "10.1.2.3",
  "metadata.name": "ctxbank-pod-0",
  "metadata.namespace": "ctxbank",
  "spec.nodeName": "node-1",
};

export function containerEnv(
  container: Record<string, unknown>,
  objects: K8sObject[],
  imageEnv: Record<string, string>,
  secretStandIn: (name: string, key: string) => string,
): ContainerEnv {
  const env: Record<string, string> = { ...imageEnv };
  const names: string[] = [];
  const referenced = new Set<string>();
  const problems: string[] = [];
  const configMap = (name: string) =>
    objects.find((o) => o.kind === "ConfigMap" && o.metadata.name === name) as (K8sObject & { data?: Record<string, string> }) | undefined;

  for (const from of (container.envFrom ?? []) as { configMapRef?: { name: string }; secretRef?: { name: string } }[]) {
    if (from.secretRef) problems.push(`envFrom secretRef ${from.secretRef.name}: not modelled by this check`);
    if (!from.configMapRef) continue;
    const cm = configMap(from.configMapRef.name);
    if (!cm) {
      problems.push(`envFrom ConfigMap ${from.configMapRef.name} is not in the manifests`);
      continue;
    }
    for (const [k, v] of Object.entries(cm.data ?? {})) {
      env[k] = v;
      names.push(k);
    }
  }
  for (const e of (container.env ?? []) as EnvVar[]) {
    names.push(e.name);
    if (e.value !== undefined) {
      env[e.name] = e.value.replace(/\$\(([A-Za-z_][A-Za-z0-9_]*)\)/g, (whole, ref: string) => {
        referenced.add(ref);
        if (env[ref] === undefined) problems.push(`${e.name} refers to $(${ref}), which is not defined before it`);
        return env[ref] ?? whole;
      });
    } else if (e.valueFrom?.fieldRef) {
      const v = FIELD_STANDINS[e.valueFrom.fieldRef.fieldPath];
      if (v === undefined) problems.push(`${e.name}: fieldRef ${e.valueFrom.fieldRef.fieldPath} is not modelled`);
      env[e.name] = v ?? "";
    } else if (e.valueFrom?.secretKeyRef) {
      env[e.name] = secretStandIn(e.valueFrom.secretKeyRef.name, e.valueFrom.secretKeyRef.key);
    } else if (e.valueFrom?.configMapKeyRef) {
      const { name, key } = e.valueFrom.configMapKeyRef;
      const v = configMap(name)?.data?.[key];
      if (v === undefined) problems.push(`${e.name}: ConfigMap ${name} has no key ${key}`);
      env[e.name] = v ?? "";
    } else {
      problems.push(`${e.name}: neither value nor a modelled valueFrom`);
    }
  }
  return { env, names, referenced, problems };
}
