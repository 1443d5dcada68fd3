// Malformed HTTP requests for the fuzz test, generated with fast-check from a table of routes and
// one valid example per route: the example with a field replaced, removed or added, bodies that
// are not JSON or not objects, wrong methods and content types, random path and query segments,
// and odd headers. Deterministic for a given seed.
import fc from "fast-check";

export interface RouteExample {
  /** Which listener serves it (default the public one). */
  listener?: "public" | "internal";
  method: "GET" | "POST";
  /** A path template: {name} segments are filled with random text in some requests. */
  path: string;
  /** A valid JSON body (POST routes). */
  body?: Record<string, unknown>;
  /** Valid query parameters (GET routes that take some). */
  query?: Record<string, string>;
}

export interface FuzzRequest {
  listener: "public" | "internal";
  method: string;
  path: string;
  headers: Record<string, string>;
  body?: string;
}

const weird = fc.oneof(
  fc.jsonValue({ maxDepth: 3 }),
  fc.string({ unit: "binary", maxLength: 40 }),
  fc.constantFrom(-1, 0, 1e308, -1e308, 2 ** 53, 1.5, Number.MAX_SAFE_INTEGER, "", "\u0000", "<|im_start|>", null, true, [], {}),
  fc.array(fc.integer({ min: -(2 ** 31), max: 2 ** 31 }), { maxLength: 50 }),
  fc.nat({ max: 5000 }).map((n) => "9".repeat(n)),
);

/** A deeply nested array, to check the JSON parser and validators bound their recursion. */
const deep = fc.integer({ min: 10, max: 5000 }).map((n) => "[".repeat(n) + "]".repeat(n));

function mutateBody(example: Record<string, unknown>): fc.Arbitrary<string> {
  const keys = Object.keys(example);
  const replaceField = fc.tuple(fc.constantFrom(...keys), weird).map(([k, v]) => JSON.stringify({ ...example, [k]: v }));
  const dropField = fc.constantFrom(...keys).map((k) => {
    const copy: Record<string, unknown> = { ...example };
    delete copy[k];
    return JSON.stringify(copy);
  });
  const addField = fc.tuple(fc.string({ maxLength: 12 }), weird).map(([k, v]) => JSON.stringify({ ...example, [k]: v }));
  const nestedField = fc
    .tuple(fc.constantFrom(...keys), fc.constantFrom(...keys), weird)
    .map(([k, k2, v]) => JSON.stringify({ ...example, [k]: { [k2]: v } }));
  return fc.oneof(
    { weight: 4, arbitrary: replaceField },
    { weight: 2, arbitrary: dropField },
    { weight: 2, arbitrary: addField },
    { weight: 1, arbitrary: nestedField },
    { weight: 2, arbitrary: fc.jsonValue({ maxDepth: 4 }).map((v) => JSON.stringify(v)) },
    { weight: 1, arbitrary: fc.string({ unit: "binary", maxLength: 200 }) },
    { weight: 1, arbitrary: deep },
    { weight: 1, arbitrary: fc.constantFrom("", "{", "null", '{"a":', JSON.stringify(example).slice(0, -1)) },
  );
}

function fillPath(template: string): fc.Arbitrary<string> {
  const parts = template.split(/(\{[^}]+\})/).filter((p) => p !== "");
  const segment = fc.oneof(
    fc.string({ maxLength: 20 }).map(encodeURIComponent),
    fc.constantFrom("..", "%2e%2e", "0", "-1", "99999999999999999999", "%00", "a".repeat(300)),
    fc.nat().map(String),
  );
  return fc.tuple(...parts.map((p) => (p.startsWith("{") ? segment : fc.constant(p)))).map((xs) => xs.join(""));
}

function fillQuery(query: Record<string, string> | undefined): fc.Arbitrary<string> {
  const keys = Object.keys(query ?? {});
  if (keys.length === 0)
    return fc.oneof(
      fc.constant(""),
      fc.string({ maxLength: 30 }).map((s) => `?${encodeURIComponent(s)}=1`),
    );
  const value = fc.oneof(
    fc.constantFrom("", "-1", "0", "1e3", "18446744073709551616", "0x10", "1.5", "NaN"),
    fc.nat().map(String),
    fc.string({ maxLength: 10 }).map(encodeURIComponent),
  );
  return fc.tuple(...keys.map((k) => fc.option(value.map((v) => `${k}=${v}`)))).map((xs) => {
    const q = xs.filter((x) => x !== null).join("&");
    return q ? `?${q}` : "";
  });
}

const oddHeaders = fc.oneof(
  fc.constant({}),
  fc.record({
    authorization: fc.oneof(
      fc.constant("Bearer "),
      fc.string({ maxLength: 60 }).map((s) => `Bearer ${s.replace(/[^\x21-\x7e]/g, "x")}`),
    ),
  }),
  fc.record({ "x-request-id": fc.string({ maxLength: 300 }).map((s) => s.replace(/[^\x20-\x7e]/g, "x")) }),
  fc.record({ accept: fc.constantFrom("text/event-stream", "*/*", "application/xml") }),
);

/** One malformed (or at least unusual) request for a route. */
export function requestFor(route: RouteExample): fc.Arbitrary<FuzzRequest> {
  const path = fc.oneof(
    { weight: 3, arbitrary: fc.constant(route.path) },
    { weight: route.path.includes("{") ? 3 : 1, arbitrary: fillPath(route.path) },
  );
  const withQuery = fc.tuple(path, fillQuery(route.query)).map(([p, q]) => p + q);
  const listener = fc.constant(route.listener ?? "public");
  if (route.method === "GET") {
    return fc.record({
      listener,
      method: fc.constantFrom("GET", "GET", "GET", "POST", "PUT", "DELETE", "HEAD", "OPTIONS"),
      path: withQuery,
      headers: oddHeaders,
    });
  }
  const contentType = fc.constantFrom(
    "application/json",
    "application/json",
    "application/json",
    "text/plain",
    "application/x-www-form-urlencoded",
    "application/json; charset=latin1",
  );
  return fc
    .record({
      listener,
      method: fc.constantFrom("POST", "POST", "POST", "POST", "GET", "PUT", "PATCH"),
      path: withQuery,
      headers: fc.tuple(oddHeaders, contentType).map(([h, ct]) => ({ ...h, "content-type": ct })),
      body: mutateBody(route.body ?? {}),
    })
    .map((r) => (r.method === "GET" ? { listener: r.listener, method: r.method, path: r.path, headers: r.headers } : r));
}

/** `count` requests spread evenly over the routes, reproducible from `seed`. */
export function fuzzRequests(routes: RouteExample[], count: number, seed: number): FuzzRequest[] {
  const per = Math.ceil(count / routes.length);
  return routes.flatMap((r, i) => fc.sample(requestFor(r), { numRuns: per, seed: seed + i })).slice(0, count);
}
