// Offline checks of deploy/k8s: every kustomize overlay against the Kubernetes, KEDA and
// prometheus-operator schemas, the manifests against each other and against the services
// (settings, routes, metrics, the image). No cluster is involved; see deploy/README.md for what
// that leaves unchecked.
import { execFileSync } from "node:child_process";
import { readdirSync, readFileSync } from "node:fs";
import path from "node:path";
import { isDeepStrictEqual } from "node:util";
import { parseAllDocuments } from "yaml";
import { describe, expect, it } from "vitest";
import { newApiKey } from "../../shared/platform/auth/api-keys.ts";
import { loadConfig, SETTINGS, type Config, type ServiceRole } from "../../shared/platform/config.ts";
import { containerEnv } from "../harness/deploy/container-env.ts";
import { schemaErrors, typeErrors } from "../harness/deploy/k8s-schema.ts";
import { filesUsed, objectId, podContainers, readYamlDocs, render, type K8sObject } from "../harness/deploy/kustomize.ts";
import { expandAdapter } from "../harness/deploy/promql.ts";
import { parseQuantity } from "../harness/deploy/quantity.ts";
import { at, exportedMetricsOnce, imageEnv, root, runtime } from "../harness/deploy/setup.ts";

const K8S = at("deploy/k8s");
const OVERLAYS = ["base", "overlays/keda", "overlays/hpa", "overlays/keda-postgres"];
const ADAPTER_VALUES = at("deploy/k8s/overlays/hpa/prometheus-adapter-values.yaml");
/** Secrets the manifests use but never contain: created by the operator (deploy/README.md). */
const EXTERNAL_SECRETS: Record<string, string[]> = {
  "ctxbank-database": ["DATABASE_URL"],
  "ctxbank-postgres": ["POSTGRES_PASSWORD"],
  "ctxbank-internal": ["CTXBANK_INTERNAL_SECRET"],
  "ctxbank-api-keys": ["CTXBANK_API_KEYS"],
};
/** What the operator's Secrets hold, as the services would read them. */
const SECRET_VALUES: Record<string, string> = {
  DATABASE_URL: "postgres://ctxbank:pw@ctxbank-postgres:5432/ctxbank",
  CTXBANK_INTERNAL_SECRET: "an-operator-made-secret-of-at-least-32-chars",
  CTXBANK_API_KEYS: newApiKey("client-a").line,
};
/** Labels the prometheus-operator puts on every target; a metric label of the same name clashes. */
const TARGET_LABELS = ["namespace", "service", "pod", "container", "endpoint", "job", "instance"];
const MiB = 2 ** 20;
/** Roles that load a model and hold KV; the router does neither. */
const MODEL_ROLES: ServiceRole[] = ["prefill", "decode"];
/** Where each role's HTTP routes are declared (the probes must hit one of them). */
const ROUTES_OF: Partial<Record<ServiceRole, string>> = {
  prefill: "services/app.ts",
  decode: "services/app.ts",
  router: "services/router/app.ts",
};
/** The routes a source file declares: OpenAPI `path: "/x"` and Hono `app.get("/x", …)`. */
function declaredRoutes(file: string): Set<string> {
  const source = readFileSync(at(file), "utf8");
  const routes = [
    ...source.matchAll(/path: "(\/[^"]*)"/g),
    ...source.matchAll(/\bapp\.(?:get|post|put|delete|on)\(\s*(?:\[[^\]]*\],\s*)?"(\/[^"]*)"/g),
  ];
  return new Set(routes.map((m) => m[1]!));
}

const rendered = new Map(OVERLAYS.map((o) => [o, render(path.join(K8S, o))]));
const allObjects = [...rendered.values()].flat();
const settingEnvNames = new Set(Object.values(SETTINGS).flatMap((s) => s.env));
const exported = exportedMetricsOnce();

