/**
 * A warm spare process: started by the launcher before any rank fails, it loads Node, the tsx
 * loader (for `.ts` apps the launcher could not compile) and lifeline's own modules — the
 * zeromq addon, level, msgpackr, both recovery modes — then waits. When a rank dies the launcher hands it that rank's place as one JSON
 * line on stdin, `{ env, app, appArgs }`; the spare then takes on the rank's environment and
 * command line and imports the program, which calls `init()` like any freshly started rank.
 * Start-up is most of a restart's time: this moves it off the recovery's path.
 *
 * Once warm it writes one byte on fd 3 (the watch pipe the ranks' heartbeats use), so the
 * launcher knows it is ready. End of stdin without an assignment (the job ended, or the
 * launcher died) ends the spare.
 * Run as `node [--import tsx] <dist>/launch/spare-entry.js` by src/launch/rank-process.ts.
 */
import { writeSync } from "node:fs";
import { pathToFileURL } from "node:url";

interface Assignment {
  env: Record<string, string>;
  app: string;
  appArgs: string[];
}

function readAssignment(): Promise<Assignment | undefined> {
  return new Promise((resolve) => {
    let text = "";
    process.stdin.setEncoding("utf8");
    process.stdin.on("data", (chunk: string) => {
      text += chunk;
      const nl = text.indexOf("\n");
      if (nl < 0) return;
      process.stdin.removeAllListeners("data");
      process.stdin.destroy(); // the program must not keep the launcher's pipe open
      try {
        resolve(JSON.parse(text.slice(0, nl)) as Assignment);
      } catch {
        resolve(undefined);
      }
    });
    process.stdin.once("end", () => resolve(undefined));
    process.stdin.once("error", () => resolve(undefined));
  });
}

// Warm up while nothing is asked of us. A failure here is not fatal: the program imports what
// it needs itself and reports errors as any rank would.
const fromSource = import.meta.url.endsWith(".ts");
const ext = fromSource ? ".ts" : ".js";
// The recovery modes load lazily in a rank (src/index.ts); a spare takes a rank of either.
for (const m of ["../index", "../cpr/coordinated/driver", "../cpr/coordinated/host-stores", "../cpr/retry-one/driver"]) {
  await import(new URL(`${m}${ext}`, import.meta.url).href).catch(() => undefined);
}
try {
  writeSync(3, "r");
} catch {
  // no watch pipe (not started by the launcher): nobody to tell
}

const job = await readAssignment();
if (job === undefined) process.exit(0);
for (const k of Object.keys(process.env)) if (!(k in job.env)) delete process.env[k];
Object.assign(process.env, job.env);
process.argv = [process.argv[0]!, job.app, ...job.appArgs];
await import(pathToFileURL(job.app).href);
