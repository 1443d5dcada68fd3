// What the load generator learns from the server before loading it: the model id to ask for, and
// whether a ctxbank `policy` field would be honoured (ctxbank's request schemas drop unknown
// fields silently, so sending a policy to a server without the field would quietly measure `full`).
import { request } from "undici";

async function getJson(url: string, apiKey?: string): Promise<{ status: number; body: any }> {
  const res = await request(url, {
    headers: apiKey ? { authorization: `Bearer ${apiKey}` } : {},
    headersTimeout: 10_000,
    bodyTimeout: 10_000,
  });
  const text = await res.body.text();
  try {
    return { status: res.statusCode, body: JSON.parse(text) };
  } catch {
    return { status: res.statusCode, body: text };
  }
}

/** The first model GET {base}/models lists. */
export async function firstModel(baseUrl: string, apiKey?: string): Promise<string> {
  const { status, body } = await getJson(`${baseUrl.replace(/\/+$/, "")}/models`, apiKey);
  const id = body?.data?.[0]?.id;
  if (status !== 200 || typeof id !== "string")
    throw new Error(`GET ${baseUrl}/models answered ${status} without a model id; pass --model`);
  return id;
}

/**
 * The values the server's OpenAPI document allows for a request's `policy` field: undefined
 * when the server publishes no /openapi.json (not ctxbank: the field is sent unchecked), [] when
 * it publishes one without the field, ["*"] when the field is there but not an enum.
 */
export async function policyValues(baseUrl: string, endpointPath: string, apiKey?: string): Promise<string[] | undefined> {
  const origin = new URL(baseUrl).origin;
  let doc: any;
  try {
    const r = await getJson(`${origin}/openapi.json`, apiKey);
    if (r.status !== 200 || typeof r.body !== "object") return undefined;
    doc = r.body;
  } catch {
    return undefined;
  }
  const op = doc?.paths?.[endpointPath]?.post;
  let schema = op?.requestBody?.content?.["application/json"]?.schema;
  const deref = (s: any): any => (s?.$ref ? doc?.components?.schemas?.[String(s.$ref).split("/").pop()!] : s);
  schema = deref(schema);
  const prop = deref(schema?.properties?.policy);
  if (!prop) return [];
  const variants = [prop, ...(prop.anyOf ?? []), ...(prop.oneOf ?? [])].map(deref);
  const values = variants
    .flatMap((v: any) => (Array.isArray(v?.enum) ? v.enum : v?.const !== undefined ? [v.const] : []))
    .filter((v: unknown) => typeof v === "string");
  return values.length > 0 ? values : ["*"];
}
