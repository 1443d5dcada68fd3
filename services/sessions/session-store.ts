// Conversations that come back. When a turn of a named session ends, its sequence is parked here
// with the KV of every token it holds (the prompt and the answer), so the next turn of the same
// session prefills only what its history does not already hold: the longest common prefix of the
// stored tokens and the new prompt is kept, the rest is computed. Parked sessions live in the
// engine's memory under a byte budget, a per-key quota and a TTL; under pressure the least
// recently used one moves to the disk tier (session-disk.ts) when there is one, else is dropped.
//
// A session belongs to its key: (tenant, id) is the key of every lookup, so another key cannot see,
// reuse or delete it. A session is used by one turn at a time: resume() takes it out of the store,
// park() puts it back; a concurrent turn of the same session finds nothing and computes its prompt.
import { createHash } from "node:crypto";
import type { NativeSequence } from "../../shared/inference/engine/native.ts";
import { heldChunks, type KvShape } from "../handoff/index.ts";
import type { SessionDisk } from "./session-disk.ts";

export interface SessionLimits {
  /** KV bytes all parked sessions may hold in memory. */
  memoryBytes: number;
  /** KV bytes one key's parked sessions may hold (memory and disk alike). */
  perKeyBytes: number;
  /** A session unused for this long is dropped (ms). */
  ttlMs: number;
}

/** What a session holds, as GET /v1/sessions/{id} shows it. */
export interface SessionSummary {
  id: string;
  /** Tokens whose KV is stored: the last turn's prompt and answer. */
  tokens: number;
  /** Start of each conversation round among them, and the sha256 of each round's token ids (hex). */
  roundStarts: number[];
  roundHashes: string[];
  bytes: number;
  tier: "memory" | "disk";
  turns: number;
  createdAt: number;
  lastUsedAt: number;
  expiresAt: number;
}

/** A resumed session: its sequence holding `reused` tokens of the new prompt, ready for the rest. */
export interface Resumed {
  seq: NativeSequence;
  reused: number;
  turns: number;
}

interface Parked {
  tenant: string;
  id: string;
  /** In memory: the sequence, holding exactly `tokens`. Undefined on disk. */
  seq: NativeSequence | undefined;
  tokens: Int32Array;
  roundStarts: number[];
  roundHashes: string[];
  bytes: number;
  turns: number;
  createdAt: number;
  lastUsedAt: number;
}

/** The sha256 of each round's token ids: `tokens` cut at `roundStarts` (the first round starts at 0). */
export function roundHashes(tokens: Int32Array, roundStarts: readonly number[]): string[] {
  const starts = roundStarts.length > 0 && roundStarts[0] === 0 ? roundStarts : [0, ...roundStarts];
  return starts.map((start, i) => {
    const end = starts[i + 1] ?? tokens.length;
    const part = tokens.subarray(start, end);
    return createHash("sha256")
      .update(new Uint8Array(part.buffer, part.byteOffset, part.byteLength))
      .digest("hex");
  });
}

/** How many leading ids two token lists share. */
export function commonPrefix(a: ArrayLike<number>, b: ArrayLike<number>): number {
  const n = Math.min(a.length, b.length);
  let i = 0;
  while (i < n && a[i] === b[i]) i++;
  return i;
}

const keyOf = (tenant: string, id: string) => `${tenant}\u0000${id}`;

export class SessionStore {
  /** Parked sessions, least recently used first (a Map keeps insertion order; a touch re-inserts). */
  private readonly parked = new Map<string, Parked>();
  private memoryBytes = 0;
  private readonly byKey = new Map<string, number>(); // tenant -> bytes held (memory + disk)
  /** Sessions dropped for memory, quota or TTL since the start; moved to disk. */
  readonly counts = { dropped: 0, spilled: 0, expired: 0, resumed: 0, reusedTokens: 0 };