const isCtxbankImage = (image: unknown) => typeof image === "string" && /(^|\/)ctxbank(:[^/]*)?$/.test(image);
const workloads = (objects: K8sObject[]) => objects.filter((o) => o.kind === "Deployment" || o.kind === "StatefulSet");
const podSpec = (o: K8sObject) =>
  (o.spec as { template: { metadata: { labels: Record<string, string> }; spec: Record<string, any> } }).template;
const matches = (selector: Record<string, string>, labels: Record<string, string> | undefined) =>
  Object.keys(selector).length > 0 && Object.entries(selector).every(([k, v]) => labels?.[k] === v);

describe("Kubernetes manifests", () => {
  it("every YAML file under deploy/k8s parses and is used by an overlay", () => {
    const used = new Set(OVERLAYS.flatMap((o) => [...filesUsed(path.join(K8S, o))]));
    const files = readdirSync(K8S, { recursive: true, encoding: "utf8" })
      .filter((f) => /\.ya?ml$/.test(f))
      .map((f) => path.join(K8S, f));
    for (const f of files) {
      expect(() => readYamlDocs(f), f).not.toThrow();
      if (f !== ADAPTER_VALUES) expect(used.has(f), `${path.relative(root, f)} is not part of any overlay`).toBe(true);
    }
  });

  it.skipIf(!hasKubectl())("renders every overlay exactly as `kubectl kustomize` does", () => {
    for (const [overlay, objects] of rendered) {
      const out = execFileSync("kubectl", ["kustomize", path.join(K8S, overlay)], { encoding: "utf8" });
      const theirs = parseAllDocuments(out).map((d) => d.toJS() as K8sObject);
      expect(objects.map(objectId).sort(), overlay).toEqual(theirs.map(objectId).sort());
      const byId = new Map(theirs.map((o) => [objectId(o), o]));
      for (const o of objects) expect(isDeepStrictEqual(o, byId.get(objectId(o))), `${overlay}: ${objectId(o)}`).toBe(true);
    }
  });

  it("passes the Kubernetes, KEDA and prometheus-operator schemas, with no unknown fields", () => {
    for (const [overlay, objects] of rendered) {
      for (const o of objects) expect(schemaErrors(o), `${overlay}: ${objectId(o)}`).toEqual([]);
    }
    const unique = new Map(allObjects.map((o) => [objectId(o) + JSON.stringify(o), o]));
    const labelled = [...unique.values()].map((o) => ({ label: objectId(o), object: o }));
    expect(typeErrors(labelled, import.meta.filename)).toEqual([]);
  }, 60_000);

  it("puts every namespaced object in the ctxbank namespace", () => {
    for (const [overlay, objects] of rendered) {
      for (const o of objects)
        expect(o.kind === "Namespace" ? o.metadata.name : o.metadata.namespace, `${overlay}: ${objectId(o)}`).toBe("ctxbank");
      expect(
        objects.some((o) => o.kind === "Namespace"),
        overlay,
      ).toBe(true);
    }
  });

  it("Services, PDBs and ServiceMonitors select what exists, on ports it exposes", () => {
    for (const [overlay, objects] of rendered) {
      const pods = workloads(objects).map((w) => podSpec(w));
      for (const svc of objects.filter((o) => o.kind === "Service")) {
        const spec = svc.spec as { selector: Record<string, string>; ports: { name: string; targetPort: string | number }[] };
        const selected = pods.filter((p) => matches(spec.selector, p.metadata.labels));
        expect(selected.length, `${overlay}: Service ${svc.metadata.name} selects no pods`).toBeGreaterThan(0);
        for (const port of spec.ports) {
          for (const p of selected) {
            const ports = (p.spec.containers as { ports?: { name?: string; containerPort: number }[] }[]).flatMap((c) => c.ports ?? []);
            expect(
              ports.some((cp) => cp.name === port.targetPort || cp.containerPort === port.targetPort),
              `${overlay}: ${svc.metadata.name}:${port.name}`,
            ).toBe(true);
          }
        }
      }
      for (const pdb of objects.filter((o) => o.kind === "PodDisruptionBudget")) {
        const sel = (pdb.spec as { selector: { matchLabels: Record<string, string> } }).selector.matchLabels;
        expect(pods.filter((p) => matches(sel, p.metadata.labels)).length, `${overlay}: PDB ${pdb.metadata.name}`).toBe(1);
      }
      for (const sm of objects.filter((o) => o.kind === "ServiceMonitor")) {
        const spec = sm.spec as {
          selector: { matchLabels: Record<string, string> };
          endpoints: { port: string; path: string; honorLabels?: boolean }[];
        };
        const services = objects.filter((o) => o.kind === "Service" && matches(spec.selector.matchLabels, o.metadata.labels));
        expect(services.map((s) => s.metadata.name).sort(), overlay).toEqual(["ctxbank-decode", "ctxbank-prefill", "ctxbank-router"]);
        for (const ep of spec.endpoints) {
          for (const s of services) expect((s.spec as { ports: { name: string }[] }).ports.map((p) => p.name)).toContain(ep.port);
          expect(ep.path).toBe("/metrics");
          // A ctxbank label named like a target label is renamed exported_<label> unless honoured.
          const clashes = exported.list().filter((m) => m.name.startsWith("ctxbank:") && m.labels.some((l) => TARGET_LABELS.includes(l)));
          if (clashes.length > 0) expect(ep.honorLabels, `${clashes[0]!.name} has a label the operator also sets`).toBe(true);
        }
      }
    }
  });

  it("probes hit container ports and routes the services serve", () => {
    for (const [role, file] of Object.entries(ROUTES_OF)) {
      // The routes are read from the source: a pattern that finds nothing would check nothing.
      expect([...declaredRoutes(file)], `${role}: ${file}`).toEqual(expect.arrayContaining(["/health", "/ready", "/metrics"]));
    }
    for (const w of workloads(allObjects)) {
      for (const c of podContainers(w) as Record<string, any>[]) {
        const ports = (c.ports ?? []) as { name?: string; containerPort: number }[];
        const role = c.args?.[0] as ServiceRole | undefined;
        const routesFile = isCtxbankImage(c.image) ? ROUTES_OF[role!] : undefined;
        if (isCtxbankImage(c.image)) expect(routesFile, `${w.metadata.name}/${c.name}: no routes known for role ${role}`).toBeDefined();
        const routes = routesFile ? declaredRoutes(routesFile) : new Set<string>();
        for (const kind of ["startupProbe", "livenessProbe", "readinessProbe"]) {
          const probe = c[kind];
          if (isCtxbankImage(c.image)) expect(probe, `${w.metadata.name}/${c.name} needs a ${kind}`).toBeDefined();
          const port = probe?.httpGet?.port ?? probe?.tcpSocket?.port;
          if (port !== undefined)
            expect(
              ports.some((p) => p.name === port || p.containerPort === port),
              `${w.metadata.name} ${kind} port ${port}`,
            ).toBe(true);
          if (isCtxbankImage(c.image))
            expect(routes.has(probe.httpGet.path), `${w.metadata.name} ${kind} ${probe.httpGet.path} is not a route of ${routesFile}`).toBe(
              true,
            );
        }
        if (isCtxbankImage(c.image)) {
          expect(c.readinessProbe.httpGet.path).toBe("/ready");
          expect(c.livenessProbe.httpGet.path).toBe("/health");
        }
      }
    }
  });

  describe("ctxbank containers", () => {
    const uid = Number(
      runtime.instructions
        .filter((i) => i.keyword === "USER")
        .at(-1)!
        .rest.split(":")[0],
    );
    const cases = workloads(allObjects).flatMap((w) =>
      (podContainers(w) as Record<string, any>[]).filter((c) => isCtxbankImage(c.image)).map((c) => ({ w, c })),
    );
    const seen = new Set<string>();
    const distinct = cases.filter(({ w }) => !seen.has(w.metadata.name) && seen.add(w.metadata.name));

    it("are the prefill, decode and router Deployments", () => {
      expect(distinct.map(({ w, c }) => `${w.kind}/${w.metadata.name}:${c.args?.[0]}`).sort()).toEqual([
        "Deployment/ctxbank-decode:decode",
        "Deployment/ctxbank-prefill:prefill",
        "Deployment/ctxbank-router:router",
      ]);
    });

    function configOf(w: K8sObject, c: Record<string, any>): { config: Config; env: ReturnType<typeof containerEnv> } {
      expect(c.command, "command would replace the image's ENTRYPOINT").toBeUndefined();
      const role = c.args?.[0] as ServiceRole;
      expect(["prefill", "decode", "router"]).toContain(role);
      const env = containerEnv(c, allObjects, imageEnv(runtime), (name, key) => {
        expect(EXTERNAL_SECRETS[name], `secret ${name}`).toContain(key);
        return SECRET_VALUES[key] ?? "secret";
      });
      expect(env.problems, w.metadata.name).toEqual([]);
      return { config: loadConfig(role, {}, env.env), env };
    }

    it("set only settings the services read, and the services accept them", () => {
      for (const { w, c } of distinct) {
        const { env } = configOf(w, c);
        for (const name of env.names) {
          // Helpers such as POD_IP exist only to be expanded into a setting.
          expect(settingEnvNames.has(name) || env.referenced.has(name), `${w.metadata.name}: ${name} is not a ctxbank setting`).toBe(true);
        }
        expect(env.names.filter((n) => n.startsWith("CTXBANK_") && !settingEnvNames.has(n))).toEqual([]);
      }
    });

    it("listen on the container port, register their pod IP, and fit CPU and memory", () => {
      for (const { w, c } of distinct) {
        const { config } = configOf(w, c);
        const name = w.metadata.name;
        expect(config.host, name).toBe("0.0.0.0");
        expect(c.ports.find((p: { name: string }) => p.name === "http").containerPort, name).toBe(config.port);
        const url = new URL(config.publicUrl!);
        expect(url.hostname, `${name}: public URL from the pod IP`).toBe("10.1.2.3");
        expect(Number(url.port), name).toBe(config.port);
        if (MODEL_ROLES.includes(config.role)) {
          // The internal listener: its own container port, registered at the pod IP, behind the shared secret.
          expect(config.internalHost, name).toBe("0.0.0.0");
          expect(c.ports.find((p: { name: string }) => p.name === "internal").containerPort, name).toBe(config.internalPort);
          expect(config.internalPort, name).not.toBe(config.port);
          const internal = new URL(config.internalUrl!);
          expect([internal.hostname, Number(internal.port)], `${name}: internal URL from the pod IP`).toEqual([
            "10.1.2.3",
            config.internalPort,
          ]);
        } else {
          // The router has no internal listener (nothing calls it): no port, no URL, no bind.
          expect(config.role, name).toBe("router");
          expect(
            c.ports.map((p: { name: string }) => p.name),
            `${name}: only the public port`,
          ).toEqual(["http"]);
          expect(config.internalUrl, `${name}: no internal URL to register`).toBeUndefined();
          const env = configOf(w, c).env.names;
          expect(
            env.filter((n) => n.startsWith("CTXBANK_INTERNAL_") && n !== "CTXBANK_INTERNAL_SECRET"),
            name,
          ).toEqual([]);
        }
        // The router needs the secret too: it reads each decode's status on the internal listener.
        expect(config.internalSecret, `${name}: the shared secret`).toBeDefined();
        expect(config.apiKeys, `${name}: API keys on a non-loopback bind`).toBeDefined();
        expect(config.insecure, name).toBe(false);

        const limits = c.resources?.limits ?? {};
        const requests = c.resources?.requests ?? {};
        expect(parseQuantity(requests.cpu), `${name}: a CPU request (scheduling, and the autoscalers' utilisation)`).toBeGreaterThan(0);
        expect(parseQuantity(limits.cpu), name).toBeGreaterThanOrEqual(parseQuantity(requests.cpu));
        expect(parseQuantity(limits.memory), name).toBeGreaterThanOrEqual(parseQuantity(requests.memory));
        if (MODEL_ROLES.includes(config.role)) {
          expect(parseQuantity(limits.cpu), `${name}: engine threads need their cores`).toBeGreaterThanOrEqual(config.threads);
          const held = config.role === "prefill" ? config.shardBytes : config.kvBudgetBytes;
          expect(parseQuantity(limits.memory), `${name}: memory limit vs KV held`).toBeGreaterThanOrEqual(held + 512 * MiB);
        } else {
          // No model, no KV: Node, the HTTP stack and the streams passing through (~200 MiB RSS measured).
          expect(parseQuantity(limits.memory), `${name}: memory limit for Node and the streams`).toBeGreaterThanOrEqual(256 * MiB);
          expect(parseQuantity(requests.memory), `${name}: memory request vs what it uses`).toBeGreaterThanOrEqual(256 * MiB);
        }
        if (config.role === "decode") expect(config.transport, "a decode pod cannot see a prefill pod's /dev/shm").toBe("http");
      }
    });

    it("prefill's shard is on a memory emptyDir as large as --shard-bytes", () => {
      const { w, c } = distinct.find(({ c }) => c.args[0] === "prefill")!;
      const { config } = configOf(w, c);
      const mount = (c.volumeMounts as { name: string; mountPath: string }[]).find(
        (m) => config.shardDir === m.mountPath || config.shardDir.startsWith(m.mountPath + "/"),
      );
      expect(mount, `no volume holds ${config.shardDir}`).toBeDefined();
      const volume = (podSpec(w).spec.volumes as { name: string; emptyDir?: { medium?: string; sizeLimit?: string } }[]).find(
        (v) => v.name === mount!.name,
      )!;
      expect(volume.emptyDir?.medium).toBe("Memory");
      expect(parseQuantity(volume.emptyDir!.sizeLimit!)).toBe(Math.ceil(config.shardBytes / 4096) * 4096);
    });

    it("run as the image's user, read-only, with a writable /tmp and no service links", () => {
      for (const { w, c } of cases) {
        const pod = podSpec(w).spec;
        expect(pod.securityContext.runAsNonRoot).toBe(true);
        expect(pod.securityContext.runAsUser, "the Dockerfile's USER").toBe(uid);
        expect(pod.enableServiceLinks, "service links would add CTXBANK_*_PORT variables").toBe(false);
        expect(pod.automountServiceAccountToken).toBe(false);
        expect(c.securityContext.readOnlyRootFilesystem).toBe(true);
        expect(c.securityContext.allowPrivilegeEscalation).toBe(false);
        expect(c.securityContext.capabilities.drop).toEqual(["ALL"]);
        const tmp = (c.volumeMounts as { name: string; mountPath: string }[]).find((m) => m.mountPath === "/tmp");
        expect(tmp, "tsx caches compiled files in /tmp").toBeDefined();
        expect((pod.volumes as { name: string; emptyDir?: object }[]).find((v) => v.name === tmp!.name)?.emptyDir).toBeDefined();
      }
    });

    it("drain within the termination grace period", () => {
      for (const { w, c } of distinct) {
        const { config } = configOf(w, c);
        const pod = podSpec(w).spec;
        const preStop = c.lifecycle?.preStop?.exec?.command as string[] | undefined;
        const sleep = preStop?.[0] === "sleep" ? Number(preStop[1]) : 0;
        expect(sleep, "a preStop pause lets endpoints drop the pod first").toBeGreaterThan(0);
        const needed = sleep + Math.ceil(config.drainMs / 1000) + 10; // + shard retirement and registry exit
        expect(pod.terminationGracePeriodSeconds, w.metadata.name).toBeGreaterThanOrEqual(needed);
        // Long enough for the model to load (5 min), short enough to notice a hang.
        const startup = c.startupProbe.periodSeconds * c.startupProbe.failureThreshold;
        expect(startup).toBeGreaterThanOrEqual(120);
      }
    });

    describe("the router", () => {
      const config = (role: ServiceRole) => {
        const { w, c } = distinct.find(({ c }) => c.args[0] === role)!;
        return configOf(w, c).config;
      };

      it("drains at least as long as the decodes: a stream passing through lasts its generation", () => {
        expect(config("router").drainMs).toBeGreaterThanOrEqual(config("decode").drainMs);
      });

      it("notices a decode's death within the heartbeat timeout", () => {
        const router = config("router");
        expect(router.routerPollMs).toBeLessThanOrEqual(router.heartbeatTimeoutMs);
      });

      it("is what clients reach: its Service's host names are allowed, and it carries no model settings", () => {
        const router = config("router");
        const svc = allObjects.find((o) => o.kind === "Service" && o.metadata.name === "ctxbank-router")!;
        expect(svc, "the ctxbank-router Service").toBeDefined();
        const ns = svc.metadata.namespace!;
        for (const host of [svc.metadata.name, `${svc.metadata.name}.${ns}.svc`, `${svc.metadata.name}.${ns}.svc.cluster.local`]) {
          expect(router.allowedHosts, `CTXBANK_ALLOWED_HOSTS lacks ${host}`).toContain(host);
        }
        const { w, c } = distinct.find(({ c }) => c.args[0] === "router")!;
        const names = configOf(w, c).env.names;
        for (const modelOnly of ["CTXBANK_THREADS", "CTXBANK_KV_BUDGET_BYTES", "CTXBANK_SHARD_BYTES", "CTXBANK_SHARD_DIR"]) {
          expect(names, `${w.metadata.name}: ${modelOnly} is for the model roles`).not.toContain(modelOnly);
        }
      });
    });
  });

  it("uses no Secret but the documented external ones, each named in deploy/README.md", () => {
    const readme = readFileSync(at("deploy/README.md"), "utf8");
    const defined = new Set(allObjects.filter((o) => o.kind === "Secret").map((o) => o.metadata.name));
    const used = new Set<string>();
    for (const w of workloads(allObjects)) {
      for (const c of podContainers(w) as Record<string, any>[]) {
        for (const e of c.env ?? []) if (e.valueFrom?.secretKeyRef) used.add(e.valueFrom.secretKeyRef.name);
      }
    }
    const external = [...used].filter((s) => !defined.has(s)).sort();
    expect(external).toEqual(Object.keys(EXTERNAL_SECRETS).sort());
    for (const s of external) expect(readme, `deploy/README.md must say how to create ${s}`).toContain(s);
  });

  describe("autoscaling", () => {
    const prefill = workloads(allObjects).find((w) => w.metadata.name === "ctxbank-prefill")!;
    const prefillContainer = podContainers(prefill)[0] as Record<string, any>;
    /** The SLO a query's latency is judged against (seconds), if it is a latency query. */
    const sloFor = (query: string): number | undefined => {
      const slo = loadConfig(
        "prefill",
        {},
        containerEnv(prefillContainer, allObjects, imageEnv(runtime), (_, key) => SECRET_VALUES[key] ?? "secret").env,
      );
      if (query.includes("time_to_first_token_seconds")) return slo.sloTtftMs / 1000;
      return query.includes("time_per_output_token_seconds") ? slo.sloTpotMs / 1000 : undefined;
    };
    const scaledObjects = rendered.get("overlays/keda")!.filter((o) => o.kind === "ScaledObject");
    const hpas = rendered.get("overlays/hpa")!.filter((o) => o.kind === "HorizontalPodAutoscaler");
    const deployments = new Set(
      workloads(allObjects)
        .filter((w) => w.kind === "Deployment")
        .map((w) => w.metadata.name),
    );

    /** The CPU request of every container of a Deployment (a utilisation target is a percentage of it). */
    const cpuRequests = (name: string) =>
      (podContainers(workloads(allObjects).find((w) => w.metadata.name === name)!) as Record<string, any>[]).map(
        (c) => c.resources?.requests?.cpu as string | undefined,
      );

    it("scales prefill and decode independently, each on its own latency SLO", () => {
      for (const set of [scaledObjects, hpas]) {
        const targets = set.map((o) => (o.spec as { scaleTargetRef: { name: string; kind?: string } }).scaleTargetRef);
        expect(targets.map((t) => t.name).sort()).toEqual(["ctxbank-decode", "ctxbank-prefill", "ctxbank-router"]);
        for (const t of targets) {
          expect(deployments.has(t.name)).toBe(true);
          expect(t.kind ?? "Deployment").toBe("Deployment");
        }
      }
      const so = (name: string) => JSON.stringify(scaledObjects.find((o) => o.metadata.name === name)!.spec);
      expect(so("ctxbank-prefill")).toContain("time_to_first_token_seconds");
      expect(so("ctxbank-prefill")).not.toContain("time_per_output_token_seconds");
      expect(so("ctxbank-decode")).toContain("time_per_output_token_seconds");
      expect(so("ctxbank-decode")).toContain('tier=\\"device\\"');
    });

    it("scales the router on CPU, never below 2 (every client request goes through one)", () => {
      const so = scaledObjects.find((o) => o.metadata.name === "ctxbank-router")!.spec as {
        minReplicaCount: number;
        maxReplicaCount: number;
        triggers: { type: string; metricType?: string; metadata: Record<string, string> }[];
      };
      const hpa = hpas.find((o) => o.metadata.name === "ctxbank-router")!.spec as {
        minReplicas: number;
        maxReplicas: number;
        metrics: { type: string; resource?: { name: string; target: { type: string; averageUtilization?: number } } }[];
      };
      expect(so.minReplicaCount).toBeGreaterThanOrEqual(2);
      expect(hpa.minReplicas).toBeGreaterThanOrEqual(2);
      // The two overlays agree on the bounds.
      expect([hpa.minReplicas, hpa.maxReplicas]).toEqual([so.minReplicaCount, so.maxReplicaCount]);
      expect(so.triggers.map((t) => t.type)).toEqual(["cpu"]);
      expect(hpa.metrics.map((m) => `${m.type}/${m.resource?.name}`)).toEqual(["Resource/cpu"]);
      expect(Number(so.triggers[0]!.metadata.value)).toBe(hpa.metrics[0]!.resource!.target.averageUtilization);
      // No latency query for the router: its requests' latency is the decodes' and prefills'.
      expect(JSON.stringify(so)).not.toMatch(/time_to_first_token|time_per_output_token/);
    });

    it("KEDA triggers: valid PromQL over exported metrics, latency as Value under the SLO", () => {
      for (const o of scaledObjects) {
        const spec = o.spec as {
          minReplicaCount: number;
          maxReplicaCount: number;
          triggers: { type: string; name: string; metricType?: string; metadata: Record<string, string> }[];
        };
        expect(spec.minReplicaCount, "a pod needs minutes to load; never scale to zero").toBeGreaterThanOrEqual(1);
        expect(spec.maxReplicaCount).toBeGreaterThan(spec.minReplicaCount);
        for (const t of spec.triggers) {
          const where = `${o.metadata.name}/${t.name}`;
          if (t.type === "cpu") {
            // From the metrics server: utilisation of the containers' CPU requests, which must all be set.
            expect(t.metricType, where).toBe("Utilization");
            const value = Number(t.metadata.value);
            expect(value, where).toBeGreaterThan(0);
            expect(value, where).toBeLessThanOrEqual(100);
            for (const cpu of cpuRequests((o.spec as { scaleTargetRef: { name: string } }).scaleTargetRef.name))
              expect(parseQuantity(cpu!), `${where}: CPU request`).toBeGreaterThan(0);
            expect(spec.minReplicaCount, `${where}: a resource trigger cannot scale to zero`).toBeGreaterThanOrEqual(1);
            continue;
          }
          expect(t.type).toBe("prometheus");
          expect(new URL(t.metadata.serverAddress!).protocol).toMatch(/^https?:$/);
          const threshold = Number(t.metadata.threshold);
          expect(threshold, where).toBeGreaterThan(0);
          exported.query(t.metadata.query!, where);
          const target = sloFor(t.metadata.query!);
          if (target !== undefined) {
            // A quantile does not add up over pods: AverageValue would divide it by the replicas.
            expect(t.metricType, where).toBe("Value");
            expect(threshold, `${where}: act before the SLO is missed`).toBeLessThanOrEqual(target);
            expect(threshold, where).toBeGreaterThanOrEqual(target / 2);
          }
        }
      }
    });

    it("HPA overlay: every metric is published by the prometheus-adapter rules, latency as Value under the SLO", () => {
      const values = readYamlDocs(ADAPTER_VALUES)[0] as {
        rules: { custom: AdapterRule[]; external: AdapterRule[] };
      };
      type AdapterRule = { seriesQuery: string; metricsQuery: string; name: { as: string } };
      const published = new Map<string, { kind: "Pods" | "External"; rule: AdapterRule }>();
      for (const [kind, rules] of [
        ["Pods", values.rules.custom],
        ["External", values.rules.external],
      ] as const) {
        for (const rule of rules) {
          const seriesMetrics = exported.query(rule.seriesQuery, `adapter ${rule.name.as} seriesQuery`);
          exported.query(expandAdapter(rule.metricsQuery, seriesMetrics[0]!), `adapter ${rule.name.as} metricsQuery`);
          expect(rule.name.as).toMatch(/^[a-z0-9_]+$/);
          published.set(rule.name.as, { kind, rule });
        }
      }
      for (const hpa of hpas) {
        const spec = hpa.spec as {
          minReplicas: number;
          maxReplicas: number;
          scaleTargetRef: { name: string };
          metrics: { type: string; pods?: any; external?: any; resource?: any }[];
        };
        expect(spec.minReplicas).toBeGreaterThanOrEqual(1);
        expect(spec.maxReplicas).toBeGreaterThan(spec.minReplicas);
        for (const m of spec.metrics) {
          if (m.type === "Resource") {
            // From the metrics server, not the adapter: utilisation of the containers' CPU requests.
            const where = `${hpa.metadata.name}/${m.resource.name}`;
            expect(m.resource.name, where).toBe("cpu");
            expect(m.resource.target.type, where).toBe("Utilization");
            expect(m.resource.target.averageUtilization, where).toBeGreaterThan(0);
            expect(m.resource.target.averageUtilization, where).toBeLessThanOrEqual(100);
            for (const cpu of cpuRequests(spec.scaleTargetRef.name))
              expect(parseQuantity(cpu!), `${where}: CPU request`).toBeGreaterThan(0);
            continue;
          }
          const body = m.type === "Pods" ? m.pods : m.external;
          const where = `${hpa.metadata.name}/${body.metric.name}`;
          const rule = published.get(body.metric.name);
          expect(rule?.kind, `${where} is not published by the adapter as a ${m.type} metric`).toBe(m.type);
          const target = sloFor(rule!.rule.metricsQuery + rule!.rule.seriesQuery);
          if (target !== undefined) {
            expect(body.target.type, where).toBe("Value");
            const value = parseQuantity(body.target.value);
            expect(value, where).toBeLessThanOrEqual(target);
            expect(value, where).toBeGreaterThanOrEqual(target / 2);
          }
        }
      }
    });
  });
});

function hasKubectl(): boolean {
  try {
    execFileSync("kubectl", ["version", "--client"], { stdio: "ignore" });
    return true;
  } catch {
    return false;
  }
}
