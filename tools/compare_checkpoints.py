#!/usr/bin/python3
"""Compare two Tessera checkpoints tensor by tensor.

    tools/compare_checkpoints.py A.h5 B.h5 [--tolerance X]

For every dataset under /model and /optimizer in either file: its shape, the maximum absolute
difference max|a-b| and the maximum relative difference max(|a-b| / max(|a|,|b|)) elementwise,
with 0/0 counted as 0. Tensors present in only one file are listed.

Exit codes: 0 when compared (without --tolerance, whatever the differences); with
--tolerance X, 1 when any maximum relative difference exceeds X, a shape differs or a tensor
is in only one file; 2 bad input (one line on stderr).

Runs with Debian's Python (/usr/bin/python3: python3-h5py, python3-numpy).
"""

import argparse
import math
import sys

from require import require

PROG = "compare_checkpoints"
h5py, np = require(PROG, "h5py", "numpy")
GROUPS = ("model", "optimizer")
BLOCK_ELEMENTS = 1 << 22  # compare big tensors in slabs of about this many elements


class InputError(Exception):
    """Bad input: reported as one line, exit code 2."""


def open_checkpoint(path):
    try:
        return h5py.File(path, "r")
    except FileNotFoundError:
        raise InputError(f"no such checkpoint file: {path}") from None
    except OSError as e:
        raise InputError(f"{path}: not a readable HDF5 file ({e})") from None


def tensors(f):
    """Full dataset paths under /model and /optimizer."""
    names = []
    for group in GROUPS:
        if group in f:
            f[group].visititems(lambda n, o, g=group: names.append(f"{g}/{n}")
                                if isinstance(o, h5py.Dataset) else None)
    return set(names)


def slabs(shape):
    """Slices along the first axis covering the dataset in blocks of about BLOCK_ELEMENTS."""
    if len(shape) == 0:
        yield ()
        return
    row = max(1, math.prod(shape[1:]))
    step = max(1, BLOCK_ELEMENTS // row)
    for start in range(0, shape[0], step):
        yield slice(start, min(start + step, shape[0]))


def max_differences(da, db):
    """(max absolute, max relative) difference of two same-shaped datasets, in float64.

    NaN in both at the same place counts as equal; NaN on one side, or an infinity against a
    finite value, is an infinite difference.
    """
    max_abs = max_rel = 0.0
    for sl in slabs(da.shape):
        a = np.asarray(da[sl], dtype=np.float64)
        b = np.asarray(db[sl], dtype=np.float64)
        both_nan = np.isnan(a) & np.isnan(b)
        one_nan = np.isnan(a) ^ np.isnan(b)
        with np.errstate(invalid="ignore", divide="ignore"):
            diff = np.where(both_nan | (a == b), 0.0, np.abs(a - b))
            denom = np.maximum(np.abs(a), np.abs(b))
            rel = np.where(diff == 0, 0.0, diff / denom)
        # One-sided NaN, or an infinity against a finite value: infinitely different.
        diff = np.where(one_nan | np.isnan(diff), np.inf, diff)
        rel = np.where(one_nan | np.isnan(rel), np.inf, rel)
        if diff.size:
            max_abs = max(max_abs, float(np.max(diff)))
            max_rel = max(max_rel, float(np.max(rel)))
    return max_abs, max_rel


def describe(f):
    attrs = f.attrs
    parts = [f"{k}={attrs[k]}" for k in ("step", "epoch", "layout") if k in attrs]
    return " ".join(str(p) for p in parts) or "(no Tessera attributes)"


def compare(path_a, path_b, tolerance):
    """Print the table; return the exit code."""
    with open_checkpoint(path_a) as fa, open_checkpoint(path_b) as fb:
        print(f"A: {path_a}  {describe(fa)}")
        print(f"B: {path_b}  {describe(fb)}")
        names_a, names_b = tensors(fa), tensors(fb)
        common = sorted(names_a & names_b)
        if not names_a and not names_b:
            raise InputError("neither file has datasets under /model or /optimizer")
        width = max([len(n) for n in common] + [6])
        print(f"{'tensor':<{width}}  {'shape':<14}  {'max_abs_diff':>12}  {'max_rel_diff':>12}")
        failed = False
        worst = 0.0
        for name in common:
            da, db = fa[name], fb[name]
            if da.shape != db.shape:
                print(f"{name:<{width}}  shape differs: A {da.shape}, B {db.shape}")
                failed = True
                continue
            max_abs, max_rel = max_differences(da, db)
            worst = max(worst, max_rel)
            flag = ""
            if tolerance is not None and not max_rel <= tolerance:
                flag = "  > tolerance"
                failed = True
            shape = "x".join(str(d) for d in da.shape) or "scalar"
            print(f"{name:<{width}}  {shape:<14}  {max_abs:>12.6g}  {max_rel:>12.6g}{flag}")
        for label, only in (("A", names_a - names_b), ("B", names_b - names_a)):
            for name in sorted(only):
                print(f"only in {label}: {name}")
                failed = True
        summary = f"{len(common)} tensors compared, largest relative difference {worst:.6g}"
        if tolerance is None:
            print(summary)
            return 0
        verdict = "FAIL" if failed else "OK"
        print(f"{summary}; tolerance {tolerance:g}: {verdict}")
        return 1 if failed else 0


def main(argv):
    parser = argparse.ArgumentParser(prog=PROG, description=__doc__.split("\n\n")[0])
    parser.add_argument("a", metavar="A", help="first checkpoint (.h5)")
    parser.add_argument("b", metavar="B", help="second checkpoint (.h5)")
    parser.add_argument("--tolerance", type=float, metavar="X",
                        help="exit 1 if any maximum relative difference exceeds X")
    args = parser.parse_args(argv)
    try:
        return compare(args.a, args.b, args.tolerance)
    except InputError as e:
        print(f"{PROG}: error: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
