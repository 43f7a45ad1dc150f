import { defineConfig } from "vitest/config";

export default defineConfig({
  test: {
    include: ["test/**/*.test.ts"],
    testTimeout: 60_000,
    hookTimeout: 60_000,
    // Multi-process tests spawn up to 4 ranks each on a 2-core machine: run test files
    // two at a time so that timing bounds (fail-fast within 1 s) stay meaningful.
    maxWorkers: 2,
    reporters: process.env.CI ? ["default"] : ["default"],
  },
});
