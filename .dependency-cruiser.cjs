// Import rules of the repository (docs/architecture.md describes the layers), enforced by
// test/unit/architecture.test.ts. By hand: npx depcruise bin shared services tools bench test
//
// Third-party packages are matched by their resolved path under node_modules/.
const HTTP = "^node_modules/(hono|@hono/[^/]+)/";
const DATABASE = "^node_modules/(drizzle-orm|pg|@electric-sql/pglite)/";

/** @type {import("dependency-cruiser").IConfiguration} */
module.exports = {
  forbidden: [
    {
      name: "no-circular",
      severity: "error",
      comment: "An import loop (type-only imports count): modules that cannot be understood, or loaded, one without the other.",
      from: { path: "^(bin|shared|services|tools|bench|test)/" },
      to: { circular: true },
    },
    {
      name: "database-only-in-registry",
      severity: "error",
      comment: "Only the registry's stores (shared/platform/registry) talk to the database; services call their named methods.",
      // tools/lib/postgres.ts starts the PostgreSQL server tests and benches use; test/ inspects the rows.
      from: { pathNot: "^(shared/platform/registry/|test/|tools/lib/postgres\\.ts$)" },
      to: { path: DATABASE },
    },
    {
      name: "inference-is-standalone",
      severity: "error",
      comment: "shared/inference is the library the CLI, services and benches use: no HTTP, no database, no service code.",
      from: { path: "^shared/inference/" },
      to: { path: ["^shared/platform/", "^services/", "^bin/", HTTP, DATABASE] },
    },
    {
      name: "platform-below-services",
      severity: "error",
      comment: "shared/platform is infrastructure the services build on; it never reaches back into them.",
      from: { path: "^shared/" },
      to: { path: ["^services/", "^bin/"] },
    },
    {
      name: "handoff-through-its-face",
      severity: "error",
      comment: "The KV handoff has one face: the rest of services/ imports services/handoff/index.ts, never a module behind it.",
      from: { path: "^services/", pathNot: "^services/handoff/" },
      to: { path: "^services/handoff/", pathNot: "^services/handoff/index\\.ts$" },
    },
    {
      name: "handoff-below-prefill-and-decode",
      severity: "error",
      comment:
        "The handoff serves the prefill and decode services; it never reaches back into them (what it needs of them is an interface of its own).",
      from: { path: "^services/handoff/" },
      to: { path: "^services/(prefill|decode)/" },
    },
    {
      name: "no-test-code-in-tools-or-bench",
      severity: "error",
      comment: "Benches and tools use tools/lib; test/ may use tools/lib, never the other way round.",
      from: { path: "^(tools|bench)/" },
      to: { path: "^test/" },
    },
    {
      name: "no-test-code-in-the-product",
      severity: "error",
      comment:
        "The CLI, services and shared code never import test/ (its harness included): a test switch is an option the test passes in.",
      from: { path: "^(bin|shared|services)/" },
      to: { path: "^test/" },
    },
    {
      name: "no-bench-code-in-tools",
      severity: "error",
      comment: "Tools serve benches, tests and operators; what a bench and a tool share lives in tools/lib, never in bench/.",
      from: { path: "^tools/" },
      to: { path: "^bench/" },
    },
    {
      name: "cli-loads-services-lazily",
      severity: "error",
      comment:
        "`ctxbank generate` must not load the HTTP stack: bin/ reaches services/ and Hono only through a dynamic import " +
        "(test/unit/architecture.test.ts also checks the static closure of bin/ctxbank.ts and the running CLI).",
      from: { path: "^bin/" },
      to: { path: ["^services/", HTTP], dynamic: false },
    },
  ],
  options: {
    doNotFollow: { path: "node_modules" },
    exclude: { path: "^native/build" },
    // Type-only imports count too: a loop through types is still a loop in the design.
    tsPreCompilationDeps: true,
    tsConfig: { fileName: "tsconfig.json" },
    enhancedResolveOptions: {
      exportsFields: ["exports"],
      conditionNames: ["import", "require", "node", "default", "types"],
    },
  },
};