  readonly limits: SessionLimits;
  private readonly createSequence: (capacity: number) => NativeSequence;
  private readonly kvBytes: (nTokens: number) => number;
  private readonly shape: KvShape;
  private readonly disk: SessionDisk | undefined;
  private readonly now: () => number;

  constructor(o: {
    limits: SessionLimits;
    /** Makes an empty sequence of `capacity` tokens on this engine (a disk load's or a larger turn's). */
    createSequence: (capacity: number) => NativeSequence;
    /** The KV bytes a sequence of n tokens holds (Engine.kvBytes), and the cache's shape. */
    kvBytes: (nTokens: number) => number;
    shape: KvShape;
    disk?: SessionDisk | undefined;
    now?: () => number;
  }) {
    this.limits = o.limits;
    this.createSequence = o.createSequence;
    this.kvBytes = o.kvBytes;
    this.shape = o.shape;
    this.disk = o.disk;
    this.now = o.now ?? Date.now;
  }

  /** Bytes parked in memory, and in all (memory and disk). */
  get bytesInMemory(): number {
    return this.memoryBytes;
  }
  get size(): number {
    return this.parked.size;
  }

  /** Sessions held in memory and on disk. */
  tiers(): { memory: number; disk: number } {
    let memory = 0;
    for (const p of this.parked.values()) if (p.seq) memory++;
    return { memory, disk: this.parked.size - memory };
  }

  /** Live sessions (memory and disk, every key's) and their KV bytes: what a router weighs when it places a conversation. */
  held(): { count: number; bytes: number } {
    let count = 0;
    let bytes = 0;
    for (const p of this.parked.values()) {
      if (this.expired(p)) continue;
      count++;
      bytes += p.bytes;
    }
    return { count, bytes };
  }

  summary(tenant: string, id: string): SessionSummary | undefined {
    const p = this.live(tenant, id);
    return p && this.describe(p);
  }

  /** Every live session of `tenant`, most recently used first. */
  list(tenant: string): SessionSummary[] {
    return [...this.parked.values()]
      .filter((p) => p.tenant === tenant && !this.expired(p))
      .reverse()
      .map((p) => this.describe(p));
  }

  /**
   * Takes the session out of the store for a turn whose prompt is `prompt`: its sequence cut to
   * the longest prefix it shares with the prompt (at most all but the prompt's last token, whose
   * logits the turn needs), loaded from disk first if it was spilled. Undefined when the session
   * is unknown, expired, or shares nothing with the prompt (the caller computes the whole prompt;
   * the stored session is then dropped: its history was rewritten), or was spilled to a file that
   * no longer reads back intact (dropped too). The sequence has room for
   * `capacity` tokens (moved to a larger one when it had less).
   */
  async resume(tenant: string, id: string, prompt: ArrayLike<number>, capacity = prompt.length): Promise<Resumed | undefined> {
    const p = this.live(tenant, id);
    if (!p) return undefined;
    this.forget(p);
    const reused = Math.min(commonPrefix(p.tokens, prompt), prompt.length - 1);
    if (reused <= 0) {
      await this.discard(p);
      return undefined;
    }
    let seq = p.seq;
    if (!seq) {
      seq = this.createSequence(Math.max(p.tokens.length, capacity));
      try {
        await this.disk!.load(tenant, id, seq, p.tokens.length);
      } catch {
        // Unreadable or failing its checksums: the turn computes its prompt, as if never kept.
        seq.release();
        this.counts.dropped++;
        return undefined;
      } finally {
        await this.disk!.remove(tenant, id).catch(() => {}); // the turn has it now (or it was unreadable)
      }
    }
    try {
      seq.truncate(reused);
    } catch (e) {
      // Rolled back past what a sliding-window layer's ring still holds: the turn computes its prompt.
      if ((e as { code?: unknown }).code !== "window_not_held") throw e;
      seq.release();
      this.counts.dropped++;
      return undefined;
    }
    if (seq.capacity < capacity) seq = this.grow(seq, reused, capacity);
    this.counts.resumed++;
    this.counts.reusedTokens += reused;
    return { seq, reused, turns: p.turns };
  }

