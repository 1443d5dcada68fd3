// HTTP chunk reads over plain keep-alive sockets whose reads land straight in the caller's buffer
// (net.Socket's `onread`): the kernel copies the body into the KV staging buffer and nothing is
// allocated per packet. Against the undici transport (services/handoff/transport/http.ts) on the
// same server it takes a fraction of the reader's CPU per GB (bench/handoff/README.md). It speaks exactly what the chunk route answers (HTTP/1.1, content-length
// bodies) and maps every failure to the same TransportError codes as the undici transport,
// which stays the fallback for https owners.
import net from "node:net";
import { TransportError, chunkLabel, ownerErrorMessage, type TransportErrorCode } from "./errors.ts";
import { checkReadArgs, withDeadline } from "./read-checks.ts";
import { chunkRequestPath, type ChunkLocation, type KvTransport, type ReadChunkOptions } from "./types.ts";

const STATUS_CODES: Record<number, TransportErrorCode> = {
  400: "invalid_request",
  401: "unauthorized",
  403: "unauthorized",
  404: "not_found",
  409: "stale_epoch",
  410: "not_found",
  416: "out_of_range",
};
const MAX_HEAD = 16 << 10;
/** A chunk route's response head is ~150 bytes. */
const HEAD_READ = 512;
const MAX_ERROR_BODY = 4096;

interface Pending {
  loc: ChunkLocation;
  target: Uint8Array;
  got: number;
  /** Response bytes seen (0 = the server closed an idle connection: safe to retry). */
  seen: number;
  resolve(n: number): void;
  reject(e: unknown): void;
}

class Connection {
  readonly socket: net.Socket;
  private head: Buffer[] = [];
  private headBytes = 0;
  private state: "head" | "body" | "error-body" = "head";
  private status = 0;
  private bodyLength = 0;
  private errorBody: Buffer[] = [];
  private errorGot = 0;
  private closeAfter = false;
  private pending: Pending | undefined;
  private readonly scratch = Buffer.allocUnsafe(64 << 10);
  ready: Promise<void>;
  closed = false;

  constructor(host: string, port: number) {
    this.socket = net.connect({
      host,
      port,
      noDelay: true,
      onread: { buffer: () => this.nextBuffer(), callback: (n: number, buf: Uint8Array) => this.onRead(n, buf) },
    } as net.NetConnectOpts);
    this.ready = new Promise((resolve, reject) => {
      this.socket.once("connect", () => resolve());
      this.socket.once("error", reject);
    });
    // Marked handled here: whoever awaits `ready` gets the error, and fail() below ends the connection.
    this.ready.catch(() => undefined);
    this.socket.on("error", (err) => this.fail(err));
    this.socket.on("close", () => {
      this.closed = true;
      this.fail(new Error("the owner closed the connection"));
    });
  }

  /**
   * Where the next read goes: the rest of the body, straight into the caller's buffer. The head is
   * read in small pieces, so the body bytes that arrive with it (and are copied) stay under HEAD_READ.
   */
  private nextBuffer(): Uint8Array {
    const p = this.pending;
    if (this.state === "body" && p && p.got < this.bodyLength) return p.target.subarray(p.got, this.bodyLength);
    return this.state === "head" ? this.scratch.subarray(0, HEAD_READ) : this.scratch;
  }

  request(loc: ChunkLocation, target: Uint8Array, path: string, host: string): Promise<number> {
    return new Promise((resolve, reject) => {
      this.pending = { loc, target, got: 0, seen: 0, resolve, reject };
      this.state = "head";
      this.head = [];
      this.headBytes = 0;
      // checkReadArgs has held the capability to base64url.base64url: nothing can break the header.
      const auth = loc.capability === undefined ? "" : `authorization: Bearer ${loc.capability}\r\n`;
      this.socket.write(`GET ${path} HTTP/1.1\r\nhost: ${host}\r\naccept: application/octet-stream\r\n${auth}\r\n`);
    });
  }

  /** Idle, reusable connection. */
  get reusable(): boolean {
    return !this.closed && !this.closeAfter && this.pending === undefined;
  }

