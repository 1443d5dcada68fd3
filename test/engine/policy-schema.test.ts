// The policy's one schema (shared/inference/policy/schema.ts) against the native addon's parser
// (native/src/addon_policy.cc): the same fields per sub-object, every one required, none extra;
// and the schema's own rules (defaults, stray sub-objects, kinds) as the API sees them.
import { beforeAll, describe, expect, it } from "vitest";

import { POLICY_DEFAULTS } from "../../shared/inference/defaults.ts";
import { Engine, loadModel } from "../../shared/inference/engine/engine.ts";
import { addon, type AttentionPolicy, type NativeSequence } from "../../shared/inference/engine/native.ts";
import { resolveModel } from "../../shared/inference/model/resolve.ts";
import {
  completePolicy,
  engineFieldNames,
  POLICY_PART_SCHEMAS,
  POLICY_PARTS,
  PolicySpecSchema,
  type PolicyPart,
} from "../../shared/inference/policy/schema.ts";
import { resolvedSpec, resolvePolicy } from "../../shared/inference/policy/request.ts";

let engine: Engine;
beforeAll(async () => {
  engine = new Engine(await loadModel(await resolveModel()), { threads: 1 });
});

/** A complete, valid engine policy of each kind that has one sub-object of its own. */
const complete: Record<PolicyPart, AttentionPolicy> = {
  omnikv: completePolicy({ kind: "omnikv", omnikv: { filterLayers: [2, 8], budget: 64 } }),
  scope: completePolicy({ kind: "scope", scope: { maxOutput: 32 } }),
  streaming: completePolicy({ kind: "streaming", streaming: {} }),
  h2o: completePolicy({ kind: "h2o", h2o: {} }),
  rounds: completePolicy({ kind: "rounds", rounds: { watershedLayer: 10, starts: [0, 40] } }),
};

function setRaw(seq: NativeSequence, policy: unknown): void {
  (seq as unknown as { setCompletePolicy(p: unknown): void }).setCompletePolicy(policy);
}

describe("the addon parses exactly the schema's fields", () => {
  it("lists the same fields per sub-object, in any order", () => {
    const native = addon().policyFields();
    const schema = engineFieldNames();
    expect(Object.keys(native).sort()).toEqual(Object.keys(schema).sort());
    for (const part of Object.keys(schema) as PolicyPart[]) expect([...native[part]].sort(), part).toEqual([...schema[part]].sort());
  });

  it("takes the complete policy of every kind", () => {
    const seq = engine.createSequence(64);
    for (const policy of Object.values(complete)) expect(() => setRaw(seq, policy)).not.toThrow();
    seq.release();
  });

  it("refuses each missing field, naming it (it fills in nothing)", () => {
    const seq = engine.createSequence(64);
    for (const [part, policy] of Object.entries(complete) as [PolicyPart, AttentionPolicy][]) {
      const fields = (policy as unknown as Record<string, Record<string, unknown>>)[part]!;
      for (const field of Object.keys(POLICY_PART_SCHEMAS[part].shape).map((k) =>
        k.replace(/_([a-z])/g, (_, c: string) => c.toUpperCase()),
      )) {
        const { [field]: _dropped, ...rest } = fields;
        expect(() => setRaw(seq, { ...policy, [part]: rest }), `${part}.${field}`).toThrow(
          new RegExp(`policy\\.${part}\\.${field} is missing`),
        );
      }
    }
    seq.release();
  });

  it("refuses an unknown field and a sub-object the kind does not read", () => {
    const seq = engine.createSequence(64);
    for (const [part, policy] of Object.entries(complete) as [PolicyPart, AttentionPolicy][]) {
      const fields = (policy as unknown as Record<string, Record<string, unknown>>)[part]!;
      expect(() => setRaw(seq, { ...policy, [part]: { ...fields, polcy: 1 } })).toThrow(
        new RegExp(`policy\\.${part}\\.polcy is not a field`),
      );
    }
    expect(() => setRaw(seq, { kind: "full", omnikv: (complete.omnikv as { omnikv: unknown }).omnikv })).toThrow(
      /policy\.omnikv is not a field/,
    );
    seq.release();
  });
  it("reads exactly the sub-objects the schema gives each kind", () => {
    const seq = engine.createSequence(64);
    const sub = (part: PolicyPart) => (complete[part] as unknown as Record<string, unknown>)[part];
    for (const [kind, parts] of Object.entries(POLICY_PARTS) as [keyof typeof POLICY_PARTS, readonly PolicyPart[]][]) {
      const own = Object.fromEntries(parts.map((p) => [p, sub(p)]));
      expect(() => setRaw(seq, { kind, ...own }), kind).not.toThrow();
      for (const part of Object.keys(POLICY_PART_SCHEMAS) as PolicyPart[]) {
        if (parts.includes(part)) {
          const { [part]: _dropped, ...rest } = own;
          expect(() => setRaw(seq, { kind, ...rest }), `${kind} without ${part}`).toThrow(new RegExp(`policy\\.${part} is missing`));
        } else {
          expect(() => setRaw(seq, { kind, ...own, [part]: sub(part) }), `${kind} with ${part}`).toThrow(
            new RegExp(`policy\\.${part} is not a field`),
          );
        }
      }
    }
    seq.release();
  });
});

