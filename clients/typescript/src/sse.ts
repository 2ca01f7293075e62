/** A Server-Sent Events parser (the WHATWG event-stream format) over a byte stream. */

export interface SseMessage {
  /** `event:` (default "message"). */
  event: string;
  /** `data:` lines joined with "\n". */
  data: string;
  /** `id:` of this message, if it had one. */
  id?: string;
}

/** The messages of `body`, in order; comments and keep-alives are skipped. */
export async function* parseSse(body: AsyncIterable<Uint8Array>): AsyncGenerator<SseMessage> {
  const decoder = new TextDecoder("utf-8");
  let buffer = "";
  let event = "";
  let data: string[] = [];
  let id: string | undefined;
  let sawData = false;
  const lineOf = function* (final: boolean): Generator<string> {
    for (;;) {
      const cr = buffer.indexOf("\r");
      const lf = buffer.indexOf("\n");
      let end = -1;
      let skip = 1;
      if (cr >= 0 && (lf < 0 || cr < lf)) {
        // A CR at the very end may be half of CRLF: wait for more unless the stream ended.
        if (cr === buffer.length - 1 && !final) return;
        end = cr;
        skip = buffer[cr + 1] === "\n" ? 2 : 1;
      } else if (lf >= 0) {
        end = lf;
      } else {
        return;
      }
      const line = buffer.slice(0, end);
      buffer = buffer.slice(end + skip);
      yield line;
    }
  };
  const take = (line: string): SseMessage | undefined => {
    if (line === "") {
      const out = sawData ? { event: event || "message", data: data.join("\n"), ...(id !== undefined ? { id } : {}) } : undefined;
      event = "";
      data = [];
      id = undefined;
      sawData = false;
      return out;
    }
    if (line.startsWith(":")) return undefined;
    const colon = line.indexOf(":");
    const field = colon < 0 ? line : line.slice(0, colon);
    let value = colon < 0 ? "" : line.slice(colon + 1);
    if (value.startsWith(" ")) value = value.slice(1);
    if (field === "event") event = value;
    else if (field === "data") {
      data.push(value);
      sawData = true;
    } else if (field === "id" && !value.includes("\0")) id = value;
    return undefined;
  };
  for await (const chunk of body) {
    buffer += decoder.decode(chunk, { stream: true });
    for (const line of lineOf(false)) {
      const m = take(line);
      if (m) yield m;
    }
  }
  buffer += decoder.decode();
  for (const line of lineOf(true)) {
    const m = take(line);
    if (m) yield m;
  }
  // A message not closed by a blank line at the end of the stream is dropped (as the spec says).
}
