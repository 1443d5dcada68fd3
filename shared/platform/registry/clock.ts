/** Wall clock used for heartbeats and leases. Injected so tests (and a second "process") can move time. */
export type Clock = () => Date;
export const systemClock: Clock = () => new Date();

export function addMs(at: Date, ms: number): Date {
  return new Date(at.getTime() + ms);
}
