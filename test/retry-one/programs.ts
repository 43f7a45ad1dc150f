/**
 * Rabit's test programs in pure form (rabit/test: model_recover, local_recover,
 * lazy_recover): every iteration an allreduce max and an allreduce sum of known arrays and a
 * broadcast of a known array from a rotating root, each checked against its known value,
 * then a checkpoint of the global model (and, for local_recover, of per-rank local state;
 * for lazy_recover, through the lazy function form).
 */
import type { CollIdentity, Lazy } from "../../src/cpr/retry-one/types.ts";
import type { Op, Program, ProgramContext } from "./harness.ts";

export interface RabitProgramOptions {
  readonly kind: "model" | "local" | "lazy";
  readonly iterations: number;
  /** Array length of the collectives. */
  readonly n: number;
  /** Run two bootstrap collectives before restore() (the bootstrap-operation proposal). */
  readonly bootstrap: boolean;
  /** From this attempt on, the program calls allreduce max where it used sum (a replay mismatch). */
  readonly divergeFromAttempt?: number;
}

const ident = (op: string, length: number, root = -1): CollIdentity => ({ op, root, type: "Float64", length });

function expectEqual(what: string, got: unknown, want: unknown, ctx: ProgramContext): void {
  const g = JSON.stringify(got),
    w = JSON.stringify(want);
  if (g !== w) throw new Error(`rank ${ctx.rank} (attempt ${ctx.attempt}): ${what} = ${g}, expected ${w}`);
}

const maxInput = (rank: number, r: number, n: number, seed: number): number[] => Array.from({ length: n }, (_, i) => (i * (rank + 1) + r * 7 + seed) % 111);
const sumInput = (rank: number, r: number, n: number): number[] => Array.from({ length: n }, (_, i) => ((i + 1) * (rank + 1) + r) % 37);
const bcastInput = (root: number, r: number, n: number): number[] => Array.from({ length: n }, (_, i) => r * 1000 + root * 10 + i);

export function rabitProgram(opts: RabitProgramOptions): Program {
  return function* (ctx: ProgramContext): Generator<Op, void, unknown> {
    const { rank, size } = ctx;
    const n = opts.n;
    let seed = 0;
    if (opts.bootstrap) {
      // A seed broadcast from rank 0 and a column count agreed by max, as XGBoost does.
      const s = (yield { op: "boot", key: "seed", ident: ident("bcast", 1, 0), value: rank === 0 ? [4242] : null }) as number[];
      expectEqual("bootstrap seed", s, [4242], ctx);
      seed = s[0]!;
      const c = (yield { op: "boot", key: "ncol", ident: ident("allreduce:max", 1), value: [10 + rank] }) as number[];
      expectEqual("bootstrap ncol", c, [10 + size - 1], ctx);
    }
    const restored = (yield { op: "restore" }) as { state: number[]; global: number[]; version: number } | undefined;
    let model: number[] = restored?.global ?? new Array<number>(n).fill(0);
    let local: number[] = restored?.state ?? [rank];
    for (let r = restored?.version ?? 0; r < opts.iterations; r++) {
      const mx = (yield { op: "coll", ident: ident("allreduce:max", n), value: maxInput(rank, r, n, seed) }) as number[];
      const wantMax = Array.from({ length: n }, (_, i) => Math.max(...Array.from({ length: size }, (_, q) => maxInput(q, r, n, seed)[i]!)));
      expectEqual(`allreduce max at iteration ${r}`, mx, wantMax, ctx);

      const diverge = opts.divergeFromAttempt !== undefined && ctx.attempt >= opts.divergeFromAttempt;
      const sumOp = diverge ? "allreduce:max" : "allreduce:sum";
      const sm = (yield { op: "coll", ident: ident(sumOp, n), value: sumInput(rank, r, n) }) as number[];
      const wantSum = Array.from({ length: n }, (_, i) => Array.from({ length: size }, (_, q) => sumInput(q, r, n)[i]!).reduce((a, b) => a + b, 0));
      expectEqual(`allreduce sum at iteration ${r}`, sm, wantSum, ctx);

      const root = (r * 3 + 1) % size;
      const bc = (yield { op: "coll", ident: ident("bcast", n, root), value: rank === root ? bcastInput(root, r, n) : null }) as number[];
      expectEqual(`broadcast from ${root} at iteration ${r}`, bc, bcastInput(root, r, n), ctx);

      model = model.map((x, i) => (x * 3 + mx[i]! + sm[i]! + bc[i]!) % 1_000_003);
      if (opts.kind !== "model") local = [(local[0]! * 31 + sm[r % n]! + rank) % 1_000_003, r];
      const m = [...model],
        l = [...local];
      let state: Lazy, global: Lazy;
      if (opts.kind === "lazy") {
        state = { kind: "thunk", thunk: () => (ctx.stats.stateThunks++, l) };
        global = { kind: "thunk", thunk: () => (ctx.stats.globalThunks++, m) };
      } else {
        state = { kind: "value", value: l };
        global = { kind: "value", value: m };
      }
      yield { op: "ckpt", state, global, key: JSON.stringify(m) };
    }
    yield { op: "final", result: { model, local } };
  };
}
