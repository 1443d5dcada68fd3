// The router's choice (services/router/choose.ts): the holder of the request's KV unless it is far
// busier than the least loaded decode; else the least loaded, more free KV breaking a tie.
import { describe, expect, it } from "vitest";
import { chooseDecode, Turns } from "../../services/router/choose.ts";
import type { DecodeTarget } from "../../services/router/decode-pool.ts";

const t = (id: string, load: number, kvFree = 1000): DecodeTarget => ({
  id,
  publicUrl: `http://${id}`,
  internalUrl: `http://${id}:1`,
  load,
  kvFree,
});

describe("chooseDecode", () => {
  it("without a holder: the least loaded, more free KV breaking a tie, then the first", () => {
    expect(chooseDecode([t("a", 3), t("b", 1), t("c", 2)], undefined, 8)).toMatchObject({ target: { id: "b" }, reason: "load" });
    expect(chooseDecode([t("a", 1, 10), t("b", 1, 20)], undefined, 8)?.target.id).toBe("b");
    expect(chooseDecode([t("a", 1), t("b", 1)], undefined, 8)?.target.id).toBe("a");
    expect(chooseDecode([], undefined, 8)).toBeUndefined();
  });

  it("the holder of a session or a prefix, unless it has more than `imbalance` requests beyond the least loaded", () => {
    const targets = [t("a", 0), t("b", 8)];
    expect(chooseDecode(targets, { instanceId: "b", by: "session" }, 8)).toMatchObject({ target: { id: "b" }, reason: "session" });
    expect(chooseDecode(targets, { instanceId: "b", by: "prefix" }, 8)).toMatchObject({ target: { id: "b" }, reason: "prefix" });
    expect(chooseDecode(targets, { instanceId: "b", by: "session" }, 7)).toMatchObject({ target: { id: "a" }, reason: "holder_busy" });
    // A holder the router cannot reach (dead, draining, not listed): the least loaded.
    expect(chooseDecode(targets, { instanceId: "gone", by: "session" }, 8)).toMatchObject({ target: { id: "a" }, reason: "holder_gone" });
  });

  it("round robin takes the decodes in turn", () => {
    const turns = new Turns();
    const targets = [t("a", 5), t("b", 0), t("c", 0)];
    expect([1, 2, 3, 4].map(() => turns.take(targets)?.id)).toEqual(["a", "b", "c", "a"]);
    expect(turns.take([])).toBeUndefined();
  });
});