  /**
   * Parks a finished turn's sequence (the store owns it from here): `tokens` are the ids its KV
   * holds, `roundStarts` where the conversation's rounds begin among them. Makes room first (LRU
   * sessions to disk, or dropped); a session larger than the per-key quota or the memory budget, or
   * one whose rows a reclaiming policy moved (seq.rowsMoved), is not kept.
   */
  async park(
    tenant: string,
    id: string,
    seq: NativeSequence,
    tokens: ArrayLike<number>,
    roundStarts: readonly number[],
    turns: number,
  ): Promise<void> {
    const held = Int32Array.from(tokens);
    if (held.length !== seq.nPast) throw new Error(`park: the sequence holds ${seq.nPast} tokens, ${held.length} were named`);
    await this.remove(tenant, id); // an older copy of the same session (a concurrent turn's)
    const bytes = this.kvBytes(held.length);
    // A reclaiming policy reused evicted rows: the next turn's prompt cannot extend this cache.
    if (seq.rowsMoved || bytes > this.limits.perKeyBytes || bytes > this.limits.memoryBytes) {
      seq.release();
      this.counts.dropped++;
      return;
    }
    await this.makeRoom(tenant, bytes);
    const t = this.now();
    const starts = roundStarts.length > 0 ? [...roundStarts] : [0];
    const p: Parked = {
      tenant,
      id,
      seq,
      tokens: held,
      roundStarts: starts,
      roundHashes: roundHashes(held, starts),
      bytes,
      turns,
      createdAt: t,
      lastUsedAt: t,
    };
    this.parked.set(keyOf(tenant, id), p);
    this.memoryBytes += bytes;
    this.byKey.set(tenant, (this.byKey.get(tenant) ?? 0) + bytes);
  }

  /** Ends a session (DELETE, or its history rewritten); false when there was none. */
  async remove(tenant: string, id: string): Promise<boolean> {
    const p = this.parked.get(keyOf(tenant, id));
    if (!p) return false;
    this.forget(p);
    await this.discard(p);
    return true;
  }

  /** Drops the sessions past their TTL; returns how many. */
  async sweep(): Promise<number> {
    let n = 0;
    for (const p of [...this.parked.values()]) {
      if (!this.expired(p)) continue;
      this.forget(p);
      await this.discard(p);
      this.counts.expired++;
      n++;
    }
    return n;
  }

  /** Releases every parked sequence (shutdown); disk files stay for the next start. */
  close(): void {
    for (const p of this.parked.values()) p.seq?.release();
    this.parked.clear();
    this.memoryBytes = 0;
    this.byKey.clear();
  }

  /**
   * Adopts the sessions a disk tier holds (a restart): they come back as spilled sessions, counted
   * against their keys' quotas; those past their TTL are removed.
   */
  async adoptDisk(): Promise<number> {
    if (!this.disk) return 0;
    let n = 0;
    for (const s of await this.disk.list()) {
      if (s.lastUsedAt + this.limits.ttlMs <= this.now()) {
        await this.disk.remove(s.tenant, s.id).catch(() => {});
        continue;
      }
      const p: Parked = { ...s, seq: undefined, tokens: s.tokens, bytes: this.kvBytes(s.tokens.length) };
      this.parked.set(keyOf(s.tenant, s.id), p);
      this.byKey.set(s.tenant, (this.byKey.get(s.tenant) ?? 0) + p.bytes);
      n++;
    }
    return n;
  }

