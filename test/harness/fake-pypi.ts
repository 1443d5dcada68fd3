// A local PEP 503 simple index serving fake wheels, for the model resolver's tests: no network.
// `/simple/<project>/` lists an unrelated sdist and the project's wheel (with a `#sha256=`
// fragment), `/files/<wheel>` serves it; `overrides` replace the answer of one path.
import { createHash } from "node:crypto";
import { createServer, type IncomingMessage, type Server, type ServerResponse } from "node:http";
import type { AddressInfo } from "node:net";
import { crc32, deflateRawSync } from "node:zlib";

export const sha256 = (b: Buffer): string => createHash("sha256").update(b).digest("hex");

export interface ZipEntry {
  name: string;
  data: Buffer;
  deflate?: boolean;
}

/** A minimal zip (local headers + central directory + end record), enough for yauzl. */
export function makeZip(entries: ZipEntry[]): Buffer {
  const locals: Buffer[] = [];
  const centrals: Buffer[] = [];
  let offset = 0;
  for (const e of entries) {
    const name = Buffer.from(e.name, "utf8");
    const body = e.deflate ? deflateRawSync(e.data) : e.data;
    const crc = crc32(e.data);
    const method = e.deflate ? 8 : 0;
    const lh = Buffer.alloc(30);
    lh.writeUInt32LE(0x04034b50, 0);
    lh.writeUInt16LE(20, 4); // version needed
    lh.writeUInt16LE(0x0800, 6); // UTF-8 names
    lh.writeUInt16LE(method, 8);
    lh.writeUInt16LE(0, 10); // time
    lh.writeUInt16LE(0x21, 12); // date 1980-01-01
    lh.writeUInt32LE(crc, 14);
    lh.writeUInt32LE(body.length, 18);
    lh.writeUInt32LE(e.data.length, 22);
    lh.writeUInt16LE(name.length, 26);
    lh.writeUInt16LE(0, 28);
    locals.push(lh, name, body);
    const ch = Buffer.alloc(46);
    ch.writeUInt32LE(0x02014b50, 0);
    ch.writeUInt16LE(20, 4); // made by
    ch.writeUInt16LE(20, 6); // needed
    ch.writeUInt16LE(0x0800, 8);
    ch.writeUInt16LE(method, 10);
    ch.writeUInt16LE(0, 12);
    ch.writeUInt16LE(0x21, 14);
    ch.writeUInt32LE(crc, 16);
    ch.writeUInt32LE(body.length, 20);
    ch.writeUInt32LE(e.data.length, 24);
    ch.writeUInt16LE(name.length, 28);
    ch.writeUInt16LE(0, 30); // extra
    ch.writeUInt16LE(0, 32); // comment
    ch.writeUInt16LE(0, 34); // disk
    ch.writeUInt16LE(0, 36); // internal attrs
    ch.writeUInt32LE(0, 38); // external attrs
    ch.writeUInt32LE(offset, 42);
    centrals.push(ch, name);
    offset += lh.length + name.length + body.length;
  }
  const cd = Buffer.concat(centrals);
  const eocd = Buffer.alloc(22);
  eocd.writeUInt32LE(0x06054b50, 0);
  eocd.writeUInt16LE(0, 4);
  eocd.writeUInt16LE(0, 6);
  eocd.writeUInt16LE(entries.length, 8);
  eocd.writeUInt16LE(entries.length, 10);
  eocd.writeUInt32LE(cd.length, 12);
  eocd.writeUInt32LE(offset, 16);
  eocd.writeUInt16LE(0, 20);
  return Buffer.concat([...locals, cd, eocd]);
}

export type Handler = (req: IncomingMessage, res: ServerResponse) => void;

export interface FakePackage {
  wheelFile: string;
  wheel: Buffer;
  /** sha256 written into the index fragment (default: the wheel's real one; null: no fragment). */
  fragmentSha?: string | null;
  /** Whether the project page lists the wheel (default true). */
  listed?: boolean;
}

export class FakeIndex {
  /** By normalised project name. */
  readonly packages = new Map<string, FakePackage>();
  /** Answers for single paths, in place of the index's. */
  overrides: Record<string, Handler> = {};
  /** Every path asked for, in order. */
  requests: string[] = [];

  private constructor(
    private readonly server: Server,
    /** http://127.0.0.1:<port> */
    readonly base: string,
  ) {}

  static async start(): Promise<FakeIndex> {
    let index: FakeIndex | undefined;
    const server = createServer((req, res) => index!.handle(req, res));
    await new Promise<void>((r) => server.listen(0, "127.0.0.1", r));
    index = new FakeIndex(server, `http://127.0.0.1:${(server.address() as AddressInfo).port}`);
    return index;
  }

  /** The simple index's URL (without the trailing slash, which the resolver adds). */
  get url(): string {
    return `${this.base}/simple`;
  }

  /** No packages, overrides or requests. */
  reset(): void {
    this.packages.clear();
    this.overrides = {};
    this.requests = [];
  }

  async close(): Promise<void> {
    this.server.closeAllConnections();
    await new Promise<void>((r) => this.server.close(() => r()));
  }

  private handle(req: IncomingMessage, res: ServerResponse): void {
    const url = req.url ?? "/";
    this.requests.push(url);
    const override = this.overrides[url];
    if (override) return override(req, res);
    const project = /^\/simple\/([^/]+)\/$/.exec(url)?.[1];
    const page = project !== undefined ? this.packages.get(project) : undefined;
    if (page !== undefined) {
      res.writeHead(200, { "content-type": "text/html" });
      res.end(projectPage(project!, page));
      return;
    }
    const file = [...this.packages.values()].find((p) => url === `/files/${p.wheelFile}`);
    if (file !== undefined) {
      res.writeHead(200, { "content-type": "application/octet-stream", "content-length": file.wheel.length });
      res.end(file.wheel);
      return;
    }
    res.writeHead(404, { "content-type": "text/plain" });
    res.end("not found");
  }
}

function projectPage(project: string, p: FakePackage): string {
  const sha = p.fragmentSha === undefined ? sha256(p.wheel) : p.fragmentSha;
  const fragment = sha === null ? "" : `#sha256=${sha}`;
  const sdist = `${project.replace(/-/g, "_")}-0.1.tar.gz`;
  const rows = [
    // A relative URL, resolved against the page URL, and an HTML entity in an unrelated link.
    `<a href="../../files/${sdist}#sha256=${"0".repeat(64)}" data-requires-python="&gt;=3.9">${sdist}</a><br/>`,
  ];
  if (p.listed !== false) rows.push(`<a href="../../files/${p.wheelFile}${fragment}">${p.wheelFile}</a><br/>`);
  return `<!DOCTYPE html><html><body><h1>Links for ${project}</h1>\n${rows.join("\n")}\n</body></html>`;
}
