// A small GGUF writer for tests (spec: ggml-org/ggml docs/gguf.md, version 3): enough to build
// tiny Llama models, valid or deliberately broken, without the real 98 MB file.

/** ggml tensor type numbers. */
export const GgmlType = { F32: 0, F16: 1, Q4_0: 2, Q4_1: 3, Q8_0: 8, Q3_K: 11 } as const;

// Bytes per block and elements per block, for sizing tensor data.
const TYPE_SIZE: Record<number, [bytes: number, block: number]> = {
  0: [4, 1],
  1: [2, 1],
  2: [18, 32],
  3: [20, 32],
  8: [34, 32],
  11: [110, 256],
};

type Scalar = "u8" | "i8" | "u16" | "i16" | "u32" | "i32" | "f32" | "bool" | "u64" | "i64" | "f64" | "string";
export type GgufValue =
  | { type: Scalar; value: number | bigint | boolean | string }
  | { type: "array"; elem: Scalar; values: (number | bigint | boolean | string)[] };

const VALUE_TYPE: Record<Scalar | "array", number> = {
  u8: 0,
  i8: 1,
  u16: 2,
  i16: 3,
  u32: 4,
  i32: 5,
  f32: 6,
  bool: 7,
  string: 8,
  array: 9,
  u64: 10,
  i64: 11,
  f64: 12,
};

export const u32 = (value: number): GgufValue => ({ type: "u32", value });
export const f32 = (value: number): GgufValue => ({ type: "f32", value });
export const str = (value: string): GgufValue => ({ type: "string", value });

export interface GgufTensor {
  name: string;
  /** ne[0] first: the innermost, contiguous dimension. */
  dims: number[];
  type: number;
  /** Defaults to zero bytes of the natural size. */
  data?: Uint8Array;
}

export function tensorBytes(type: number, dims: number[]): number {
  const t = TYPE_SIZE[type];
  if (!t) throw new Error(`gguf-writer: unknown size for ggml type ${type}`);
  return (dims.reduce((a, b) => a * b, 1) / t[1]) * t[0];
}

class Out {
  private chunks: Buffer[] = [];
  length = 0;
  push(b: Buffer): void {
    this.chunks.push(b);
    this.length += b.length;
  }
  u32(v: number): void {
    const b = Buffer.alloc(4);
    b.writeUInt32LE(v);
    this.push(b);
  }
  u64(v: number | bigint): void {
    const b = Buffer.alloc(8);
    b.writeBigUInt64LE(BigInt(v));
    this.push(b);
  }
  str(s: string): void {
    const b = Buffer.from(s, "utf8");
    this.u64(b.length);
    this.push(b);
  }
  scalar(type: Scalar, v: number | bigint | boolean | string): void {
    const b = Buffer.alloc(8);
    switch (type) {
      case "u8":
        b.writeUInt8(Number(v));
        return this.push(b.subarray(0, 1));
      case "i8":
        b.writeInt8(Number(v));
        return this.push(b.subarray(0, 1));
      case "bool":
        b.writeUInt8(v ? 1 : 0);
        return this.push(b.subarray(0, 1));
      case "u16":
        b.writeUInt16LE(Number(v));
        return this.push(b.subarray(0, 2));
      case "i16":
        b.writeInt16LE(Number(v));
        return this.push(b.subarray(0, 2));
      case "u32":
        b.writeUInt32LE(Number(v));
        return this.push(b.subarray(0, 4));
      case "i32":
        b.writeInt32LE(Number(v));
        return this.push(b.subarray(0, 4));
      case "f32":
        b.writeFloatLE(Number(v));
        return this.push(b.subarray(0, 4));
      case "u64":
        b.writeBigUInt64LE(BigInt(v as number | bigint));
        return this.push(b);
      case "i64":
        b.writeBigInt64LE(BigInt(v as number | bigint));
        return this.push(b);
      case "f64":
        b.writeDoubleLE(Number(v));
        return this.push(b);
      case "string":
        return this.str(String(v));
    }
  }
  pad(alignment: number): void {
    const n = (alignment - (this.length % alignment)) % alignment;
    if (n) this.push(Buffer.alloc(n));
  }
  concat(): Buffer {
    return Buffer.concat(this.chunks);
  }
}

