// Offline checks of deploy/docker: the Dockerfile against the repository and .dockerignore, its
// stages, user, entry point and healthcheck, and the production packages the image holds. No
// Docker engine is involved; see deploy/README.md for what that leaves unchecked.
import { existsSync, readdirSync, readFileSync, statSync } from "node:fs";
import path from "node:path";
import { describe, expect, it } from "vitest";
import { copyPaths, execForm, isIgnored, parseDockerignore } from "../harness/deploy/dockerfile.ts";
import { runtimeNeeds } from "../harness/deploy/imports.ts";
import { at, dockerfile, imageEnv, root, runtime } from "../harness/deploy/setup.ts";

describe("Dockerfile", () => {
  const ignore = parseDockerignore(readFileSync(at(".dockerignore"), "utf8"));
  const stageNames = dockerfile.stages.map((s) => s.name);

  it("builds on node:20-bookworm and runs on node:20-bookworm-slim", () => {
    expect(dockerfile.stages.length).toBeGreaterThanOrEqual(2);
    for (const s of dockerfile.stages.slice(0, -1)) expect(s.image, `stage ${s.name}`).toMatch(/^(node:20-bookworm|[a-z]+)$/);
    expect(runtime.image).toBe("node:20-bookworm-slim");
    // No compiler or package manager cache in the final stage: it only copies.
    expect(
      runtime.instructions
        .filter((i) => i.keyword === "RUN")
        .map((i) => i.rest)
        .join("\n"),
    ).not.toMatch(/apt-get install|npm (ci|install)|cmake/);
  });

  it("copies only files that exist in the repository and that .dockerignore lets through", () => {
    const sources = dockerfile.stages.flatMap((s) =>
      s.instructions.filter((i) => (i.keyword === "COPY" || i.keyword === "ADD") && !("from" in i.flags)),
    );
    expect(sources.length).toBeGreaterThan(5);
    for (const ins of sources) {
      expect(ins.keyword, `line ${ins.line}: use COPY`).toBe("COPY");
      for (const src of copyPaths(ins).sources) {
        expect(existsSync(at(src)), `line ${ins.line}: ${src} does not exist`).toBe(true);
        expect(isIgnored(src, ignore), `line ${ins.line}: ${src} is excluded by .dockerignore`).toBe(false);
        if (statSync(at(src)).isDirectory()) {
          // Something under a copied directory must survive (the exclusions are for build outputs).
          const kept = readdirSync(at(src), { recursive: true, encoding: "utf8" }).filter((f) => !isIgnored(path.join(src, f), ignore));
          expect(kept.length, `line ${ins.line}: everything under ${src} is excluded`).toBeGreaterThan(0);
        }
      }
    }
    for (const never of [
      "node_modules/tsx/package.json",
      "native/build/Release/ctxbank_native.node",
      "x/model.gguf",
      "bench/engine/run.ts",
      "test/deploy.test.ts",
    ]) {
      expect(isIgnored(never, ignore), `${never} must stay out of the build context`).toBe(true);
    }
  });

  it("takes --from only from earlier stages", () => {
    dockerfile.stages.forEach((stage, index) => {
      for (const ins of stage.instructions) {
        const from = ins.flags.from;
        if (from === undefined) continue;
        const at = stageNames.indexOf(from);
        expect(at, `line ${ins.line}: no stage ${from}`).toBeGreaterThanOrEqual(0);
        expect(at, `line ${ins.line}: ${from} is not an earlier stage`).toBeLessThan(index);
      }
    });
    for (const s of dockerfile.stages.slice(1)) {
      if (stageNames.includes(s.image)) expect(stageNames.indexOf(s.image)).toBeLessThan(dockerfile.stages.indexOf(s));
    }
  });

  it("runs as a fixed numeric non-root user, exec-form ENTRYPOINT/CMD and HEALTHCHECK", () => {
    const last = (k: string) => runtime.instructions.filter((i) => i.keyword === k).at(-1);
    const user = last("USER")?.rest;
    // Numeric, so the kubelet can verify runAsNonRoot without reading /etc/passwd.
    expect(user).toMatch(/^\d+(:\d+)?$/);
    expect(Number(user!.split(":")[0])).toBeGreaterThan(0);
    const entrypoint = execForm(last("ENTRYPOINT")!.rest);
    const cmd = execForm(last("CMD")!.rest);
    expect(entrypoint?.[0], "exec form, node as PID 1 gets SIGTERM").toBe("node");
    expect(cmd).toEqual(["serve"]);
    const health = last("HEALTHCHECK")!.rest.replace(/^(--\S+\s+)*/, "");
    expect(health.startsWith("CMD ")).toBe(true);
    const healthCmd = execForm(health.slice(4));
    expect(healthCmd?.[0]).toBe("node");
    expect(healthCmd![1]).toMatch(/^\/app\//);
    const stop = last("STOPSIGNAL")?.rest ?? "SIGTERM";
    expect(stop).toBe("SIGTERM");
    // The port the image listens on is the one it exposes and health-checks (CTXBANK_PORT).
    expect(last("EXPOSE")?.rest).toBe(imageEnv(runtime).CTXBANK_PORT);
    expect(imageEnv(runtime).CTXBANK_HOST).toBe("0.0.0.0");
  });

  it("holds every file the entry point loads, and only production packages", () => {
    const workdir = runtime.instructions.filter((i) => i.keyword === "WORKDIR").at(-1)!.rest;
    // What lands where: context copies (repo path -> image path) and copies from other stages.
    const inImage: { from?: string; source: string; dest: string; dir: boolean }[] = [];
    for (const ins of runtime.instructions.filter((i) => i.keyword === "COPY")) {
      const { sources, dest } = copyPaths(ins);
      const destAbs = path.posix.resolve(workdir, dest);
      for (const source of sources) {
        const dir = ins.flags.from === undefined && statSync(at(source)).isDirectory();
        const into = dest.endsWith("/") || sources.length > 1 ? path.posix.join(destAbs, dir ? "" : path.posix.basename(source)) : destAbs;
        inImage.push({ ...(ins.flags.from !== undefined ? { from: ins.flags.from } : {}), source, dest: into, dir });
      }
    }
    const imagePath = (repoRel: string) => {
      for (const c of inImage.filter((c) => c.from === undefined)) {
        if (repoRel === c.source) return c.dest;
        if (c.dir && repoRel.startsWith(c.source + "/")) return path.posix.join(c.dest, repoRel.slice(c.source.length + 1));
      }
      return undefined;
    };
    const entrypoint = execForm(runtime.instructions.filter((i) => i.keyword === "ENTRYPOINT").at(-1)!.rest)!;
    const script = entrypoint.find((a) => a.endsWith(".ts"))!;
    const scriptRepo = path.posix.relative(workdir, script);
    expect(imagePath(scriptRepo), `${script} is not copied`).toBe(script);
    expect(entrypoint).toContain("--import=tsx");

    const needs = runtimeNeeds(at(scriptRepo));
    for (const file of [...needs.modules, ...needs.assets]) {
      const rel = path.relative(root, file);
      if (rel === "native/build/Release/ctxbank_native.node") {
        // Built in the native stage, copied to the same place relative to the code.
        const addon = inImage.find((c) => c.from === "native");
        expect(addon?.dest).toBe(path.posix.join(workdir, rel));
        continue;
      }
      expect(imagePath(rel), `${rel} (loaded by the service) is not in the image`).toBe(path.posix.join(workdir, rel));
    }
    expect(imagePath("package.json"), "package.json (type: module) must be in the image").toBe(path.posix.join(workdir, "package.json"));

    const pkg = JSON.parse(readFileSync(at("package.json"), "utf8")) as { dependencies: Record<string, string> };
    for (const name of [...needs.packages, "tsx"]) expect(pkg.dependencies[name], `${name} is not a production dependency`).toBeDefined();
  });

  it("installs production dependencies with the optional ones .npmrc omits (tsx needs esbuild's binary)", () => {
    const npm = dockerfile.stages
      .flatMap((s) => s.instructions)
      .find((i) => i.keyword === "RUN" && /\bnpm (ci|install)\b/.test(i.rest))!.rest;
    expect(npm).toMatch(/--omit=dev/);
    if (/^omit=optional$/m.test(readFileSync(at(".npmrc"), "utf8"))) expect(npm).toMatch(/--include=optional/);
    const lock = JSON.parse(readFileSync(at("package-lock.json"), "utf8")) as {
      packages: Record<string, { dev?: boolean; optionalDependencies?: Record<string, string> }>;
    };
    expect(lock.packages["node_modules/@esbuild/linux-x64"]?.dev, "esbuild's binary must survive --omit=dev").not.toBe(true);
    // `npm ci` refuses a lockfile that lacks optional packages of a package in it (node-llama-cpp's
    // platform builds the registry does not serve); `npm install` follows the lockfile and skips them.
    const missing = Object.entries(lock.packages).flatMap(([where, p]) =>
      Object.keys(p.optionalDependencies ?? {}).filter(
        (dep) => !(`${where}/node_modules/${dep}` in lock.packages) && !(`node_modules/${dep}` in lock.packages),
      ),
    );
    if (missing.length > 0) expect(npm, `npm ci would fail on the lockfile (missing ${missing[0]})`).not.toMatch(/\bnpm ci\b/);
  });
});
