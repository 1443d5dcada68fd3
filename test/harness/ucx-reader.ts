// A UCX reader in its own process, for the UCX transport tests: reads the chunk location given as
// one JSON argument over and over, printing "reading" after its first read, until it is killed.
// The tests kill it mid-read to play a decode that dies while pulling from an owner.
import { UcxTransport, type UcxChunkLocation } from "../../services/handoff/transport/ucx.ts";

const loc = JSON.parse(process.argv[2]!) as UcxChunkLocation;
const into = new Uint8Array(loc.length);
const transport = new UcxTransport();
for (let i = 0; ; i++) {
  await transport.readChunk(loc, into, { deadlineMs: Date.now() + 30_000 });
  if (i === 0) process.stdout.write("reading\n");
}