/** Encodes a GGUF v3 file: header, metadata, tensor infos, padding, tensor data. */
export function writeGguf(kv: Record<string, GgufValue>, tensors: GgufTensor[], alignment = 32): Buffer {
  const out = new Out();
  out.push(Buffer.from("GGUF", "latin1"));
  out.u32(3);
  out.u64(tensors.length);
  out.u64(Object.keys(kv).length);
  for (const [key, v] of Object.entries(kv)) {
    out.str(key);
    out.u32(VALUE_TYPE[v.type]);
    if (v.type === "array") {
      out.u32(VALUE_TYPE[v.elem]);
      out.u64(v.values.length);
      for (const e of v.values) out.scalar(v.elem, e);
    } else {
      out.scalar(v.type, v.value);
    }
  }
  const datas = tensors.map((t) => t.data ?? new Uint8Array(tensorBytes(t.type, t.dims)));
  let offset = 0;
  tensors.forEach((t, i) => {
    out.str(t.name);
    out.u32(t.dims.length);
    for (const d of t.dims) out.u64(d);
    out.u32(t.type);
    out.u64(offset);
    offset += Math.ceil(datas[i]!.length / alignment) * alignment;
  });
  out.pad(alignment);
  datas.forEach((d, i) => {
    out.push(Buffer.from(d.buffer, d.byteOffset, d.byteLength));
    if (i < datas.length - 1) out.pad(alignment);
  });
  return out.concat();
}

export interface TinyLlamaOptions {
  nEmbd?: number;
  nHead?: number;
  nHeadKv?: number;
  nFf?: number;
  nLayer?: number;
  nVocab?: number;
  nCtx?: number;
  /** Overrides per tensor name (e.g. an unsupported type for one weight). */
  override?: Record<string, Partial<GgufTensor>>;
  /** More metadata (e.g. a tokenizer vocabulary). */
  kv?: Record<string, GgufValue>;
}

/** A tiny Llama model with F32 weights from a fixed-seed generator; loadable by the engine. */
export function tinyLlama(o: TinyLlamaOptions = {}): Buffer {
  const E = o.nEmbd ?? 32,
    H = o.nHead ?? 2,
    HKV = o.nHeadKv ?? 1,
    F = o.nFf ?? 64;
  const L = o.nLayer ?? 1,
    V = o.nVocab ?? 16,
    C = o.nCtx ?? 64;
  const KV = (E / H) * HKV;
  let seed = 12345;
  const rand = () => ((seed = (seed * 1103515245 + 12345) >>> 0) / 2 ** 32) * 2 - 1; // [-1, 1)
  const f32s = (n: number, scale: number, offset = 0) => {
    const a = new Float32Array(n);
    for (let i = 0; i < n; i++) a[i] = offset + rand() * scale;
    return new Uint8Array(a.buffer);
  };
  const mat = (name: string, cols: number, rows: number): GgufTensor => ({
    name,
    dims: [cols, rows],
    type: GgmlType.F32,
    data: f32s(cols * rows, 1 / Math.sqrt(cols)),
  });
  const norm = (name: string): GgufTensor => ({ name, dims: [E], type: GgmlType.F32, data: f32s(E, 0.2, 1) });
  const tensors: GgufTensor[] = [mat("token_embd.weight", E, V), norm("output_norm.weight")];
  for (let l = 0; l < L; l++) {
    const p = `blk.${l}.`;
    tensors.push(
      norm(`${p}attn_norm.weight`),
      mat(`${p}attn_q.weight`, E, E),
      mat(`${p}attn_k.weight`, E, KV),
      mat(`${p}attn_v.weight`, E, KV),
      mat(`${p}attn_output.weight`, E, E),
      norm(`${p}ffn_norm.weight`),
      mat(`${p}ffn_gate.weight`, E, F),
      mat(`${p}ffn_up.weight`, E, F),
      mat(`${p}ffn_down.weight`, F, E),
    );
  }
  for (const t of tensors) {
    const ov = o.override?.[t.name];
    if (!ov) continue;
    Object.assign(t, ov);
    if (ov.type !== undefined && ov.data === undefined) delete t.data; // re-sized for the new type
  }
  return writeGguf(
    {
      "general.architecture": str("llama"),
      "general.name": str("tiny"),
      "llama.context_length": u32(C),
      "llama.embedding_length": u32(E),
      "llama.block_count": u32(L),
      "llama.feed_forward_length": u32(F),
      "llama.rope.dimension_count": u32(E / H),
      "llama.attention.head_count": u32(H),
      "llama.attention.head_count_kv": u32(HKV),
      "llama.attention.layer_norm_rms_epsilon": f32(1e-5),
      ...o.kv,
    },
    tensors,
  );
}
