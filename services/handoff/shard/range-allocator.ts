// Byte-range allocator for a shard: best-fit over an offset-sorted free list, neighbours
// coalesced on free, every range aligned. Best fit keeps large holes whole for large chunks,
// since chunk sizes vary with block length and layer-group size.

export interface ByteRange {
  offset: number;
  length: number;
}

export class RangeAllocator {
  private readonly holes: ByteRange[]; // sorted by offset, never adjacent (always coalesced)
  private readonly live = new Map<number, number>(); // offset -> allocated length
  private used = 0;

  constructor(
    readonly size: number,
    readonly alignment = 4096,
  ) {
    if (!Number.isInteger(alignment) || alignment < 1 || (alignment & (alignment - 1)) !== 0) {
      throw new RangeError(`alignment must be a power of two, got ${alignment}`);
    }
    if (!Number.isSafeInteger(size) || size < alignment || size % alignment !== 0) {
      throw new RangeError(`size must be a positive multiple of ${alignment}, got ${size}`);
    }
    this.holes = [{ offset: 0, length: size }];
  }

  /** Allocates `length` bytes (rounded up to the alignment); null when no free range is big enough. */
  alloc(length: number): number | null {
    if (!Number.isSafeInteger(length) || length < 1) throw new RangeError(`cannot allocate ${length} bytes`);
    const need = Math.ceil(length / this.alignment) * this.alignment;
    let best = -1;
    for (let i = 0; i < this.holes.length; i++) {
      const len = this.holes[i]!.length;
      if (len >= need && (best < 0 || len < this.holes[best]!.length)) best = i;
    }
    if (best < 0) return null;
    const range = this.holes[best]!;
    const offset = range.offset;
    if (range.length === need) this.holes.splice(best, 1);
    else this.holes[best] = { offset: offset + need, length: range.length - need };
    this.live.set(offset, need);
    this.used += need;
    return offset;
  }

  /** Frees the allocation that starts at `offset`; returns its length. Throws on a double or bad free. */
  free(offset: number): number {
    const length = this.live.get(offset);
    if (length === undefined) throw new RangeError(`no allocation starts at offset ${offset} (double free?)`);
    this.live.delete(offset);
    this.used -= length;
    const i = this.insertionPoint(offset);
    const prev = this.holes[i - 1];
    const next = this.holes[i];
    const joinsPrev = prev !== undefined && prev.offset + prev.length === offset;
    const joinsNext = next !== undefined && offset + length === next.offset;
    if (joinsPrev && joinsNext) {
      prev.length += length + next.length;
      this.holes.splice(i, 1);
    } else if (joinsPrev) {
      prev.length += length;
    } else if (joinsNext) {
      this.holes[i] = { offset, length: length + next.length };
    } else {
      this.holes.splice(i, 0, { offset, length });
    }
    return length;
  }

  /** Length of the allocation starting at `offset`, if there is one. */
  lengthAt(offset: number): number | undefined {
    return this.live.get(offset);
  }

  /** Whether [offset, offset + length) lies inside one live allocation. */
  contains(offset: number, length: number): boolean {
    // Allocations are few (one per chunk); a linear scan keeps this simple and exact.
    for (const [start, len] of this.live) {
      if (offset >= start && offset + length <= start + len) return true;
    }
    return false;
  }

  get bytesUsed(): number {
    return this.used;
  }
  get bytesFree(): number {
    return this.size - this.used;
  }
  get largestFree(): number {
    return this.holes.reduce((max, r) => Math.max(max, r.length), 0);
  }
  /** A copy of the free list, by offset. */
  get freeRanges(): ByteRange[] {
    return this.holes.map((r) => ({ ...r }));
  }

  private insertionPoint(offset: number): number {
    let lo = 0;
    let hi = this.holes.length;
    while (lo < hi) {
      const mid = (lo + hi) >> 1;
      if (this.holes[mid]!.offset < offset) lo = mid + 1;
      else hi = mid;
    }
    return lo;
  }
}
