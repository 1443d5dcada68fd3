// Incremental Server-Sent Events parser (the WHATWG event-stream format): feed it text as it
// arrives, get back every event completed by that text. Lines end in \n, \r\n or \r; a blank
// line dispatches; `data:` lines are joined with \n; `event:` names the event; `:` lines are
// comments; a leading space after the colon is dropped.

export interface SseEvent {
  event: string;
  data: string;
}

export class SseParser {
  private buf = "";
  private data: string[] = [];
  private event = "";
  /** A \r ended the last chunk: a \n at the start of the next one belongs to it. */
  private pendingCr = false;

  feed(text: string): SseEvent[] {
    if (this.pendingCr && text.startsWith("\n")) text = text.slice(1);
    this.pendingCr = false;
    this.buf += text;
    const out: SseEvent[] = [];
    let start = 0;
    for (let i = 0; i < this.buf.length; i++) {
      const c = this.buf.charCodeAt(i);
      if (c !== 10 && c !== 13) continue;
      this.line(this.buf.slice(start, i), out);
      if (c === 13) {
        if (i + 1 < this.buf.length) {
          if (this.buf.charCodeAt(i + 1) === 10) i++;
        } else {
          this.pendingCr = true;
        }
      }
      start = i + 1;
    }
    this.buf = this.buf.slice(start);
    return out;
  }

  /** Dispatches an event left without its final blank line when the stream ended. */
  end(): SseEvent[] {
    const out: SseEvent[] = [];
    if (this.buf !== "") this.line(this.buf, out);
    this.buf = "";
    this.line("", out);
    return out;
  }

  private line(line: string, out: SseEvent[]): void {
    if (line === "") {
      if (this.data.length > 0) out.push({ event: this.event || "message", data: this.data.join("\n") });
      this.data = [];
      this.event = "";
      return;
    }
    if (line.startsWith(":")) return;
    const colon = line.indexOf(":");
    const field = colon < 0 ? line : line.slice(0, colon);
    let value = colon < 0 ? "" : line.slice(colon + 1);
    if (value.startsWith(" ")) value = value.slice(1);
    if (field === "data") this.data.push(value);
    else if (field === "event") this.event = value;
  }
}
