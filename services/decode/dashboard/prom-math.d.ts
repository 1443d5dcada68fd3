// Types for prom-math.js.
import type { Family, Parsed } from "./prom-parse.js";
export type Labels = Record<string, string>;
export interface Bucket {
  le: number;
  count: number;
}
export function matches(labels: Labels, filter?: Labels): boolean;
export function family(parsed: Parsed, name: string): Family | undefined;
export function sum(parsed: Parsed, name: string, filter?: Labels): number | null;
export function labelValues(parsed: Parsed, name: string, label: string): string[];
export function increase(a: Parsed, b: Parsed, name: string, filter?: Labels): number | null;
export function bucketIncrease(a: Parsed, b: Parsed, name: string, filter?: Labels): Bucket[] | null;
export function histogramQuantile(q: number, buckets: Bucket[]): number;
