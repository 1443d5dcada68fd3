// The UCX transport's own native addon, ctxbank_ucx.node: built beside the engine's addon when UCX
// is found (native/CMakeLists.txt, CTXBANK_UCX), and the only code linked to UCX. It is loaded on
// first use only (a UcxTransport's first read, a UcxShardExposure), so a process that never uses
// the UCX transport never loads libucp/libucs/libucm. Whether it is built is a file check
// (ucxAddonBuilt), which loads nothing.
import { existsSync } from "node:fs";
import { createRequire } from "node:module";
import path from "node:path";
import { nativeAddonPath } from "../../../shared/inference/engine/native.ts";

/** A shard's pages mapped for readers (native/src/ucx/addon_ucx.cc). */
export interface UcxExposed {
  id: bigint;
  /** The mapping's secret, published with it: the owner answers only asks that carry it. */
  token: bigint;
}

/** The UCX addon's functions (native/src/ucx/addon_ucx.cc); one UCX worker per process behind them. */
export interface UcxAddon {
  workerAddress(): Buffer;
  expose(path: string, length: number, epoch: number): UcxExposed;
  unexpose(id: bigint): void;
  /**
   * Reads [offset, offset + into.length) of the owner's mapping into `into`; settles only once UCX
   * is done with it. Rejects with an Error whose code is unreachable, aborted, bad_endpoint,
   * stale_epoch, out_of_range or io_error.
   */
  read(address: Uint8Array, mapping: bigint, token: bigint, epoch: number, offset: number, into: Uint8Array, readId: number): Promise<void>;
  cancel(readId: number): void;
}

/** Beside the engine's addon (CTXBANK_ADDON, when set, moves both). */
export const ucxAddonPath = path.join(path.dirname(nativeAddonPath), "ctxbank_ucx.node");

let loaded: UcxAddon | undefined;
let loadFailure: Error | undefined;

/**
 * Whether the UCX addon is built here (its file exists) and has not failed to load in this
 * process. Loads nothing.
 */
export function ucxAddonBuilt(): boolean {
  return loaded !== undefined || (loadFailure === undefined && existsSync(ucxAddonPath));
}

/**
 * The UCX addon, loaded on the first call. Throws an Error saying why when it is not built or
 * cannot be loaded (a failed load is remembered: ucxAddonBuilt() is false afterwards).
 */
export function ucxAddon(): UcxAddon {
  if (loaded) return loaded;
  if (loadFailure) throw loadFailure;
  if (!existsSync(ucxAddonPath)) {
    throw new Error(
      `the UCX transport is not built (${ucxAddonPath} is missing): install libucx-dev and run "npm run build:native" (CTXBANK_UCX=AUTO or ON)`,
    );
  }
  // Keep UCX's malloc/mmap hooks and its fatal-signal handlers out of Node's (they serve RDMA
  // registration caches and UCX's own crash reports; the transport registers its memory
  // explicitly). On one host, let the bytes of a read move by CMA: UCX 1.13 offers CMA to
  // endpoints with peer failure handling only when told it may (MEMORY_INVALIDATE), and the
  // reader pulls them (get_zcopy) rather than the owner pushing. UCX reads these when it loads,
  // so they are set first; a user's own UCX_* win.
  process.env.UCX_MEM_EVENTS ??= "no";
  process.env.UCX_ERROR_SIGNALS ??= "";
  process.env.UCX_CMA_MEMORY_INVALIDATE ??= "y";
  process.env.UCX_RNDV_SCHEME ??= "get_zcopy";
  try {
    loaded = createRequire(import.meta.url)(ucxAddonPath) as UcxAddon;
  } catch (err) {
    loadFailure = new Error(
      `cannot load the UCX transport addon ${ucxAddonPath}: ${(err as Error).message} (is UCX installed? Debian: libucx0)`,
      { cause: err },
    );
    throw loadFailure;
  }
  return loaded;
}
