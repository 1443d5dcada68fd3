// Runs the drizzle-kit CLI (`npm run db:generate`) with the project's top-level esbuild.
// Why: drizzle-kit 0.31 pins its own esbuild 0.25, whose platform binary is never installed here
// (.npmrc has omit=optional), so the CLI dies with "Host version ... does not match binary
// version". The top-level esbuild (whose binary is a devDependency) serves the same API.
const Module = require("node:module");
const path = require("node:path");

const root = path.resolve(__dirname, "../../..");
const esbuild = require.resolve("esbuild", { paths: [root] });
const resolve = Module._resolveFilename;
Module._resolveFilename = function (request, ...rest) {
  return request === "esbuild" ? esbuild : resolve.call(this, request, ...rest);
};
process.chdir(root);
require(path.join(root, "node_modules/drizzle-kit/bin.cjs"));
