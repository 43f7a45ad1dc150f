/**
 * CPU profiles of the measuring processes (`--cpu-prof <dir>`), taken with the V8 inspector
 * from inside the process (Node refuses `--cpu-prof` in NODE_OPTIONS, and the launcher
 * decides the ranks' command line). Summarize with `bench/tools/cpuprofile-top.ts`.
 *
 * @example
 * const stop = await startProfile();
 * ...
 * await stop("/tmp/prof/lifeline2-0.cpuprofile");
 */
import { mkdirSync, writeFileSync } from "node:fs";
import { Session } from "node:inspector";
import path from "node:path";

function post<T>(session: Session, method: string, params?: object): Promise<T> {
  return new Promise((resolve, reject) => {
    session.post(method, params ?? {}, (err, result) => (err ? reject(err) : resolve(result as T)));
  });
}

/** Starts sampling (every `intervalUs`); the returned function stops and writes the profile. */
export async function startProfile(intervalUs = 100): Promise<(file: string) => Promise<void>> {
  const session = new Session();
  session.connect();
  await post(session, "Profiler.enable");
  await post(session, "Profiler.setSamplingInterval", { interval: intervalUs });
  await post(session, "Profiler.start");
  return async (file: string) => {
    const { profile } = await post<{ profile: unknown }>(session, "Profiler.stop");
    session.disconnect();
    mkdirSync(path.dirname(file), { recursive: true });
    writeFileSync(file, JSON.stringify(profile));
  };
}
