// Goal: every built-in op on every kind of data the API names, user functions, order of
// operands, and clear errors for ops that do not apply. Method: call the pure functions.
import { describe, expect, it } from "vitest";
import { checkOp, combine, combineInto } from "../../src/mpi/reduce-ops.ts";
import { isLifelineError } from "../../src/errors.ts";

const throwsCode = (f: () => unknown, code: string): void => {
  let caught: unknown;
  try {
    f();
  } catch (err) {
    caught = err;
  }
  expect(isLifelineError(caught, code as never), String(caught)).toBe(true);
};

describe("reduce ops", () => {
  it("applies each built-in op to numbers", () => {
    expect(combine(3, 4, "sum")).toBe(7);
    expect(combine(3, 4, "prod")).toBe(12);
    expect(combine(3, 4, "min")).toBe(3);
    expect(combine(3, 4, "max")).toBe(4);
    expect(combine(3, 0, "land")).toBe(0);
    expect(combine(0, 2, "lor")).toBe(1);
    expect(combine(6, 3, "band")).toBe(2);
    expect(combine(6, 3, "bor")).toBe(7);
    expect(combine(2 ** 40 + 1, 1, "band")).toBe(1);
  });

  it("applies each built-in op to bigints and booleans", () => {
    expect(combine(2n ** 64n, 1n, "sum")).toBe(2n ** 64n + 1n);
    expect(combine(5n, 7n, "min")).toBe(5n);
    expect(combine(5n, 7n, "max")).toBe(7n);
    expect(combine(6n, 3n, "band")).toBe(2n);
    expect(combine(true, false, "land")).toBe(false);
    expect(combine(true, false, "lor")).toBe(true);
  });

  it("works element-wise on typed arrays and plain arrays without touching inputs", () => {
    const a = new Float64Array([1, 5, -0]),
      b = new Float64Array([2, 3, 0]);
    expect(combine(a, b, "sum")).toEqual(new Float64Array([3, 8, 0]));
    expect(combine(a, b, "max")).toEqual(new Float64Array([2, 5, 0]));
    expect(Object.is((combine(a, b, "min") as Float64Array)[2], -0)).toBe(true);
    expect(a).toEqual(new Float64Array([1, 5, -0]));
    expect(combine(new Int32Array([6, 1]), new Int32Array([3, 0]), "bor")).toEqual(new Int32Array([7, 1]));
    expect(combine(new BigInt64Array([2n]), new BigInt64Array([5n]), "prod")).toEqual(new BigInt64Array([10n]));
    expect(combine(new Uint8Array([1, 0]), new Uint8Array([1, 1]), "land")).toEqual(new Uint8Array([1, 0]));
    expect(combine([1, [2, 3]], [10, [20, 30]], "sum")).toEqual([11, [22, 33]]);
  });

  it("propagates NaN in min/max like Math.min", () => {
    expect(combine(new Float64Array([NaN]), new Float64Array([1]), "min")).toEqual(new Float64Array([NaN]));
  });

  it("applies user functions with the lower rank's operand first", () => {
    const concat = (x: string, y: string): string => x + y;
    expect(combine("a", "b", concat)).toBe("ab");
    expect(combine(["a", "c"], ["b", "d"], concat)).toEqual(["ab", "cd"]);
    const acc = [1, 2];
    combineInto(acc, [10, 20], (x: number, y: number) => x * 100 + y, false);
    expect(acc).toEqual([1001, 2002]);
  });

  it("computes into the operand the caller names as writable, for built-in ops on typed arrays only", () => {
    const lower = new Float64Array([1, 2]),
      higher = new Float64Array([10, 20]);
    expect(combine(lower, higher, "sum", "higher")).toBe(higher);
    expect([...higher]).toEqual([11, 22]);
    expect([...lower]).toEqual([1, 2]);
    expect(combine(lower, higher, "max", "lower")).toBe(lower);
    expect([...lower]).toEqual([11, 22]);
    // A user function, or plain arrays: a new value, inputs untouched.
    const a = new Int32Array([1, 2]);
    const f = combine(a, new Int32Array([3, 4]), (x: number, y: number) => x * 10 + y, "lower");
    expect(f).not.toBe(a);
    expect([...(f as Int32Array)]).toEqual([13, 24]);
    expect([...a]).toEqual([1, 2]);
    const p = [1, 2];
    expect(combine(p, [3, 4], "sum", "lower")).not.toBe(p);
    throwsCode(() => combine(new Float64Array(1), new Float64Array(2), "sum", "lower"), "MPI_COLLECTIVE_MISMATCH");
  });

  it("rejects ops that do not apply and mismatched shapes", () => {
    throwsCode(() => combine("a", "b", "sum"), "MPI_OP");
    throwsCode(() => combine(1, 1n, "sum"), "MPI_OP");
    throwsCode(() => combine(1.5, 1, "band"), "MPI_OP");
    throwsCode(() => combine(new Float64Array(1), new Float64Array(1), "bor"), "MPI_OP");
    throwsCode(() => combine(new Float64Array(1), new Float64Array(2), "sum"), "MPI_COLLECTIVE_MISMATCH");
    throwsCode(() => combine(new Float64Array(1), new Float32Array(1), "sum"), "MPI_COLLECTIVE_MISMATCH");
    throwsCode(() => combine([1], [1, 2], "sum"), "MPI_COLLECTIVE_MISMATCH");
    expect(() => checkOp("avg")).toThrow(TypeError);
  });
});
