// Types for stats.js.
import type { Parsed } from "./prom-parse.js";
export interface Scrape {
  t: number;
  parsed: Parsed;
}
export interface Between {
  seconds: number;
  requests: number | null;
  requestRate: number | null;
  failureRate: number | null;
  goodput: number | null;
  attainment: Record<string, number | null>;
  ttft: (number | null)[];
  tpot: (number | null)[];
  promptTokenRate: number | null;
  generationTokenRate: number | null;
  kvTransferRate: Record<string, number | null>;
}
export interface Now {
  attainmentSinceStart: number | null;
  requestsSinceStart: number | null;
  queues: Record<string, { running: number | null; waiting: number | null }>;
  kv: Record<string, { inUse: number | null; capacity: number | null }>;
  targets: Record<string, number | null>;
}
export const WINDOW_MS: number;
export const RATE_MS: number;
export const QUANTILE_MS: number;
export const QUANTILES: number[];
export const M: Record<string, string>;
export const SLOS: string[];
export const TIERS: string[];
export function tiles(scrapes: Scrape[]): { window: Between | null; now: Now } | null;
export function chartData(scrapes: Scrape[]): { t: number[]; series: Map<string, (number | null)[]> };