  destroy(): void {
    this.closed = true;
    this.pending = undefined;
    this.socket.destroy();
  }

  /** Stops the request in flight (deadline or caller's abort): nothing is written into its buffer afterwards. */
  abort(reason: unknown): void {
    const p = this.pending;
    this.destroy();
    p?.reject(reason);
  }

  private onRead(n: number, buf: Uint8Array): boolean {
    const p = this.pending;
    if (!p) {
      this.destroy(); // bytes nobody asked for: the stream is out of step
      return false;
    }
    p.seen += n;
    if (this.state === "body") {
      p.got += n;
      if (p.got === this.bodyLength) this.finish(p.got);
      return true;
    }
    if (this.state === "error-body") {
      this.takeErrorBody(Buffer.from(buf.subarray(0, n)));
      return true;
    }
    this.head.push(Buffer.from(buf.subarray(0, n)));
    this.headBytes += n;
    const all = this.head.length === 1 ? this.head[0]! : Buffer.concat(this.head);
    const end = all.indexOf("\r\n\r\n");
    if (end < 0) {
      if (this.headBytes > MAX_HEAD)
        this.reject(new TransportError("bad_response", `${chunkLabel(p.loc)}: response head exceeds ${MAX_HEAD} bytes`));
      return true;
    }
    const lines = all.subarray(0, end).toString("latin1").split("\r\n");
    const status = /^HTTP\/1\.[01] (\d{3})/.exec(lines[0] ?? "");
    const headers = new Map<string, string>();
    for (const line of lines.slice(1)) {
      const i = line.indexOf(":");
      if (i > 0) headers.set(line.slice(0, i).trim().toLowerCase(), line.slice(i + 1).trim());
    }
    const length = Number(headers.get("content-length"));
    if (!status || !Number.isSafeInteger(length) || headers.has("transfer-encoding")) {
      this.reject(
        new TransportError(
          "bad_response",
          `${chunkLabel(p.loc)}: the owner's response is not a content-length HTTP/1.1 response`,
          status ? Number(status[1]) : undefined,
        ),
      );
      return true;
    }
    this.status = Number(status[1]);
    this.bodyLength = length;
    this.closeAfter = /close/i.test(headers.get("connection") ?? "");
    const rest = all.subarray(end + 4);
    if (this.status !== 200) {
      this.state = "error-body";
      this.errorBody = [];
      this.errorGot = 0;
      this.takeErrorBody(rest);
      return true;
    }
    if (length !== p.loc.length) {
      this.reject(new TransportError("bad_response", `${chunkLabel(p.loc)}: the owner announced ${length} bytes`, 200));
      return true;
    }
    if (rest.length > length) {
      this.reject(new TransportError("bad_response", `${chunkLabel(p.loc)}: the owner sent more than ${length} bytes`, 200));
      return true;
    }
    p.target.set(rest, 0);
    p.got = rest.length;
    this.state = "body";
    if (p.got === length) this.finish(p.got);
    return true;
  }

  private takeErrorBody(piece: Buffer): void {
    const p = this.pending!;
    this.errorBody.push(piece);
    this.errorGot += piece.length;
    if (this.errorGot < this.bodyLength) return;
    const text = Buffer.concat(this.errorBody).subarray(0, Math.min(this.bodyLength, MAX_ERROR_BODY)).toString("utf8");
    const detail = ownerErrorMessage(text);
    const err = new TransportError(
      STATUS_CODES[this.status] ?? "bad_response",
      `${chunkLabel(p.loc)}: owner answered ${this.status}: ${detail}`,
      this.status,
    );
    if (this.errorGot > this.bodyLength) this.closeAfter = true;
    this.state = "head";
    this.pending = undefined;
    p.reject(err);
  }

  private finish(n: number): void {
    const p = this.pending!;
    this.pending = undefined;
    this.state = "head";
    p.resolve(n);
  }

  private reject(err: TransportError): void {
    const p = this.pending;
    this.destroy();
    p?.reject(err);
  }

