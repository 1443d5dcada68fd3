// Kubernetes resource quantities ("2560Mi", "1Gi", "250m", "2", "1e3") as plain numbers.
const SUFFIX: Record<string, number> = {
  "": 1,
  m: 1e-3,
  k: 1e3,
  M: 1e6,
  G: 1e9,
  T: 1e12,
  Ki: 2 ** 10,
  Mi: 2 ** 20,
  Gi: 2 ** 30,
  Ti: 2 ** 40,
};

export function parseQuantity(q: string | number): number {
  if (typeof q === "number") return q;
  const m = /^([+-]?(?:\d+\.?\d*|\.\d+)(?:[eE][+-]?\d+)?)(m|k|M|G|T|Ki|Mi|Gi|Ti)?$/.exec(q.trim());
  if (!m) throw new Error(`not a Kubernetes quantity: ${JSON.stringify(q)}`);
  return Number(m[1]) * SUFFIX[m[2] ?? ""]!;
}
