// Used only by `npm run db:generate` (drizzle-kit); services apply ./migrations at start via
// shared/platform/registry/db.ts, on PGlite and on PostgreSQL alike.
import { defineConfig } from "drizzle-kit";

export default defineConfig({
  dialect: "postgresql",
  schema: "./shared/platform/registry/schema.ts",
  out: "./migrations",
});
