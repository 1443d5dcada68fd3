// Types for prom-parse.js (plain JavaScript so that the browser runs the same file the tests do).
export interface Sample {
  name: string;
  labels: Record<string, string>;
  value: number;
}
export interface Family {
  name: string;
  type: "counter" | "gauge" | "histogram" | "summary" | "untyped";
  help: string;
  samples: Sample[];
}
export interface Parsed {
  families: Map<string, Family>;
  errors: string[];
}
export function parseValue(text: string): number | undefined;
export function parsePrometheus(text: string): Parsed;
