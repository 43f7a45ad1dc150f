/**
 * Reduction operators on numbers, bigints, booleans, typed arrays and plain arrays.
 *
 * Every combination is `combine(lower, higher)`: the operand contributed by lower ranks comes
 * first. The collectives only ever combine in a fixed order, so results are bit-identical on
 * every rank and every re-run with the same job size (floating-point sums are not
 * associative, so the *order* is what makes them reproducible).
 *
 * @example
 * combine(new Float64Array([1, 2]), new Float64Array([3, 4]), "sum"); // Float64Array [4, 6]
 * combine(2n, 5n, "max");                                             // 5n
 */
import { LifelineError } from "../errors.ts";
import { copyTyped, isTypedArray, type TypedArray, typedArrayCode } from "./codec.ts";
import type { ReduceOp, ReduceOpName } from "./types.ts";

export const OP_NAMES: readonly ReduceOpName[] = ["sum", "prod", "min", "max", "land", "lor", "band", "bor"];

// eslint-disable-next-line @typescript-eslint/no-explicit-any -- elements are numbers or bigints, combined by source-text kernels
type Arr = { length: number; [i: number]: any };

/** Validates an op argument; throws TypeError for anything that is not a known name or a function. */
export function checkOp(op: unknown): ReduceOp {
  if (typeof op === "function") return op as ReduceOp;
  if (typeof op === "string" && (OP_NAMES as readonly string[]).includes(op)) return op as ReduceOpName;
  throw new TypeError(`reduction op ${JSON.stringify(op)} is not one of ${OP_NAMES.join(", ")} or a function`);
}

/** True for the built-in ops, which are commutative (bit for bit) as well as associative. */
export function isBuiltinOp(op: ReduceOp): op is ReduceOpName {
  return typeof op === "string";
}

function opError(op: ReduceOp, what: string): LifelineError {
  const name = typeof op === "string" ? op : "a user function";
  return new LifelineError("MPI_OP", `reduction ${name} does not apply to ${what}`);
}

function describe(v: unknown): string {
  if (v === null) return "null";
  if (isTypedArray(v)) return (v as object).constructor.name;
  if (Array.isArray(v)) return "an array";
  return typeof v === "object" ? "an object" : `a ${typeof v}`;
}

const isFloatArray = (a: unknown): boolean => a instanceof Float64Array || a instanceof Float32Array;

/**
 * The element-wise loop body of each built-in op, as source text. Kernels are compiled per
 * (op, element type) so that every loop stays monomorphic: a single shared loop that has seen
 * Float64Array, Int32Array and plain arrays goes megamorphic in V8 and runs many times slower.
 */
const OP_BODY: Record<ReduceOpName, string> = {
  sum: "acc[i] += other[i];",
  prod: "acc[i] *= other[i];",
  // Math.min/max semantics (NaN wins, -0 < +0) for numbers; plain compare for bigints.
  min: "const a = acc[i], b = other[i]; acc[i] = typeof a === 'number' ? Math.min(a, b) : (b < a ? b : a);",
  max: "const a = acc[i], b = other[i]; acc[i] = typeof a === 'number' ? Math.max(a, b) : (b > a ? b : a);",
  land: "acc[i] = acc[i] && other[i] ? one : zero;",
  lor: "acc[i] = acc[i] || other[i] ? one : zero;",
  band: "acc[i] &= other[i];",
  bor: "acc[i] |= other[i];",
};

type Kernel = (acc: Arr, other: Arr, from: number, to: number) => void;
/** Per op, per array constructor (looked up without building a key: this runs for every combine). */
const kernels = new Map<ReduceOpName, Map<unknown, Kernel>>();

function kernel(op: ReduceOpName, acc: Arr): Kernel {
  const ctor = Array.isArray(acc) ? Array : (acc as object).constructor;
  let byType = kernels.get(op);
  if (byType === undefined) kernels.set(op, (byType = new Map()));
  let k = byType.get(ctor);
  if (k === undefined) {
    const big = ctor === BigInt64Array || ctor === BigUint64Array;

    k = new Function(
      "acc",
      "other",
      "from",
      "to",
      `"use strict"; const one = ${big ? "1n" : "1"}, zero = ${big ? "0n" : "0"}; for (let i = from; i < to; i++) { ${OP_BODY[op]} }`,
    ) as Kernel;
    byType.set(ctor, k);
  }
  return k;
}