  private fail(err: unknown): void {
    const p = this.pending;
    if (!p) return;
    this.pending = undefined;
    this.closed = true;
    this.socket.destroy();
    const label = chunkLabel(p.loc);
    const code = (err as NodeJS.ErrnoException).code;
    if (p.seen === 0) {
      const e = new TransportError(
        "unreachable",
        `${label}: cannot reach ${p.loc.ownerBaseUrl} (${code ?? (err as Error).message})`,
        undefined,
        { cause: err },
      );
      (e as TransportError & { retryable?: boolean }).retryable = code === undefined || code === "ECONNRESET" || code === "EPIPE";
      p.reject(e);
    } else {
      p.reject(
        new TransportError("short_read", `${label}: the body broke off after ${p.got} of ${p.loc.length} bytes`, 200, { cause: err }),
      );
    }
  }
}

export interface SocketHttpTransportOptions {
  /** Idle keep-alive connections kept per owner (default 8). */
  maxIdle?: number;
}

export class SocketHttpTransport implements KvTransport {
  readonly name = "http";
  private readonly idle = new Map<string, Connection[]>();
  private readonly live = new Set<Connection>();

  constructor(private readonly options: SocketHttpTransportOptions = {}) {}

  async readChunk(loc: ChunkLocation, into: Uint8Array, opts: ReadChunkOptions): Promise<number> {
    checkReadArgs(loc, into, opts);
    let url: URL;
    try {
      url = new URL(loc.ownerBaseUrl);
    } catch {
      throw new TransportError("invalid_request", `${chunkLabel(loc)}: bad owner URL ${JSON.stringify(loc.ownerBaseUrl)}`);
    }
    if (url.protocol !== "http:")
      throw new TransportError("invalid_request", `${chunkLabel(loc)}: the socket transport speaks http only, got ${url.protocol}`);
    const host = url.hostname.replace(/^\[|\]$/g, "");
    const port = Number(url.port || 80);
    const path = url.pathname.replace(/\/+$/, "") + chunkRequestPath(loc);
    const target = into.subarray(0, loc.length);
    return withDeadline(loc, opts, async (signal) => {
      // A kept-alive connection the owner has closed meanwhile fails before any byte: retry once on a fresh one.
      for (let attempt = 0; ; attempt++) {
        const conn = await this.acquire(url.host, host, port, loc);
        const onAbort = () => conn.abort(signal.reason);
        signal.addEventListener("abort", onAbort, { once: true });
        try {
          const n = await conn.request(loc, target, path, url.host);
          this.release(url.host, conn);
          return n;
        } catch (err) {
          conn.destroy();
          this.live.delete(conn);
          if (signal.aborted) throw signal.reason;
          if (attempt === 0 && (err as { retryable?: boolean }).retryable) continue;
          throw err;
        } finally {
          signal.removeEventListener("abort", onAbort);
        }
      }
    });
  }

  private async acquire(key: string, host: string, port: number, loc: ChunkLocation): Promise<Connection> {
    const pool = this.idle.get(key);
    while (pool && pool.length > 0) {
      const conn = pool.pop()!;
      if (conn.reusable) {
        conn.socket.ref();
        return conn;
      }
      this.live.delete(conn);
    }
    const conn = new Connection(host, port);
    this.live.add(conn);
    try {
      await conn.ready;
    } catch (err) {
      this.live.delete(conn);
      conn.destroy();
      const code = (err as NodeJS.ErrnoException).code;
      throw new TransportError(
        "unreachable",
        `${chunkLabel(loc)}: cannot reach ${loc.ownerBaseUrl} (${code ?? (err as Error).message})`,
        undefined,
        { cause: err },
      );
    }
    return conn;
  }

  private release(key: string, conn: Connection): void {
    let pool = this.idle.get(key);
    if (!pool) this.idle.set(key, (pool = []));
    if (!conn.reusable || pool.length >= (this.options.maxIdle ?? 8)) {
      conn.destroy();
      this.live.delete(conn);
      return;
    }
    conn.socket.unref(); // an idle keep-alive connection does not keep the process alive
    pool.push(conn);
  }

  async close(): Promise<void> {
    for (const conn of this.live) conn.destroy();
    this.live.clear();
    this.idle.clear();
  }
}