  /** A sequence of `capacity` holding the first `tokens` tokens of `seq` (copied, a block at a time), which is released. */
  private grow(seq: NativeSequence, tokens: number, capacity: number): NativeSequence {
    const bigger = this.createSequence(capacity);
    const rowPair = 2 * this.shape.hkv * this.shape.headDim * 2;
    const chunks = heldChunks(this.shape, tokens, 256); // the sliding layers' last window only
    const buf = new Uint8Array(Math.max(0, ...chunks.map((c) => c.tokenCount * c.layerIds.length * rowPair)));
    try {
      for (const c of chunks) {
        const rows = buf.subarray(0, c.tokenCount * c.layerIds.length * rowPair);
        seq.exportRows(rows, c.layerIds, c.tokenStart, c.tokenCount);
        bigger.importRows(rows, c.layerIds, c.tokenStart, c.tokenCount);
      }
      bigger.setLength(tokens);
    } catch (e) {
      bigger.release();
      throw e;
    } finally {
      seq.release();
    }
    return bigger;
  }

  private live(tenant: string, id: string): Parked | undefined {
    const p = this.parked.get(keyOf(tenant, id));
    return p && !this.expired(p) ? p : undefined;
  }

  private expired(p: Parked): boolean {
    return p.lastUsedAt + this.limits.ttlMs <= this.now();
  }

  private describe(p: Parked): SessionSummary {
    return {
      id: p.id,
      tokens: p.tokens.length,
      roundStarts: p.roundStarts,
      roundHashes: p.roundHashes,
      bytes: p.bytes,
      tier: p.seq ? "memory" : "disk",
      turns: p.turns,
      createdAt: p.createdAt,
      lastUsedAt: p.lastUsedAt,
      expiresAt: p.lastUsedAt + this.limits.ttlMs,
    };
  }

  /** Takes `p` off the books (its sequence or file is the caller's to keep or discard). */
  private forget(p: Parked): void {
    this.parked.delete(keyOf(p.tenant, p.id));
    if (p.seq) this.memoryBytes -= p.bytes;
    const left = (this.byKey.get(p.tenant) ?? 0) - p.bytes;
    if (left > 0) this.byKey.set(p.tenant, left);
    else this.byKey.delete(p.tenant);
  }

  private async discard(p: Parked): Promise<void> {
    p.seq?.release();
    if (!p.seq) await this.disk?.remove(p.tenant, p.id).catch(() => {});
  }

  /**
   * Room for `bytes` more of `tenant`'s: its own least recently used sessions go while it is over
   * its quota (dropped: a key's quota covers disk too), then anyone's in-memory ones while memory
   * is over budget (to disk when there is a disk tier, else dropped).
   */
  private async makeRoom(tenant: string, bytes: number): Promise<void> {
    for (const p of [...this.parked.values()]) {
      if ((this.byKey.get(tenant) ?? 0) + bytes <= this.limits.perKeyBytes) break;
      if (p.tenant !== tenant) continue;
      this.forget(p);
      await this.discard(p);
      this.counts.dropped++;
    }
    for (const p of [...this.parked.values()]) {
      if (this.memoryBytes + bytes <= this.limits.memoryBytes) break;
      if (!p.seq) continue;
      if (this.disk && (await this.spill(p))) continue;
      this.forget(p);
      await this.discard(p);
      this.counts.dropped++;
    }
  }

  /** Moves `p` to disk, keeping it in the store; false when the disk tier could not take it. */
  private async spill(p: Parked): Promise<boolean> {
    const seq = p.seq!;
    const ok = await this.disk!.save(
      {
        tenant: p.tenant,
        id: p.id,
        tokens: p.tokens,
        roundStarts: p.roundStarts,
        roundHashes: p.roundHashes,
        turns: p.turns,
        createdAt: p.createdAt,
        lastUsedAt: p.lastUsedAt,
      },
      seq,
    ).then(
      () => true,
      () => false,
    );
    if (!ok) return false;
    seq.release();
    p.seq = undefined;
    this.memoryBytes -= p.bytes;
    this.counts.spilled++;
    return true;
  }
}
