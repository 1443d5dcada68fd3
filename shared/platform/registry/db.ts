// Opens the registry database: a real PostgreSQL (postgres:// or postgresql:// URL, through a pg
// Pool) or an embedded PGlite (pglite://memory, or pglite:///abs/dir for a persistent one), and
// applies ./migrations before returning, so every caller sees the current schema.
import { fileURLToPath } from "node:url";
import path from "node:path";
import { PGlite } from "@electric-sql/pglite";
import { drizzle as drizzlePg } from "drizzle-orm/node-postgres";
import { migrate as migratePg } from "drizzle-orm/node-postgres/migrator";
import { drizzle as drizzlePglite } from "drizzle-orm/pglite";
import { migrate as migratePglite } from "drizzle-orm/pglite/migrator";
import type { PgDatabase, PgQueryResultHKT } from "drizzle-orm/pg-core";
import pg from "pg";
import { redactDatabaseUrl } from "./redact-url.ts";
import * as schema from "./schema.ts";

export type Database = PgDatabase<PgQueryResultHKT, typeof schema>;
export type DatabaseKind = "postgres" | "pglite";

export interface OpenedDatabase {
  db: Database;
  kind: DatabaseKind;
  /** A cheap round trip (`select 1`); see db-probe.ts for the deadline and caching around it. */
  ping(): Promise<void>;
  close(): Promise<void>;
}

const MIGRATIONS_DIR = fileURLToPath(new URL("../../../migrations", import.meta.url));
// Arbitrary constant: serialises migrations of services that start at the same time.
const MIGRATION_LOCK_KEY = 0x6374_7862; // "ctxb"

export interface DatabaseOptions {
  /**
   * PostgreSQL: deadline of one query (client side, so a hung or stopped server cannot hold a
   * request forever) and of one connection attempt. Default 15 s.
   */
  timeoutMs?: number;
}

export async function openDatabase(url: string, options: DatabaseOptions = {}): Promise<OpenedDatabase> {
  if (/^postgres(ql)?:\/\//.test(url)) return openPostgres(url, options.timeoutMs ?? 15_000);
  if (url.startsWith("pglite://")) return openPglite(url);
  throw new Error(
    `unsupported database URL "${redactDatabaseUrl(url)}": use postgres://…, postgresql://…, pglite://memory or pglite:///absolute/dir`,
  );
}

async function openPostgres(url: string, timeoutMs: number): Promise<OpenedDatabase> {
  const pool = new pg.Pool({ connectionString: url, max: 10, connectionTimeoutMillis: timeoutMs, query_timeout: timeoutMs });
  // An idle client whose server went away emits 'error' on the pool; unhandled, that kills the
  // process. The next query reports the failure to its caller instead.
  pool.on("error", () => {});
  // A client checked out of the pool (inside a transaction, between its statements) has no such
  // listener: its connection dropping (a database restart) emitted an unhandled 'error' and killed
  // the process. With one, the transaction's next statement fails and the pool drops the client.
  pool.on("connect", (client) => client.on("error", () => {}));
  try {
    const client = await pool.connect();
    try {
      await client.query("select pg_advisory_lock($1)", [MIGRATION_LOCK_KEY]);
      try {
        await migratePg(drizzlePg(client, { schema }), { migrationsFolder: MIGRATIONS_DIR });
      } finally {
        await client.query("select pg_advisory_unlock($1)", [MIGRATION_LOCK_KEY]);
      }
    } finally {
      client.release();
    }
  } catch (err) {
    await pool.end();
    throw new Error(`cannot open PostgreSQL at ${redactDatabaseUrl(url)}: ${(err as Error).message}`, { cause: err });
  }
  return {
    db: drizzlePg(pool, { schema }),
    kind: "postgres",
    ping: () => pool.query("select 1").then(() => undefined),
    close: () => pool.end(),
  };
}

async function openPglite(url: string): Promise<OpenedDatabase> {
  const location = url.slice("pglite://".length);
  let dataDir: string;
  if (location === "memory") dataDir = "memory://";
  else if (path.isAbsolute(location)) dataDir = location;
  else throw new Error(`PGlite URL "${url}" must be pglite://memory or pglite:///absolute/dir`);
  const client = await PGlite.create(dataDir);
  try {
    const db = drizzlePglite(client, { schema });
    await migratePglite(db, { migrationsFolder: MIGRATIONS_DIR });
    return { db: db, kind: "pglite", ping: () => client.query("select 1").then(() => undefined), close: () => client.close() };
  } catch (err) {
    await client.close();
    throw err;
  }
}

/** A transaction handle, as passed to `db.transaction(async (tx) => …)`. */
export type Transaction = Parameters<Parameters<Database["transaction"]>[0]>[0];