/**
 * acc[i] = acc[i] ⊕ other[i] when `accFirst`, else other[i] ⊕ acc[i], for i in [from, to).
 * Built-in ops are commutative, so `accFirst` matters only for user functions.
 */
export function combineInto(acc: Arr, other: Arr, op: ReduceOp, accFirst: boolean, from = 0, to = acc.length): void {
  if (typeof op === "function") {
    if (accFirst) for (let i = from; i < to; i++) acc[i] = op(acc[i], other[i]);
    else for (let i = from; i < to; i++) acc[i] = op(other[i], acc[i]);
    return;
  }
  if ((op === "band" || op === "bor") && isFloatArray(acc)) throw opError(op, describe(acc));
  kernel(op, acc)(acc, other, from, to);
}

function scalar(a: unknown, b: unknown, op: ReduceOpName): unknown {
  const ta = typeof a,
    tb = typeof b;
  if (ta === "boolean" && tb === "boolean") {
    if (op === "land") return (a as boolean) && b;
    if (op === "lor") return a || b;
    throw opError(op, "booleans");
  }
  if (ta !== tb || (ta !== "number" && ta !== "bigint")) {
    throw opError(op, ta === tb ? describe(a) : `${describe(a)} and ${describe(b)} together`);
  }
  // Both numbers or both bigints (checked above): the operators below apply to either.
  // eslint-disable-next-line @typescript-eslint/no-explicit-any
  const x = a as any;
  // eslint-disable-next-line @typescript-eslint/no-explicit-any
  const y = b as any;
  switch (op) {
    case "sum":
      return x + y;
    case "prod":
      return x * y;
    case "min":
      return ta === "number" ? Math.min(x, y) : y < x ? y : x;
    case "max":
      return ta === "number" ? Math.max(x, y) : y > x ? y : x;
    case "land":
      return ta === "bigint" ? (x && y ? 1n : 0n) : x && y ? 1 : 0;
    case "lor":
      return ta === "bigint" ? (x || y ? 1n : 0n) : x || y ? 1 : 0;
    case "band":
      if (ta === "number" && !(Number.isInteger(x) && Number.isInteger(y))) throw opError(op, "non-integer numbers");
      return ta === "bigint" ? x & y : Number(BigInt(x) & BigInt(y));
    case "bor":
      if (ta === "number" && !(Number.isInteger(x) && Number.isInteger(y))) throw opError(op, "non-integer numbers");
      return ta === "bigint" ? x | y : Number(BigInt(x) | BigInt(y));
  }
}

/**
 * lower ⊕ higher. Shapes must agree; a mismatch is `MPI_COLLECTIVE_MISMATCH` (ranks passed
 * different data), an op that does not apply is `MPI_OP`. The inputs are not modified, unless
 * `writable` names an operand the caller owns: with a built-in op on typed arrays the result is
 * then computed into it and it is returned (built-in ops are commutative bit for bit, so which
 * operand is written does not change the result); otherwise the result is a new value.
 */
export function combine(lower: unknown, higher: unknown, op: ReduceOp, writable?: "lower" | "higher"): unknown {
  if (isTypedArray(lower) || isTypedArray(higher)) {
    const a = lower as Arr & ArrayBufferView,
      b = higher as Arr & ArrayBufferView;
    if (typedArrayCode(a) !== typedArrayCode(b) || a.length !== b.length) {
      throw new LifelineError(
        "MPI_COLLECTIVE_MISMATCH",
        `reduction over ${describe(a)}(${a.length}) and ${describe(b)}(${b.length}): every rank must pass the same type and length`,
      );
    }
    if (writable !== undefined && typeof op === "string") {
      const into = writable === "lower" ? a : b;
      combineInto(into, writable === "lower" ? b : a, op, writable === "lower");
      return into;
    }
    const out = copyTyped(a as unknown as TypedArray) as unknown as Arr;
    combineInto(out, b, op, true);
    return out;
  }
  if (Array.isArray(lower) || Array.isArray(higher)) {
    if (!Array.isArray(lower) || !Array.isArray(higher) || lower.length !== higher.length) {
      throw new LifelineError(
        "MPI_COLLECTIVE_MISMATCH",
        `reduction over arrays of different shapes (${describe(lower)} vs ${describe(higher)}): every rank must pass the same shape`,
      );
    }
    return lower.map((x, i) => combine(x, higher[i], op));
  }
  if (typeof op === "function") return op(lower, higher);
  return scalar(lower, higher, op);
}
