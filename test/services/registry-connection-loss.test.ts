// The registry's PostgreSQL connection dropping in the middle of a transaction (a database restart,
// found by the fault matrix) fails that transaction and nothing else: it used to emit an unhandled
// 'error' on the checked-out pg client, which killed the process.
import { sql } from "drizzle-orm";
import pg from "pg";
import { afterAll, beforeAll, expect, it } from "vitest";
import { openDatabase, type OpenedDatabase } from "../../shared/platform/registry/db.ts";
import { startPostgres, type TestPostgres } from "../../tools/lib/postgres.ts";

let server: TestPostgres;
let opened: OpenedDatabase;
let admin: pg.Client;

beforeAll(async () => {
  server = await startPostgres();
  opened = await openDatabase(server.url, { timeoutMs: 3_000 });
  admin = new pg.Client({ connectionString: server.url });
  await admin.connect();
}, 60_000);
afterAll(async () => {
  await admin?.end();
  await opened?.close();
  await server?.stop();
});

it("a connection terminated between a transaction's statements fails the transaction, not the process", async () => {
  const uncaught: unknown[] = [];
  const onUncaught = (e: unknown) => uncaught.push(e);
  process.on("uncaughtException", onUncaught);
  try {
    const tx = opened.db.transaction(async (t) => {
      const pid = ((await t.execute(sql`select pg_backend_pid() as pid`)) as unknown as { rows: { pid: number }[] }).rows[0]!.pid;
      await admin.query("select pg_terminate_backend($1)", [pid]);
      await new Promise((r) => setTimeout(r, 300)); // the termination reaches the client while it holds the transaction
      await t.execute(sql`select 1`);
    });
    await expect(tx).rejects.toThrow();
    await new Promise((r) => setTimeout(r, 100));
    expect(uncaught).toEqual([]);
    await opened.ping(); // the pool serves again
  } finally {
    process.off("uncaughtException", onUncaught);
  }
});
