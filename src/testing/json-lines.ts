/**
 * Reads the launcher's `--json` events off a stream (its stderr), for tests and benchmarks:
 * each complete line that parses as a JSON object goes to `onEvent`, every other line (a
 * rank's own output, a shell's `times`) to `onOther`. A partial last line is not reported.
 *
 * @example
 * onJsonLines(child.stderr!, (ev) => events.push(ev));
 */
import type { Readable } from "node:stream";

export type JsonEvent = Record<string, unknown>;

export function onJsonLines(stream: Readable, onEvent: (ev: JsonEvent) => void, onOther?: (line: string) => void): void {
  let partial = "";
  stream.setEncoding("utf8").on("data", (chunk: string) => {
    const lines = (partial + chunk).split("\n");
    partial = lines.pop() ?? "";
    for (const line of lines) {
      const ev = line.startsWith("{") ? parseObject(line) : undefined;
      if (ev !== undefined) onEvent(ev);
      else onOther?.(line);
    }
  });
}

function parseObject(line: string): JsonEvent | undefined {
  try {
    const v: unknown = JSON.parse(line);
    return typeof v === "object" && v !== null && !Array.isArray(v) ? (v as JsonEvent) : undefined;
  } catch {
    return undefined; // a rank's own line that happens to start with "{"
  }
}
