// Crash cleanup end to end (issue 10): a prefill killed with SIGKILL — one request prefilled and
// never decoded, another in the middle of its prefill — and a new prefill started under another
// instance id (what a restarted pod does). The new one's sweep removes the dead one's shard file,
// chunk rows and refs, and ends both request rows; its own shard is untouched.
import { existsSync, readdirSync } from "node:fs";
import path from "node:path";
import pg from "pg";
import { afterAll, beforeAll, expect, it } from "vitest";
import { startPostgres, type TestPostgres } from "../../tools/lib/postgres.ts";
import { startService, tempShardDir, until, type ServiceProcess } from "../../tools/lib/services.ts";
import { postJson } from "../harness/http.ts";

let db: TestPostgres;
let client: pg.Client;
let shards: Awaited<ReturnType<typeof tempShardDir>>;
const procs: ServiceProcess[] = [];

beforeAll(async () => {
  db = await startPostgres();
  client = new pg.Client({ connectionString: db.url });
  await client.connect();
  shards = await tempShardDir();
});
afterAll(async () => {
  for (const p of procs) await p.kill();
  await client?.end();
  await shards?.remove();
  await db?.stop();
});

const prefill = (id: string) =>
  startService(
    "prefill",
    [
      "--instance-id",
      id,
      "--shard-dir",
      shards.dir,
      "--shard-bytes",
      String(128 << 20),
      "--threads",
      "1",
      "--block-tokens",
      "64",
      "--heartbeat-ms",
      "200",
      "--heartbeat-timeout-ms",
      "1000",
      "--sweep-ms",
      "300",
      "--retain-ms",
      "1000",
    ],
    { DATABASE_URL: db.url },
  ).then((p) => (procs.push(p), p));

const one = async <T>(text: string, params: unknown[] = []) => (await client.query(text, params)).rows[0] as T;

it("a live prefill sweeps a killed one's shard file, chunks, refs and open requests", async () => {
  const dead = await prefill("pf-dead");
  const handle = await postJson(`${dead.url}/v1/prefill`, { prompt: "A request prefilled and never decoded. ".repeat(20) });
  expect(handle.status).toBe(200);
  const requestId = (handle.body as { request_id: string }).request_id;
  // A second prompt long enough to be caught mid-prefill.
  void postJson(`${dead.url}/v1/prefill`, {
    prompt: "Another prompt, still being prefilled when the process dies. ".repeat(120),
    request_id: "req-mid",
  }).catch(() => {});
  await until(
    "the long prompt is prefilling",
    async () => (await one<{ state: string } | undefined>("select state from requests where id = 'req-mid'"))?.state === "prefilling",
    30_000,
  );
  const deadFile = path.join(shards.dir, "pf-dead.e1.shard");
  expect(existsSync(deadFile)).toBe(true);
  expect((await one<{ n: number }>("select count(*)::int as n from chunks where shard_id = 'pf-dead'")).n).toBeGreaterThan(0);
  await dead.kill();

  const live = await prefill("pf-live"); // the restart, under another id
  await until(
    "the dead prefill's litter is swept",
    async () => {
      const chunks = await one<{ n: number }>("select count(*)::int as n from chunks where shard_id = 'pf-dead'");
      const open = await one<{ n: number }>("select count(*)::int as n from requests where state in ('queued', 'prefilling', 'decoding')");
      return !existsSync(deadFile) && chunks.n === 0 && open.n === 0;
    },
    30_000,
  );
  expect(readdirSync(shards.dir).sort()).toEqual(["pf-live.e1.shard", "pf-live.e1.shard.owner"]);
  expect((await one<{ n: number }>("select count(*)::int as n from chunk_refs")).n).toBe(0);
  expect(await one("select state, error from requests where id = 'req-mid'")).toEqual({
    state: "failed",
    error: "the prefill instance pf-dead died during the request",
  });
  expect(await one("select state from requests where id = $1", [requestId])).toEqual({ state: "failed" });
  expect((await fetch(`${live.url}/ready`)).status).toBe(200);
});