describe("the schema", () => {
  it("writes in the defaults of shared/inference/defaults.ts, and only those", () => {
    for (const part of Object.keys(POLICY_DEFAULTS) as PolicyPart[]) {
      const parsed = POLICY_PART_SCHEMAS[part].parse({}) as Record<string, unknown>;
      expect(parsed, part).toEqual(POLICY_DEFAULTS[part]);
    }
  });

  it("refuses a sub-object the kind does not read, naming it", () => {
    const r = PolicySpecSchema.safeParse({ kind: "full", omnikv: { budget: 64 } });
    expect(r.success).toBe(false);
    expect(r.error!.issues[0]!.path).toEqual(["omnikv"]);
    expect(r.error!.issues[0]!.message).toMatch(/does not apply to kind full/);
    for (const [kind, parts] of Object.entries(POLICY_PARTS)) {
      const spec = Object.fromEntries([["kind", kind], ...parts.map((p) => [p, {}])]);
      expect(PolicySpecSchema.safeParse(spec).success, kind).toBe(true);
    }
  });

  it("refuses what the engine refuses: h2o.recent 0, budget not above recent, an unknown kind", () => {
    expect(PolicySpecSchema.safeParse({ kind: "h2o", h2o: { recent: 0 } }).success).toBe(false);
    expect(PolicySpecSchema.safeParse({ kind: "h2o", h2o: { budget: 256, recent: 256 } }).success).toBe(false);
    expect(PolicySpecSchema.safeParse({ kind: "h2o", h2o: { budget: 257, recent: 256 } }).success).toBe(true);
    const r = PolicySpecSchema.safeParse({ kind: "snapkv" });
    expect(r.error!.issues[0]!.message).toMatch(/unknown policy: give one of full, omnikv/);
  });

  it("reports the resolved policy in the wire's shape, which parses back to itself", () => {
    const policy = resolvePolicy(
      { kind: "omnikv+scope", omnikv: { budget: 0.5 } },
      { filterLayers: [2, 7], promptTokens: 100, maxTokens: 20 },
    );
    const spec = resolvedSpec(policy);
    expect(spec).toEqual({
      kind: "omnikv+scope",
      omnikv: { ...POLICY_DEFAULTS.omnikv, filter_layers: [2, 7], budget: 50 },
      scope: { ...POLICY_DEFAULTS.scope, max_output: 20 },
    });
    expect(PolicySpecSchema.parse(spec)).toEqual(spec);
  });
});
