#!/usr/bin/env node
// Completes package-lock.json with entries for optional platform packages that this machine's
// registry does not serve (e.g. msgpackr-extract's darwin/win32 builds). npm leaves them out of
// the lock when it cannot fetch their metadata, and `npm ci` then rejects the lock as out of
// sync. The entries only carry os/cpu, so npm skips them on every platform they do not match,
// exactly as it would with the full metadata. Run after `npm install` changes the lock.
import { readFileSync, writeFileSync } from "node:fs";

const PLATFORM = /-(darwin|linux|win32|freebsd|android)-(arm64|x64|arm|ia32|riscv64|ppc64|s390x)(-gnu|-musl|-msvc)?$/;
const lock = JSON.parse(readFileSync("package-lock.json", "utf8"));
const pkgs = lock.packages;
let added = 0;
for (const [path, meta] of Object.entries(pkgs)) {
  for (const [name, range] of Object.entries(meta.optionalDependencies ?? {})) {
    const key = `node_modules/${name}`;
    const m = PLATFORM.exec(name);
    if (pkgs[key] !== undefined || pkgs[`${path}/${key}`] !== undefined || m === null) continue;
    const os = m[1] === "win32" ? "win32" : m[1];
    pkgs[key] = { version: range.replace(/^[\^~=]/, ""), cpu: [m[2]], license: meta.license ?? "MIT", optional: true, os: [os] };
    added++;
  }
}
lock.packages = Object.fromEntries(Object.entries(pkgs).sort(([a], [b]) => (a === "" ? -1 : b === "" ? 1 : a < b ? -1 : a > b ? 1 : 0)));
writeFileSync("package-lock.json", JSON.stringify(lock, null, 2) + "\n");
console.log(`complete-lock: added ${added} optional platform entr${added === 1 ? "y" : "ies"}`);
